//! The collector against a hostile network: gzip bombs (up to 4 GiB inflated), slow headers and slow bodies without a
//! token, 64 slow bodies from one agent's token, 5,000 idle connections from one address, a
//! 69 KB window whose one stack holds 33 million frames, 200 concurrent valid uploads, a
//! 100k-phase window, empty tokens and foreign Host headers, all at once against one collector,
//! each kind of attacker at its own loopback address. Throughout, `/metrics` must answer within
//! a second; at the end every valid window is stored exactly once, nothing else is, and the
//! collector's peak memory stayed under its documented bound. Then `kill -9` in the middle of a
//! 200-way ingest: after a restart, every acknowledged window is there once and the agents'
//! retries added no duplicates.
use std::io::{BufRead, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use phaseprof_e2e::*;
use phaseprof_model::*;

use crate::hostile_bodies::{bomb, deep_stack, many_phases, now_ns};

const AGENTS: usize = 4;
const WINDOWS: usize = 200;
const MIB: u64 = 1 << 20;
/// The limits the collector runs with here (its defaults): the memory bound is computed from
/// them as the README states it.
const MAX_BODY: u64 = 4 * MIB;
const MAX_INFLATED: u64 = 64 * MIB;
const MAX_UPLOADS: u64 = 64;

/// Agent `i` uploads from 127.0.1.(i+1); each kind of attacker has its own 127.0.2.x.
fn agent_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 1, i as u8 + 1)
}
const SLOW_HEADS: Ipv4Addr = Ipv4Addr::new(127, 0, 2, 2);
const SLOW_BODIES: Ipv4Addr = Ipv4Addr::new(127, 0, 2, 3);
const ONE_TOKEN: Ipv4Addr = Ipv4Addr::new(127, 0, 2, 4);
const IDLE: Ipv4Addr = Ipv4Addr::new(127, 0, 2, 5);

fn to(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn token(i: usize) -> String {
    format!("hostile-agent-token-{i:04}")
}

/// A collector on a free port over `dir`'s store; each agent's token pins its `host` label.
/// Its stderr is drained by a thread.
fn start(dir: &Path, port: u16, extra: &[&str]) -> Killed {
    let tokens = dir.join("tokens");
    let lines: String = (0..AGENTS)
        .map(|i| format!("agent-{i} {} host=h{i}\n", token(i)))
        .collect();
    std::fs::write(&tokens, lines).unwrap();
    let mut c = Command::new(collector_bin())
        .args(["--listen", &format!("127.0.0.1:{port}"), "--tokens"])
        .arg(&tokens)
        .arg("--data")
        .arg(dir.join("data"))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(c.stderr.take().unwrap());
    read_until(&mut err, "listening on");
    std::thread::spawn(move || {
        let mut line = String::new();
        while err.read_line(&mut line).is_ok_and(|n| n > 0) {
            line.clear();
        }
    });
    Killed(c)
}

/// Window `seq` of agent `seq % AGENTS`: `seq + 1` cpu samples, its own start time.
fn window(seq: usize, base_ns: u64) -> Vec<u8> {
    let start = base_ns + seq as u64 * 1_000;
    let host = format!("h{}", seq % AGENTS);
    let mut b = ProfileBuilder::new(
        Meta {
            pids: vec![7],
            comm: "relay".into(),
            events: vec![EventKind::Cpu],
            start_unix_ns: start,
            end_unix_ns: start + 500,
            labels: [("host".to_string(), host)].into_iter().collect(),
            ..Meta::default()
        },
        vec![],
    );
    let f = b.intern_frame(Frame {
        function: format!("burn_{}", seq % 10),
        module: "relay".into(),
        kind: FrameKind::User,
        inlined: false,
    });
    let s = b.intern_stack(vec![f]);
    b.add(Sample::new(SampleKind::Cpu, (7, 7), PhaseAt::NONE, vec![seq as u64 + 1]).on(s));
    let mut out = Vec::new();
    write_profile(&b.finish(), &mut out).unwrap();
    out
}

/// POSTs a window as agent `agent` would: (status, reply); status 0 when the connection failed.
fn post(port: u16, agent: usize, key: Option<&str>, body: &[u8]) -> (u16, String) {
    let mut headers = format!(
        "Authorization: Bearer {}\r\nContent-Type: application/octet-stream\r\n",
        token(agent)
    );
    if let Some(k) = key {
        headers.push_str(&format!("Idempotency-Key: {k}\r\n"));
    }
    try_http_request_from(
        Some(agent_addr(agent)),
        "POST",
        &format!("http://127.0.0.1:{port}/api/v1/windows"),
        &headers,
        body,
    )
    .unwrap_or((0, String::new()))
}

/// Uploads window `seq` until the collector acknowledges it (201, or 200 for a retry it had
/// stored), retrying with the same key on 429/503/connection errors as the agent does.
fn deliver(port: u16, seq: usize, base_ns: u64, give_up: Instant) -> u16 {
    let body = window(seq, base_ns);
    let key = format!("w-{seq}");
    loop {
        let (status, reply) = post(port, seq % AGENTS, Some(&key), &body);
        match status {
            200 | 201 => return status,
            0 | 429 | 503 if Instant::now() < give_up => {
                std::thread::sleep(Duration::from_millis(100))
            }
            _ => panic!("window {seq}: {status} {reply}"),
        }
    }
}

fn vm_hwm_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib / 1024
}

