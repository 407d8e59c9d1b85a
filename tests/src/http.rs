//! HTTP for tests: base URLs printed by servers, plain requests, free ports, a private CA.
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::*;

/// Reads a `serve`/`attach` process's stderr up to its "serving on http://…/" line and returns
/// that base URL without the trailing slash.
pub fn served_url(stderr: &mut impl std::io::BufRead) -> String {
    let line = read_until(stderr, "serving on");
    line.split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no URL in `{line}`"))
        .trim_end_matches('/')
        .to_string()
}

/// One HTTP/1.0 request to `http://host:port/path`, with extra header lines and a body:
/// (status, body), or the I/O error (a server still starting).
pub fn try_http_request(
    method: &str,
    url: &str,
    headers: &str,
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    try_http_request_from(None, method, url, headers, body)
}

/// A TCP connection to `to` from the loopback address `from` (127.0.0.0/8 is all local, so
/// tests play clients at different addresses).
pub fn connect_from(
    from: std::net::Ipv4Addr,
    to: std::net::SocketAddr,
) -> std::io::Result<std::net::TcpStream> {
    use std::os::fd::FromRawFd;
    let sockaddr = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as u16,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    let std::net::SocketAddr::V4(to) = to else {
        return Err(std::io::Error::other("IPv4 only"));
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as u32;
    // SAFETY: a new socket we own; bind and connect read the sockaddr structs we pass.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let stream = std::net::TcpStream::from_raw_fd(fd);
        let local = sockaddr(from, 0);
        if libc::bind(fd, (&local as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let remote = sockaddr(*to.ip(), to.port());
        if libc::connect(fd, (&remote as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stream)
    }
}

/// `try_http_request` from the loopback address `from` (None: the system's choice).
pub fn try_http_request_from(
    from: Option<std::net::Ipv4Addr>,
    method: &str,
    url: &str,
    headers: &str,
    body: &[u8],
) -> std::io::Result<(u16, String)> {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let mut s = match from {
        Some(ip) => {
            let to = host
                .to_socket_addrs()?
                .next()
                .ok_or_else(|| std::io::Error::other(host.to_string()))?;
            connect_from(ip, to)?
        }
        None => std::net::TcpStream::connect(host)?,
    };
    // One write, no Nagle: a request sent in pieces waits out the peer's delayed ACK (40 ms).
    s.set_nodelay(true)?;
    let mut req = format!(
        "{method} {path} HTTP/1.0\r\nHost: {host}\r\n{headers}Content-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    s.write_all(&req)?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

fn http_request(method: &str, url: &str, headers: &str, body: &[u8]) -> (u16, String) {
    try_http_request(method, url, headers, body).unwrap_or_else(|e| panic!("{method} {url}: {e}"))
}

/// A plain HTTP/1.0 GET of `http://host:port/path`: (status, body).
pub fn http_get(url: &str) -> (u16, String) {
    http_request("GET", url, "", &[])
}

/// A plain HTTP/1.0 POST of `body` with a bearer token: (status, body).
pub fn http_post(url: &str, token: &str, body: &[u8]) -> (u16, String) {
    let headers =
        format!("Authorization: Bearer {token}\r\nContent-Type: application/octet-stream\r\n");
    http_request("POST", url, &headers, body)
}

/// A free TCP port on 127.0.0.1 (bound and released: good enough for a test's own servers).
/// Waits until something accepts connections on 127.0.0.1:`port` (10 s at most).
pub fn wait_listening(port: u16) {
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("nothing listens on port {port}");
}

/// A TCP port on 127.0.0.1 that nothing listens on, for a server a test starts. Below the
/// kernel's ephemeral range (32768 and up): a port `bind(0)` gives is in that range, and under a
/// busy suite an outgoing connection was given it as its source port before the server bound
/// it (the agent's /metrics then failed to start). Ports are handed out in turn from a point
/// that depends on the pid, each checked bindable.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const LOW: u32 = 10_000;
    const SPAN: u32 = 22_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id() % 1_000 * 20;
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (LOW + (start + n) % SPAN) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port below the ephemeral range");
}

/// A private CA and a certificate it signed for 127.0.0.1, made with openssl in `dir`:
/// (CA certificate, server certificate, server key), PEM files.
pub fn tls_files(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (ca_key, ca, key, csr, cert) = (
        dir.join("ca.key"),
        dir.join("ca.pem"),
        dir.join("server.key"),
        dir.join("server.csr"),
        dir.join("server.pem"),
    );
    let ext = dir.join("san.ext");
    std::fs::write(
        &ext,
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
    )
    .unwrap();
    let s = |p: &PathBuf| p.to_str().unwrap().to_string();
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .output()
            .expect("running openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    // A P-256 key made with the request, unencrypted.
    let new_key = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let (ca_key, ca_pem, key_pem, csr_pem) = (s(&ca_key), s(&ca), s(&key), s(&csr));
    openssl(
        &[
            &[
                "req",
                "-x509",
                "-days",
                "2",
                "-subj",
                "/CN=phaseprof test CA",
            ][..],
            &["-keyout", &ca_key, "-out", &ca_pem],
            &new_key,
        ]
        .concat(),
    );
    openssl(
        &[
            &[
                "req",
                "-subj",
                "/CN=127.0.0.1",
                "-keyout",
                &key_pem,
                "-out",
                &csr_pem,
            ][..],
            &new_key,
        ]
        .concat(),
    );
    openssl(&[
        "x509",
        "-req",
        "-days",
        "2",
        "-in",
        &csr_pem,
        "-CA",
        &ca_pem,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-out",
        &s(&cert),
        "-extfile",
        &s(&ext),
    ]);
    (ca, cert, key)
}

/// GET over HTTPS trusting only the CA certificate `ca`: (status, body).
pub fn https_get(url: &str, ca: &Path) -> (u16, String) {
    let pem = std::fs::read(ca).unwrap();
    let certs: Vec<_> = ureq::tls::parse_pem(&pem)
        .filter_map(|i| match i.unwrap() {
            ureq::tls::PemItem::Certificate(c) => Some(c),
            _ => None,
        })
        .collect();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::Specific(std::sync::Arc::new(certs)))
                .build(),
        )
        .build()
        .into();
    let mut resp = agent.get(url).call().expect("HTTPS request");
    let status = resp.status().as_u16();
    (status, resp.body_mut().read_to_string().unwrap_or_default())
}
