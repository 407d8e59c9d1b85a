//! Fleet: collector ingest, merged views and what is stored, on SQLite and ClickHouse. An
//! hour of 10 hosts at 1 s windows (36,000) on both; a day of 20 hosts at 10 s windows
//! (172,800) on ClickHouse.
use phaseprof_e2e::{read_until, root};
use phaseprof_model::{PhaseStats, Profile, SampleKind};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use super::*;

const AGENTS: usize = 50;

/// The window every host sends (bodies differ in labels and times): 500 stacks, as a 10 s
/// window of a busy service at 99 Hz, its cpu samples spread over three phases, with
/// phase totals.
fn template() -> Profile {
    let mut p = synthetic_profile(500);
    p.phases = ["(none)", "propose", "verify", "commit"]
        .map(String::from)
        .to_vec();
    let cpu = p.samples.iter_mut().filter(|s| s.kind == SampleKind::Cpu);
    for (i, s) in cpu.enumerate() {
        s.phase = (i % 4) as u32;
        s.phase_mask = 1 << s.phase;
    }
    p.phase_stats = (0..4u64)
        .map(|i| {
            let mut s = PhaseStats {
                calls: 100 * i,
                wall_ns: 1_000_000 * i,
                wall_max_ns: 40_000 * i,
                wall_hist: vec![(200, 60 * i), (210, 40 * i)],
                cpu_ns: 700_000 * i,
                syscalls: 30 * i,
                ..PhaseStats::default()
            };
            s.costs.insert("flush_syscalls".into(), 10 * i);
            s
        })
        .collect();
    p
}

/// Window bodies from the template, serialized once: each is its encoding with the start, end
/// and host filled in, gzipped at `level` (encoding each window from scratch took ~30 ms).
/// JSON (format 2) as text; the binary wire format (3, MessagePack) byte for byte: times
/// over 2^32 are always 9 bytes there, and a host's string replaces the placeholder's whole.
struct Bodies {
    encoded: Vec<u8>,
    binary: bool,
    level: flate2::Compression,
}

const START: u64 = 1_111_111_111_111_111_111;
const END: u64 = 2_222_222_222_222_222_222;
const HOST: &str = "host-placeholder";

impl Bodies {
    fn new(binary: bool, level: flate2::Compression) -> Self {
        let mut t = template();
        t.meta.start_unix_ns = START;
        t.meta.end_unix_ns = END;
        t.meta.labels.insert("host".into(), HOST.into());
        t.meta.labels.insert("version".into(), "1.5".into());
        let encoded = if binary {
            rmp_serde::to_vec_named(&t).unwrap()
        } else {
            serde_json::to_vec(&t).unwrap()
        };
        Bodies {
            encoded,
            binary,
            level,
        }
    }

    /// How `v` is written in the encoding.
    fn token<T: serde::Serialize>(&self, v: &T) -> Vec<u8> {
        if self.binary {
            rmp_serde::to_vec(v).unwrap()
        } else {
            serde_json::to_vec(v).unwrap()
        }
    }

    fn body(&self, host: &str, start: u64, len: u64) -> Vec<u8> {
        use std::io::Write;
        let mut encoded = self.encoded.clone();
        for (from, to) in [
            (self.token(&START), self.token(&start)),
            (self.token(&END), self.token(&(start + len))),
            (self.token(&HOST), self.token(&host)),
        ] {
            encoded = replace(&encoded, &from, &to);
        }
        let version = if self.binary {
            phaseprof_model::format::WIRE_VERSION
        } else {
            phaseprof_model::format::FORMAT_VERSION
        };
        let mut out = phaseprof_model::format::MAGIC.to_vec();
        out.extend_from_slice(&version.to_le_bytes());
        let mut gz = flate2::write::GzEncoder::new(out, self.level);
        gz.write_all(&encoded).unwrap();
        gz.finish().unwrap()
    }
}