/// Scrapes `/metrics` every 100 ms on a fresh connection, noting the slowest answer and the
/// scrapes that failed or took over a second.
struct MetricsWatch {
    stop: Arc<AtomicBool>,
    slowest_ms: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    scrapes: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<()>,
}

impl MetricsWatch {
    fn start(port: u16) -> Self {
        let (stop, slowest_ms, failed, scrapes) = Default::default();
        let (s, w, f, n): (
            Arc<AtomicBool>,
            Arc<AtomicU64>,
            Arc<AtomicU64>,
            Arc<AtomicU64>,
        ) = (
            Arc::clone(&stop),
            Arc::clone(&slowest_ms),
            Arc::clone(&failed),
            Arc::clone(&scrapes),
        );
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let t = Instant::now();
                let ok = scrape(port).is_some();
                let ms = t.elapsed().as_millis() as u64;
                w.fetch_max(ms, Ordering::Relaxed);
                n.fetch_add(1, Ordering::Relaxed);
                if !ok || ms > 1000 {
                    f.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        MetricsWatch {
            stop,
            slowest_ms,
            failed,
            scrapes,
            thread,
        }
    }

    /// (scrapes, failed or over 1 s, slowest in ms).
    fn finish(self) -> (u64, u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        (
            self.scrapes.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            self.slowest_ms.load(Ordering::Relaxed),
        )
    }
}

/// `/metrics`, with a 2 s deadline: the body, or None.
fn scrape(port: u16) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    // Asked in HTTP/1.0, answered in it.
    out.starts_with("HTTP/1.0 200").then_some(out)
}

fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}

/// GET `path` as a page of another site would after rebinding its name to 127.0.0.1.
fn foreign_host(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: rebind.example:{port}\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// The open-file limit of this test process, raised so it can hold 2,000 connections.
fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read or write only the struct passed.
    unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
        lim.rlim_cur = lim.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
    }
}

/// A connection that sends `head` a byte at a time, one byte per `every`, for as long as the
/// server keeps it open: how long that was.
fn trickle(port: u16, head: &[u8], every: Duration) -> Duration {
    let t = Instant::now();
    let Ok(mut s) = connect_from(SLOW_HEADS, to(port)) else {
        return t.elapsed();
    };
    for b in head.iter().cycle() {
        if s.write_all(&[*b]).is_err() {
            break;
        }
        std::thread::sleep(every);
        if t.elapsed() > Duration::from_secs(30) {
            break;
        }
    }
    t.elapsed()
}

