//! Shared helpers for phaseprof's end-to-end tests and benchmarks: locating the built binary,
//! building the workloads with their own flags, and running phaseprof against them.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// The `phaseprof` binary under test: `$PHASEPROF_BIN`, else the workspace's release build.
pub fn phaseprof_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PHASEPROF_BIN") {
        return PathBuf::from(p);
    }
    let p = root().join("target/release/phaseprof");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --release --workspace` first (the README's test command does)",
        p.display()
    );
    p
}

/// The `phaseprof-collector` binary of the workspace's release build.
pub fn collector_bin() -> PathBuf {
    let p = root().join("target/release/phaseprof-collector");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --release --workspace` first",
        p.display()
    );
    p
}

/// Runs `build` the first time `key` is asked for in this process (workloads are built once).
fn build_once(key: &str, build: impl FnOnce()) {
    static BUILT: OnceLock<Mutex<Vec<String>>> = OnceLock::new();
    let mut built = BUILT
        .get_or_init(|| Mutex::new(Vec::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if !built.iter().any(|b| b == key) {
        build();
        built.push(key.to_string());
    }
}

/// Builds a Rust workload under `tests/workloads/<name>` once per process (each workload is its
/// own workspace with its own `.cargo/config.toml` flags) and returns its binary.
pub fn rust_workload(name: &str) -> PathBuf {
    rust_workload_built(name, None)
}

/// The same workload built a second time without frame pointers, as release builds ship
/// (`-C force-frame-pointers=no` overrides its config), into `target/nofp`.
pub fn rust_workload_without_frame_pointers(name: &str) -> PathBuf {
    rust_workload_built(name, Some("nofp"))
}

fn rust_workload_built(name: &str, no_frame_pointers: Option<&str>) -> PathBuf {
    let dir = root().join("tests/workloads").join(name);
    let target = match no_frame_pointers {
        Some(sub) => dir.join("target").join(sub),
        None => dir.join("target"),
    };
    let bin = target.join("release").join(name);
    build_once(&bin.to_string_lossy(), || {
        let mut cargo = Command::new(env!("CARGO"));
        cargo
            .args(["build", "--release", "--quiet", "--target-dir"])
            .arg(&target)
            .current_dir(&dir)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_TARGET_DIR");
        if no_frame_pointers.is_some() {
            // RUSTFLAGS replaces the workload's config flags (which force frame pointers).
            cargo.env("RUSTFLAGS", "-C force-frame-pointers=no");
        }
        let status = cargo.status().expect("running cargo for the workload");
        assert!(status.success(), "building workload {name} failed");
    });
    bin
}

/// Builds the C workload `tests/workloads/<name>/<name>.c` with clang -O2 (which omits frame
/// pointers) and `flags` (libraries, defines) into `target/<name><variant>`, once per process.
pub fn c_workload(name: &str, variant: &str, flags: &[&str]) -> PathBuf {
    let dir = root().join("tests/workloads").join(name);
    let bin = dir.join("target").join(format!("{name}{variant}"));
    build_once(&bin.to_string_lossy(), || {
        std::fs::create_dir_all(dir.join("target")).expect("creating the workload's target dir");
        let status = Command::new("clang")
            .args(["-O2", "-g", "-o"])
            .arg(&bin)
            .arg(dir.join(format!("{name}.c")))
            .args(flags)
            .status()
            .expect("running clang (scripts/setup.sh installs it)");
        assert!(status.success(), "building workload {name}{variant} failed");
    });
    bin
}

/// True when running as root; BPF tests need it. (On our machines they always run as root.)
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Serializes tests that load BPF or measure time, so they do not disturb each other.
pub fn bpf_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs phaseprof with `args`, returning its output (stdout holds the workload's output).
pub fn phaseprof(args: &[&str]) -> Output {
    Command::new(phaseprof_bin())
        .args(args)
        .output()
        .expect("running phaseprof")
}

/// Runs phaseprof and panics with its stderr unless it succeeded.
pub fn phaseprof_ok(args: &[&str]) -> Output {
    let out = phaseprof(args);
    assert!(
        out.status.success(),
        "phaseprof {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `phaseprof report FILE --json`, parsed.
pub fn report_json(file: &Path) -> serde_json::Value {
    let out = phaseprof_ok(&["report", file.to_str().unwrap(), "--json"]);
    serde_json::from_slice(&out.stdout).expect("report --json is JSON")
}

/// The last JSON line a workload printed (its ground truth).
pub fn truth_from(stdout: &[u8]) -> serde_json::Value {
    let text = String::from_utf8_lossy(stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .expect("workload printed its truth");
    serde_json::from_str(line).expect("truth is JSON")
}

/// A fresh scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("phaseprof-e2e-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Syscall counts by name from a `strace -c` summary table.
pub fn strace_counts(summary: &str) -> std::collections::BTreeMap<String, u64> {
    // Rows: "% time seconds usecs/call calls [errors] syscall"; the name is last, calls is 4th.
    summary
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 5
                || f[0].starts_with('%')
                || f[0].starts_with('-')
                || *f.last()? == "total"
            {
                return None;
            }
            Some((f.last()?.to_string(), f[3].parse().ok()?))
        })
        .collect()
}

/// Relative difference |a-b|/b.
pub fn rel_diff(a: f64, b: f64) -> f64 {
    (a - b).abs() / b
}

/// The Go toolchain, if installed (`/usr/local/go/bin/go`, Debian's, or on PATH).
pub fn go_binary() -> Option<PathBuf> {
    let known = ["/usr/local/go/bin/go", "/usr/lib/go/bin/go", "/usr/bin/go"];
    known
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .or_else(|| {
            let o = Command::new("sh")
                .args(["-c", "command -v go"])
                .output()
                .ok()?;
            o.status
                .success()
                .then(|| String::from_utf8_lossy(&o.stdout).trim().into())
        })
}

/// Reads lines until one contains `needle`; returns that line (empty at end of input).
pub fn read_until(reader: &mut impl std::io::BufRead, needle: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        if reader
            .read_line(&mut line)
            .expect("reading phaseprof's stderr")
            == 0
            || line.contains(needle)
        {
            return line;
        }
    }
}

/// Sums the folded cpu stacks of a profile: (all samples, samples whose stack `pick` selects).
pub fn folded_cpu_share(file: &Path, pick: impl Fn(&str) -> bool) -> (u64, u64) {
    folded_event_share(file, "cpu", pick)
}

/// The same for the stacks of event kind `event` (`pagefault`, `offcpu` …).
pub fn folded_event_share(file: &Path, event: &str, pick: impl Fn(&str) -> bool) -> (u64, u64) {
    let path = file.to_str().expect("UTF-8 path");
    folded_share(
        &[
            "export", path, "--format", "folded", "--event", event, "-o", "-",
        ],
        pick,
    )
}

/// The same for the cpu stacks recorded inside `phase` (`export --phase`, inclusive).
pub fn folded_cpu_share_in_phase(
    file: &Path,
    phase: &str,
    pick: impl Fn(&str) -> bool,
) -> (u64, u64) {
    let path = file.to_str().expect("UTF-8 path");
    folded_share(
        &[
            "export", path, "--format", "folded", "--event", "cpu", "--phase", phase, "-o", "-",
        ],
        pick,
    )
}

fn folded_share(args: &[&str], pick: impl Fn(&str) -> bool) -> (u64, u64) {
    let folded = phaseprof_ok(args);
    let (mut total, mut picked) = (0, 0);
    for line in String::from_utf8(folded.stdout)
        .expect("folded is UTF-8")
        .lines()
    {
        let (stack, n) = line.rsplit_once(' ').expect("folded line ends in a count");
        let n: u64 = n.parse().expect("folded count");
        total += n;
        if pick(stack) {
            picked += n;
        }
    }
    (total, picked)
}

/// Builds the Go workload `tests/workloads/<name>` once per process; None when Go is absent.
pub fn go_workload(name: &str) -> Option<PathBuf> {
    let go = go_binary()?;
    let bin = std::env::temp_dir().join(format!("phaseprof-{}-{name}", std::process::id()));
    build_once(&bin.to_string_lossy(), || {
        let status = Command::new(go)
            .args(["build", "-o", bin.to_str().expect("UTF-8 temp dir"), "."])
            .current_dir(root().join("tests/workloads").join(name))
            .env("GOFLAGS", "-mod=mod")
            .status()
            .expect("running go build");
        assert!(status.success(), "building Go workload {name} failed");
    });
    Some(bin)
}

/// Builds a program written by others from the Go module proxy (`go install module@version`)
/// into `target/third-party/`, once (kept across runs: the module is pinned); None when Go is
/// absent.
pub fn go_third_party(module: &str, version: &str, binary: &str) -> Option<PathBuf> {
    let go = go_binary()?;
    let dir = root().join("target/third-party").join(version);
    let bin = dir.join(binary);
    build_once(&bin.to_string_lossy(), || {
        if bin.exists() {
            return;
        }
        let status = Command::new(go)
            .args(["install", &format!("{module}@{version}")])
            .env("GOBIN", &dir)
            .status()
            .expect("running go install");
        assert!(
            status.success(),
            "go install {module}@{version} failed (the Go module proxy must be reachable)"
        );
    });
    Some(bin)
}

/// File offset of the first instruction of Go function `name` in `bin` after its stack-check
/// prologue (`cmp rsp, [r14+16]; jbe morestack`), from `go tool objdump`: a probe there counts
/// calls once, where one on the first instruction fires again when the stack grows.
pub fn go_body_offset(bin: &Path, name: &str) -> u64 {
    let go = go_binary().expect("Go is installed");
    let pattern = format!("^{}$", regex_escape(name));
    let o = Command::new(go)
        .args(["tool", "objdump", "-s", &pattern])
        .arg(bin)
        .output()
        .expect("running go tool objdump");
    let text = String::from_utf8_lossy(&o.stdout);
    // Lines: "  file.go:123<TAB>0x81a0e0<TAB><TAB>493b6610<TAB><TAB>CMPQ SP, 0x10(R14)..." (empty fields).
    let insns: Vec<(u64, &str)> = text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l
                .split('\t')
                .map(str::trim)
                .filter(|f| !f.is_empty())
                .collect();
            let addr = u64::from_str_radix(f.get(1)?.trim_start_matches("0x"), 16).ok()?;
            Some((addr, *f.get(3)?))
        })
        .collect();
    let jbe = insns
        .iter()
        .take(4)
        .position(|(_, i)| i.starts_with("JBE"))
        .unwrap_or_else(|| panic!("no stack check at the start of {name}: {text}"));
    let vaddr = insns[jbe + 1].0;
    elf_file_offset(bin, vaddr)
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = "()*.+?[]{}|^$\\".contains(c);
            special
                .then_some('\\')
                .into_iter()
                .chain(std::iter::once(c))
        })
        .collect()
}