/// `haystack` with every `from` replaced by `to`.
fn replace(haystack: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut i = 0;
    while i < haystack.len() {
        if haystack[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}

/// `n` bodies, window `k` of host `k % hosts` starting at `from_ns + (k / hosts) * len_ns`,
/// encoded on every core.
fn bodies(n: usize, hosts: usize, from_ns: u64, len_ns: u64, binary: bool) -> Vec<Vec<u8>> {
    // As the agents send them: the binary format at its level, JSON at the default.
    let level = if binary {
        flate2::Compression::new(phaseprof_model::WIRE_GZIP_LEVEL)
    } else {
        flate2::Compression::default()
    };
    let b = Bodies::new(binary, level);
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let mut out: Vec<Vec<u8>> = vec![Vec::new(); n];
    std::thread::scope(|s| {
        for (c, chunk) in out.chunks_mut(n.div_ceil(cores)).enumerate() {
            let b = &b;
            s.spawn(move || {
                for (i, body) in chunk.iter_mut().enumerate() {
                    let k = c * n.div_ceil(cores) + i;
                    let host = format!("host-{}", k % hosts);
                    *body = b.body(&host, from_ns + (k / hosts) as u64 * len_ns, len_ns);
                }
            });
        }
    });
    out
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// An hour of 10 hosts' 1 s windows, ending now, in the binary wire format and as gzip JSON.
pub struct FleetHour {
    from_ns: u64,
    to_ns: u64,
    bodies: Vec<Vec<u8>>,
    json: Vec<Vec<u8>>,
}

impl FleetHour {
    pub fn new() -> Self {
        let n: usize = std::env::var("PHASEPROF_BENCH_WINDOWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(36_000);
        let s = 1_000_000_000;
        let to_ns = now_ns();
        let from_ns = to_ns - (n as u64 / 10) * s;
        FleetHour {
            from_ns,
            to_ns,
            bodies: bodies(n, 10, from_ns, s, true),
            json: bodies(n, 10, from_ns, s, false),
        }
    }
}

/// A collector storing with `store`, its agents' tokens, and its port.
struct Collector {
    child: Child,
    port: u16,
    tokens: Vec<String>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn collector(store: &[String], dir: &std::path::Path) -> Collector {
    // One token per agent, as a fleet has.
    let tokens: Vec<String> = (0..AGENTS)
        .map(|i| format!("bench-agent-token-{i:012}"))
        .collect();
    let lines: String = (tokens.iter().enumerate())
        .map(|(i, t)| format!("bench-{i} {t}\n"))
        .collect();
    std::fs::write(dir.join("tokens"), lines).unwrap();
    let port = phaseprof_e2e::free_port();
    let mut child = Command::new(root().join("target/release/phaseprof-collector"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--tokens"])
        .arg(dir.join("tokens"))
        .args(["--agent-rate", "100000"])
        .args(store)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    read_until(&mut err, "listening on");
    Collector {
        child,
        port,
        tokens,
    }
}

/// Posts `n` windows from `AGENTS` concurrent agents (each sends its next window once the
/// last is stored), `body(k)` the k-th; returns windows per second.
fn ingest(c: &Collector, n: usize, body: &(dyn Fn(usize) -> Vec<u8> + Sync)) -> f64 {
    let url = format!("http://127.0.0.1:{}/api/v1/windows", c.port);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let t = Instant::now();
    std::thread::scope(|s| {
        for token in &c.tokens {
            let (url, next) = (&url, &next);
            s.spawn(move || loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if k >= n {
                    break;
                }
                let (status, text) = phaseprof_e2e::http_post(url, token, &body(k));
                assert_eq!(status, 201, "{text}");
            });
        }
    });
    n as f64 / t.elapsed().as_secs_f64()
}

/// Seconds to show a merged selection as a user opens it: the profile page (phase table, top
/// functions) and its cpu flamegraph, each round a selection not cached yet.
fn view_seconds(c: &Collector, selections: &[String]) -> Vec<f64> {
    selections
        .iter()
        .map(|id| {
            let t = Instant::now();
            let base = format!("http://127.0.0.1:{}/profile/{id}", c.port);
            for url in [base.clone(), format!("{base}/flamegraph/cpu.svg")] {
                let (status, body) = phaseprof_e2e::http_get(&url);
                assert_eq!(status, 200, "{url}: {}", &body[..body.len().min(300)]);
            }
            t.elapsed().as_secs_f64()
        })
        .collect()
}

/// Seconds of `GET /api/v1/merged` (the JSON summary with the phase table) over `[from, to)`.
fn merged_seconds(c: &Collector, from: u64, to: u64) -> f64 {
    let t = Instant::now();
    let url = format!(
        "http://127.0.0.1:{}/api/v1/merged?sel=version%3D1.5&from={from}&to={to}",
        c.port
    );
    let (status, body) = phaseprof_e2e::http_get(&url);
    assert_eq!(status, 200, "{}", &body[..body.len().min(300)]);
    t.elapsed().as_secs_f64()
}

/// What the store holds: rows and bytes per table, bytes per window.
fn print_footprint(name: &str, c: &Collector) {
    let (status, body) =
        phaseprof_e2e::http_get(&format!("http://127.0.0.1:{}/api/v1/store", c.port));
    assert_eq!(status, 200, "{body}");
    let f: serde_json::Value = serde_json::from_str(&body).unwrap();
    let tables: Vec<String> = (f["tables"].as_array().unwrap().iter())
        .map(|t| {
            format!(
                "{} {} rows {:.1} MiB",
                t["table"].as_str().unwrap(),
                t["rows"],
                t["bytes"].as_f64().unwrap() / 1048576.0
            )
        })
        .collect();
    let kib = |k: &str| f[k].as_f64().unwrap_or(0.0) / 1024.0;
    let split = match f["rows_bytes_per_window"].as_f64() {
        Some(rows) => format!(
            "= body {:.1} KiB (kept for download) + rows and rollups {:.1} KiB",
            kib("body_bytes_per_window"),
            rows / 1024.0
        ),
        None => format!(
            "(bodies of {:.1} KiB as received, kept for download, compressed with their table)",
            kib("body_bytes_per_window")
        ),
    };
    println!(
        "collector ({name}) stored: {} windows, {:.1} MiB; per window {:.1} KiB {split}; tables: {}",
        f["windows"],
        f["bytes"].as_f64().unwrap() / 1048576.0,
        kib("bytes_per_window"),
        tables.join(", ")
    );
}

fn mean_len(bodies: &[Vec<u8>]) -> f64 {
    bodies.iter().map(Vec::len).sum::<usize>() as f64 / bodies.len().max(1) as f64
}

/// `store`'s arguments for a second, empty store beside it: SQLite in a directory of its own,
/// ClickHouse in tables of their own.
fn scratch_store(store: &[String], dir: &std::path::Path, name: &str) -> Vec<String> {
    match store.first().map(String::as_str) {
        Some("--data") => vec![
            "--data".into(),
            dir.join(format!("data-{name}")).display().to_string(),
        ],
        _ => [
            store,
            &["--clickhouse-table".into(), format!("bench_{name}")],
        ]
        .concat(),
    }
}

/// Ingest rate and merged-view latency over an hour of 10 hosts at 1 s windows.
pub fn fleet_bench(
    name: &str,
    store: &[String],
    dir: &std::path::Path,
    hour: &FleetHour,
    rounds: usize,
) {
    // Gzip JSON (what agents sent before the binary format) into a store of its own first.
    let (json_rate, json_size) = {
        let json_store = scratch_store(store, dir, "json");
        let c = collector(&json_store, dir);
        let json = &hour.json;
        let measured = (ingest(&c, json.len(), &|k| json[k].clone()), mean_len(json));
        drop(c);
        // Its disk back before the next store fills its own (an hour is GBs in SQLite).
        let _ = std::fs::remove_dir_all(dir.join("data-json"));
        measured
    };
    let c = collector(store, dir);
    let bodies = &hour.bodies;
    let rate = ingest(&c, bodies.len(), &|k| bodies[k].clone());
    let goal = if name == "SQLite" { 2000 } else { 1000 };
    println!(
        "collector ({name}) ingest: {} windows from {AGENTS} agents: binary (format 3, {:.1} KiB) {rate:.0} windows/s (goal ≥ {goal}); gzip JSON (format 2, {:.1} KiB) {json_rate:.0} windows/s",
        bodies.len(),
        mean_len(bodies) / 1024.0,
        json_size / 1024.0,
    );
    // The same selection spelled differently each round: never served from the page cache.
    // The pages show the last N hours: two cover the hour, however long encoding it took.
    let ids: Vec<String> = ["2h", "120m", "7200s", "119m", "118m"][..rounds.clamp(1, 5)]
        .iter()
        .map(|last| format!("version%3D1.5%40{last}"))
        .collect();
    let views = view_seconds(&c, &ids);
    let merged: Vec<f64> = (0..rounds.clamp(1, 5))
        .map(|_| merged_seconds(&c, hour.from_ns, hour.to_ns))
        .collect();
    println!(
        "collector ({name}) merged view of an hour of 10 hosts ({} windows): page with phase table and top functions + cpu flamegraph {:.0} ms, /api/v1/merged {:.0} ms (medians of {})",
        bodies.len(),
        median(views) * 1e3,
        median(merged) * 1e3,
        rounds.clamp(1, 5)
    );
    print_footprint(name, &c);
}

/// A day of 20 hosts at 10 s windows (172,800) on ClickHouse: rows, bytes on disk, the
/// merged view's time.
pub fn fleet_day_bench(store: &[String], dir: &std::path::Path, rounds: usize) {
    let (hosts, per_host) = (20usize, 8640usize);
    let n = std::env::var("PHASEPROF_BENCH_DAY_WINDOWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(hosts * per_host);
    let c = collector(store, dir);
    let len = 10_000_000_000u64;
    let to = now_ns();
    let from = to - (n / hosts) as u64 * len;
    // As agents gzip them: the loading agents encode the day's bodies on the same cores.
    let b = Bodies::new(
        true,
        flate2::Compression::new(phaseprof_model::WIRE_GZIP_LEVEL),
    );
    let rate = ingest(&c, n, &|k| {
        b.body(
            &format!("host-{}", k % hosts),
            from + (k / hosts) as u64 * len,
            len,
        )
    });
    println!(
        "collector (ClickHouse) loaded a day of {hosts} hosts at 10 s windows: {n} windows at {rate:.0} windows/s (binary bodies gzipped by the loading agents on the same cores)"
    );
    let merged: Vec<f64> = (0..rounds.clamp(1, 5))
        .map(|_| merged_seconds(&c, from, to + 1))
        .collect();
    // The last 25 hours cover the day however long loading it took.
    let ids: Vec<String> = ["25h", "1500m", "90000s", "1501m", "1502m"][..rounds.clamp(1, 5)]
        .iter()
        .map(|last| format!("version%3D1.5%40{last}"))
        .collect();
    let views = view_seconds(&c, &ids);
    println!(
        "collector (ClickHouse) merged view of the day ({n} windows): /api/v1/merged {:.2} s, page with phase table and top functions + cpu flamegraph {:.2} s (medians of {})",
        median(merged),
        median(views),
        rounds.clamp(1, 5)
    );
    print_footprint("ClickHouse", &c);
}