// Checks the collector under every attack of the list at once, against its own counters and
// the store: see the module comment.
#[test]
fn a_hostile_network_cannot_knock_the_collector_over() {
    let _g = bpf_lock(); // CPU-heavy: not alongside the timing-sensitive BPF tests
    raise_fd_limit();
    let dir = scratch("hostile");
    let port = free_port();
    let c = start(
        &dir,
        port,
        &["--header-timeout", "2s", "--body-timeout", "3s"],
    );
    let watch = MetricsWatch::start(port);
    let base = now_ns() - 3_600_000_000_000;
    let mut attacks = Vec::new();
    // Bombs: 1 MB and 4 MB bodies inflating to ~1 GiB and ~4 GiB, with a token; and one
    // without a token, refused before its body is read.
    for size in [1_000_000, 4_000_000] {
        attacks.push(std::thread::spawn(move || {
            let (b, inflated) = bomb(size);
            assert!(inflated >= 900 * MIB, "{inflated}");
            let (status, reply) = post(port, 0, None, &b);
            assert_eq!(status, 413, "bomb of {size} B → {inflated} B: {reply}");
            assert!(reply.contains("--max-inflated"), "{reply}");
        }));
    }
    attacks.push(std::thread::spawn(move || {
        let (b, _) = bomb(4_000_000);
        let headers = "Content-Type: application/octet-stream\r\n";
        let url = format!("http://127.0.0.1:{port}/api/v1/windows");
        let (status, _) =
            try_http_request("POST", &url, headers, &b).unwrap_or((401, String::new()));
        assert_eq!(status, 401);
    }));
    // Slow headers and slow bodies without a token: closed at the header deadline, or
    // refused at once (the token is checked before the body is read).
    for _ in 0..100 {
        attacks.push(std::thread::spawn(move || {
            let held = trickle(
                port,
                b"GET /api/v1/labels HTTP/1.1\r\nX-Slow: aaaaaaaaaa",
                Duration::from_millis(200),
            );
            assert!(
                held < Duration::from_secs(6),
                "a slow head was held {held:?}"
            );
        }));
    }
    for _ in 0..60 {
        attacks.push(std::thread::spawn(move || {
            let mut s = connect_from(SLOW_BODIES, to(port)).unwrap();
            s.write_all(b"POST /api/v1/windows HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 16000000\r\n\r\nPHASE")
                .unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut b = [0u8; 12];
            s.read_exact(&mut b).unwrap();
            assert_eq!(&b, b"HTTP/1.1 401", "{}", String::from_utf8_lossy(&b));
        }));
    }
    // 64 slow bodies with one agent's token (all of --max-uploads): a quarter hold that
    // agent's upload slots until the body deadline (408), the rest are turned away (503), and
    // the other agents' uploads go on.
    for _ in 0..MAX_UPLOADS {
        attacks.push(std::thread::spawn(move || {
            let mut s = connect_from(ONE_TOKEN, to(port)).unwrap();
            let head = format!(
                "POST /api/v1/windows HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {}\r\nContent-Length: 1000000\r\n\r\n",
                token(AGENTS - 1)
            );
            s.write_all(head.as_bytes()).unwrap();
            let t = Instant::now();
            let mut reply = Vec::new();
            s.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
            while reply.len() < 12 && t.elapsed() < Duration::from_secs(15) {
                let _ = s.write_all(b"x");
                let mut b = [0u8; 64];
                match s.read(&mut b) {
                    Ok(0) => break,
                    Ok(n) => reply.extend_from_slice(&b[..n]),
                    Err(_) => {}
                }
            }
            assert!(
                reply.starts_with(b"HTTP/1.1 408") || reply.starts_with(b"HTTP/1.1 503"),
                "{}",
                String::from_utf8_lossy(&reply)
            );
        }));
    }
    // 5,000 connections from one address opened and left silent: all but that address's
    // share are closed at once.
    let idle: Vec<TcpStream> = (0..5000)
        .filter_map(|_| connect_from(IDLE, to(port)).ok())
        .collect();
    assert!(idle.len() >= 4900, "{} connected", idle.len());
    // The deep stack: refused as it decodes.
    let deep = deep_stack();
    let t = Instant::now();
    let (status, reply) = post(port, 0, Some("deep"), &deep);
    let took = t.elapsed();
    assert_eq!(status, 400, "{reply}");
    assert!(reply.contains("more than 1024 frames"), "{reply}");
    assert!(
        took < Duration::from_secs(1),
        "the deep stack took {took:?}"
    );
    // Empty tokens, a foreign Host, the 100k-phase window.
    let url = format!("http://127.0.0.1:{port}");
    let (status, _) = try_http_request(
        "POST",
        &format!("{url}/api/v1/windows"),
        "Authorization: Bearer \r\n",
        b"x",
    )
    .unwrap();
    assert_eq!(status, 401, "an empty bearer token");
    for path in ["/api/v1/merged", "/"] {
        let reply = foreign_host(port, path);
        assert!(reply.starts_with("HTTP/1.0 403"), "{path}: {reply}");
    }
    let (status, reply) = post(port, 0, Some("phases"), &many_phases());
    assert_eq!(status, 400, "{reply}");
    assert!(reply.contains("phases"), "{reply}");
    // 200 valid uploads at once, while all of the above is going on; then 20 retries of
    // acknowledged windows (same keys).
    let give_up = Instant::now() + Duration::from_secs(120);
    let uploads: Vec<_> = (0..WINDOWS)
        .map(|seq| std::thread::spawn(move || deliver(port, seq, base, give_up)))
        .collect();
    let statuses: Vec<u16> = uploads.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        statuses.iter().all(|&s| s == 201),
        "first deliveries: {statuses:?}"
    );
    for seq in (0..WINDOWS).step_by(10) {
        assert_eq!(
            deliver(port, seq, base, give_up),
            200,
            "a retry of window {seq}"
        );
    }
    for a in attacks {
        a.join().unwrap();
    }
    drop(idle);
    let (scrapes, failed, slowest) = watch.finish();
    let peak = vm_hwm_mib(c.0.id());
    let cores = std::thread::available_parallelism().unwrap().get() as u64;
    let bound = 256 + (MAX_UPLOADS * MAX_BODY + cores * 2 * MAX_INFLATED) / MIB;
    eprintln!(
        "hostile: /metrics {scrapes} scrapes, {failed} failed or over 1 s, slowest {slowest} ms; collector peak RSS {peak} MiB (bound {bound} MiB)"
    );
    assert!(
        scrapes > 20 && failed == 0,
        "/metrics: {failed} of {scrapes} failed or took over 1 s (slowest {slowest} ms)"
    );
    assert!(
        peak < bound,
        "peak RSS {peak} MiB over the bound {bound} MiB"
    );
    // Every valid window exactly once, nothing else: the stored samples sum to exactly theirs.
    let metrics = scrape(port).unwrap();
    assert_eq!(
        metric(&metrics, "phaseprof_collector_windows_stored"),
        WINDOWS as u64
    );
    assert_eq!(
        metric(&metrics, "phaseprof_collector_windows_duplicate_total"),
        20
    );
    assert!(metric(&metrics, "phaseprof_collector_connections_timed_out_total") >= 100);
    assert!(
        metric(
            &metrics,
            "phaseprof_collector_connections_refused_per_address_total"
        ) >= 4900
    );
    let (status, merged) = http_get(&format!("{url}/api/v1/merged?from={base}"));
    assert_eq!(status, 200, "{merged}");
    let merged: serde_json::Value = serde_json::from_str(&merged).unwrap();
    let want: u64 = (1..=WINDOWS as u64).sum();
    assert_eq!(merged["events"]["cpu"]["samples"], want);
    drop(c);
}

