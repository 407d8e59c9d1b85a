//! Fleet: collector ingest and merged queries over an hour of windows, SQLite and ClickHouse.
use phaseprof_e2e::{read_until, root};
use std::process::{Command, Stdio};
use std::time::Instant;

use super::*;

/// An hour of 10 hosts' windows, ending now (older windows would fall to the collector's 7-day
/// retention); bodies differ only in labels and times.
pub struct FleetHour {
    from_ns: u64,
    to_ns: u64,
    bodies: Vec<Vec<u8>>,
}

impl FleetHour {
    pub fn new() -> Self {
        let to_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let from_ns = to_ns - 3_600_000_000_000;
        let n: usize = std::env::var("PHASEPROF_BENCH_WINDOWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3600);
        let template = synthetic_profile(500);
        let bodies = (0..n)
            .map(|k| {
                let mut p = template.clone();
                p.meta.start_unix_ns = from_ns + (k / 10) as u64 * 10_000_000_000;
                p.meta.end_unix_ns = p.meta.start_unix_ns + 10_000_000_000;
                p.meta
                    .labels
                    .insert("host".into(), format!("host-{}", k % 10));
                p.meta.labels.insert("version".into(), "1.5".into());
                let mut b = Vec::new();
                phaseprof_model::write_profile(&p, &mut b).unwrap();
                b
            })
            .collect();
        FleetHour {
            from_ns,
            to_ns,
            bodies,
        }
    }
}

/// Ingest rate and merged-query latency of a collector storing with `store`.
pub fn fleet_bench(
    name: &str,
    store: &[String],
    dir: &std::path::Path,
    hour: &FleetHour,
    rounds: usize,
) {
    const AGENTS: usize = 50;
    // One token per agent, as a fleet has (the collector's rate limit is per agent).
    let tokens: Vec<String> = (0..AGENTS)
        .map(|i| format!("bench-agent-token-{i:012}"))
        .collect();
    let lines: String = (tokens.iter().enumerate())
        .map(|(i, t)| format!("bench-{i} {t}\n"))
        .collect();
    std::fs::write(dir.join("tokens"), lines).unwrap();
    let port = phaseprof_e2e::free_port();
    let mut coll = Command::new(root().join("target/release/phaseprof-collector"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--tokens"])
        .arg(dir.join("tokens"))
        .args(store)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(coll.stderr.take().unwrap());
    read_until(&mut err, "listening on");
    let bodies = &hour.bodies;
    let size = bodies.iter().map(Vec::len).sum::<usize>() / bodies.len();
    let url = format!("http://127.0.0.1:{port}/api/v1/windows");
    let t = Instant::now();
    std::thread::scope(|s| {
        for (chunk, token) in bodies.chunks(bodies.len().div_ceil(AGENTS)).zip(&tokens) {
            let url = &url;
            s.spawn(move || {
                for b in chunk {
                    let (status, body) = phaseprof_e2e::http_post(url, token, b);
                    assert_eq!(status, 201, "{body}");
                }
            });
        }
    });
    let secs = t.elapsed().as_secs_f64();
    println!(
        "collector ({name}) ingest: {} windows of {:.1} KiB from {AGENTS} agents in {secs:.1} s = {:.0} windows/s",
        bodies.len(),
        size as f64 / 1024.0,
        bodies.len() as f64 / secs
    );
    let mut q = vec![];
    for _ in 0..rounds.min(3) {
        let t = Instant::now();
        let (status, body) = phaseprof_e2e::http_get(&format!(
            "http://127.0.0.1:{port}/api/v1/merged?sel=version%3D1.5&from={}&to={}",
            hour.from_ns, hour.to_ns
        ));
        assert_eq!(status, 200, "{}", &body[..body.len().min(300)]);
        q.push(t.elapsed().as_secs_f64());
    }
    println!(
        "collector ({name}) merged query over 1 hour of 10 hosts ({} windows): {:.2} s (median of {})",
        bodies.len(),
        median(q),
        rounds.min(3)
    );
    let _ = coll.kill();
    let _ = coll.wait();
}