/// The file offset of virtual address `vaddr` in ELF executable `bin` (from its program headers).
fn elf_file_offset(bin: &Path, vaddr: u64) -> u64 {
    let o = Command::new("readelf")
        .args(["-lW"])
        .arg(bin)
        .output()
        .expect("running readelf");
    let text = String::from_utf8_lossy(&o.stdout);
    for l in text.lines().filter(|l| l.trim_start().starts_with("LOAD")) {
        // LOAD Offset VirtAddr PhysAddr FileSiz MemSiz Flg Align
        let f: Vec<&str> = l.split_whitespace().collect();
        let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap();
        let (off, va, size) = (hex(f[1]), hex(f[2]), hex(f[4]));
        if (va..va + size).contains(&vaddr) {
            return vaddr - va + off;
        }
    }
    panic!("{vaddr:#x} is in no LOAD segment of {}", bin.display());
}

/// `phaseprof record [opts] -o <scratch>/<name>.phaseprof -- <program> <args>`: returns the
/// profile's path and the workload's truth line.
pub fn record_workload(
    name: &str,
    opts: &[&str],
    program: &Path,
    args: &[&str],
) -> (PathBuf, serde_json::Value) {
    let out = scratch(name).join(format!("{name}.phaseprof"));
    let mut all: Vec<&str> = vec!["record"];
    all.extend_from_slice(opts);
    all.extend_from_slice(&[
        "-o",
        out.to_str().expect("UTF-8 path"),
        "--",
        program.to_str().expect("UTF-8 path"),
    ]);
    all.extend_from_slice(args);
    let o = phaseprof_ok(&all);
    (out, truth_from(&o.stdout))
}