// Checks the upload of issue 24 alone against a fresh collector: one stack of 33 million
// frames in 69 KB is refused with 400 within a second, and the collector's peak memory stays
// under 256 MiB.
#[test]
fn a_deep_stack_is_refused_at_once() {
    let _g = bpf_lock(); // builds a 66 MB window: not alongside the timing-sensitive BPF tests
    let dir = scratch("hostile-deep");
    let port = free_port();
    let c = start(&dir, port, &[]);
    let body = deep_stack();
    let t = Instant::now();
    let (status, reply) = post(port, 0, Some("deep"), &body);
    let took = t.elapsed();
    let peak = vm_hwm_mib(c.0.id());
    eprintln!(
        "deep stack: {} KB sent, {status} after {} ms, collector peak RSS {peak} MiB: {reply}",
        body.len() / 1000,
        took.as_millis()
    );
    assert_eq!(status, 400, "{reply}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    assert!(peak < 256, "peak RSS {peak} MiB");
    drop(c);
    let _ = std::fs::remove_dir_all(&dir);
}

// Checks empty tokens are refused at start, from the flag and from the environment.
#[test]
fn empty_read_tokens_are_refused() {
    let dir = scratch("hostile-empty");
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("a {}\n", token(0))).unwrap();
    for env in [false, true] {
        let mut cmd = Command::new(collector_bin());
        cmd.args(["--listen", "127.0.0.1:0", "--tokens"])
            .arg(&tokens)
            .arg("--data")
            .arg(dir.join("data"));
        if env {
            cmd.env("PHASEPROF_READ_TOKEN", "");
        } else {
            cmd.args(["--read-token", ""]);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("empty"), "{err}");
    }
}

// Checks that a collector killed with SIGKILL in the middle of a 200-way ingest and restarted
// holds every window once: those acknowledged before the kill and those retried after it (the
// retries of windows stored but not acknowledged are recognised by their keys).
#[test]
fn kill_9_during_ingest_loses_and_duplicates_nothing() {
    let _g = bpf_lock();
    let dir = scratch("hostile-kill");
    let port = free_port();
    let mut c = start(&dir, port, &[]);
    let base = now_ns() - 3_600_000_000_000;
    let acked = Arc::new(AtomicU64::new(0));
    let give_up = Instant::now() + Duration::from_secs(120);
    let uploads: Vec<_> = (0..WINDOWS)
        .map(|seq| {
            let acked = acked.clone();
            std::thread::spawn(move || {
                // Spread over the kill: some before, some during, some after.
                std::thread::sleep(Duration::from_millis((seq as u64 % 50) * 20));
                let s = deliver(port, seq, base, give_up);
                acked.fetch_add(1, Ordering::Relaxed);
                s
            })
        })
        .collect();
    while acked.load(Ordering::Relaxed) < 40 {
        std::thread::sleep(Duration::from_millis(5));
    }
    c.0.kill().unwrap(); // SIGKILL
    c.0.wait().unwrap();
    let at_kill = acked.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(500));
    let c = start(&dir, port, &[]);
    let statuses: Vec<u16> = uploads.into_iter().map(|h| h.join().unwrap()).collect();
    assert!(
        statuses.iter().all(|&s| s == 201 || s == 200),
        "{statuses:?}"
    );
    let (status, merged) = http_get(&format!(
        "http://127.0.0.1:{port}/api/v1/merged?from={base}"
    ));
    assert_eq!(status, 200, "{merged}");
    let merged: serde_json::Value = serde_json::from_str(&merged).unwrap();
    let want: u64 = (1..=WINDOWS as u64).sum();
    assert_eq!(merged["events"]["cpu"]["samples"], want, "each window once");
    let metrics = scrape(port).unwrap();
    assert_eq!(
        metric(&metrics, "phaseprof_collector_windows_stored"),
        WINDOWS as u64
    );
    eprintln!(
        "kill -9: {at_kill} of {WINDOWS} windows acknowledged before the kill; after the restart {} retries were already stored",
        metric(&metrics, "phaseprof_collector_windows_duplicate_total")
    );
    drop(c);
}