/// The member of a `report --json` object's `phases` named `name`.
pub fn phase_json<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["phases"]
        .as_array()
        .expect("phases array")
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no phase `{name}` in {}", report["phases"]))
}

/// A JSON number as u64, panicking with the value otherwise.
pub fn num(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

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
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").expect("an http:// URL");
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let path = if path.is_empty() { "/" } else { path };
    let mut s = std::net::TcpStream::connect(host)?;
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

/// Records validator-sim (`sim_args`) under its phases file, as `name`: the .phaseprof path.
pub fn record_sim_with_phases(name: &str, sim_args: &[&str]) -> PathBuf {
    let sim = rust_workload("validator-sim");
    record_with_phases(name, "validator-sim", &[], &sim, sim_args).0
}

/// `record --phases tests/workloads/<workload>/phases.toml [opts] -- program args` as `name`:
/// the profile's path and the workload's truth line.
pub fn record_with_phases(
    name: &str,
    workload: &str,
    opts: &[&str],
    program: &Path,
    args: &[&str],
) -> (PathBuf, serde_json::Value) {
    let cfg = root()
        .join("tests/workloads")
        .join(workload)
        .join("phases.toml");
    let mut all = vec!["--phases", cfg.to_str().expect("UTF-8 path")];
    all.extend_from_slice(opts);
    record_workload(name, &all, program, args)
}

/// Starts `phaseprof record -v ARGS` and waits until its probes are attached: the child and
/// its stderr, positioned after that line.
pub fn record_until_attached(
    args: &[&std::ffi::OsStr],
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStderr>,
) {
    let mut rec = Command::new(phaseprof_bin())
        .args(["record", "-v"])
        .args(args)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting phaseprof record");
    let mut stderr = std::io::BufReader::new(rec.stderr.take().expect("piped stderr"));
    let line = read_until(&mut stderr, "probes attached");
    assert!(line.contains("probes attached"), "phaseprof did not attach");
    eprint!("{line}");
    (rec, stderr)
}

/// A free TCP port on 127.0.0.1 (bound and released: good enough for a test's own servers).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `clickhouse-server` of the machine's (Debian's) package run for one test on 127.0.0.1,
/// with its own ports, data directory and a password-less `default` user; killed on drop.
pub struct ClickHouse {
    child: std::process::Child,
    /// The HTTP interface, for `phaseprof-collector --clickhouse`.
    pub url: String,
}

impl ClickHouse {
    /// None when clickhouse-server is not installed (`scripts/setup.sh` installs it).
    pub fn start(name: &str) -> Option<ClickHouse> {
        let bin = ["/usr/bin/clickhouse-server", "/usr/sbin/clickhouse-server"]
            .into_iter()
            .find(|p| Path::new(p).exists())?;
        let dir = scratch(name);
        let (http, tcp) = (free_port(), free_port());
        std::fs::write(
            dir.join("users.xml"),
            "<yandex><profiles><default/></profiles><quotas><default/></quotas><users><default>\
             <password></password><networks><ip>127.0.0.1</ip></networks><profile>default</profile>\
             <quota>default</quota></default></users></yandex>\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("config.xml"),
            format!(
                "<yandex><logger><level>warning</level><console>1</console></logger>\
                 <http_port>{http}</http_port><tcp_port>{tcp}</tcp_port>\
                 <listen_host>127.0.0.1</listen_host><path>{d}/data/</path>\
                 <tmp_path>{d}/data/tmp/</tmp_path><users_config>{d}/users.xml</users_config>\
                 <default_profile>default</default_profile><default_database>default</default_database>\
                 <mark_cache_size>268435456</mark_cache_size></yandex>\n",
                d = dir.display()
            ),
        )
        .unwrap();
        let child = Command::new(bin)
            .arg(format!(
                "--config-file={}",
                dir.join("config.xml").display()
            ))
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(dir.join("server.log")).unwrap())
            .spawn()
            .expect("starting clickhouse-server");
        // The guard first: a server that never answers is still killed.
        let server = ClickHouse {
            child,
            url: format!("http://127.0.0.1:{http}/"),
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let ping = format!("{}ping", server.url);
        while !matches!(try_http_request("GET", &ping, "", &[]), Ok((200, _))) {
            assert!(
                std::time::Instant::now() < deadline,
                "clickhouse-server did not start: {}",
                std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        Some(server)
    }
}

impl Drop for ClickHouse {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
