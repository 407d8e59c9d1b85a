//! The collector's merged views are sums its store computes from rows and rollups: they must
//! equal what merging the same windows with `model::merge` gives, exactly for counts. Random
//! windows of three hosts over ~3 hours (every event kind, phases in varying orders and
//! masks, syscalls with and without stacks, phase totals with histograms and costs, drops),
//! posted to a collector on SQLite and one on ClickHouse; selections whose ranges cut
//! through hours and minutes (so hour and minute rollups and raw rows all count) are
//! downloaded merged and compared with the local merge; a diff of two selections is compared
//! with `model::diff` over the same windows.
use std::collections::BTreeMap;
use std::io::BufReader;
use std::process::{Command, Stdio};

use phaseprof_e2e::*;
use phaseprof_model::diff::{diff, DiffOptions};
use phaseprof_model::merge::merge;
use phaseprof_model::*;

const TOKENS: [(&str, &str); 3] = [
    ("host-a", "store-sums-token-a-0123456789"),
    ("host-b", "store-sums-token-b-0123456789"),
    ("host-c", "store-sums-token-c-0123456789"),
];

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const PHASES: [&str; 4] = ["propose", "verify", "commit", "fan_out"];

/// The stored kinds `window` does not generate by name.
fn unnamed_kinds() -> impl Iterator<Item = &'static Kind> {
    use SampleKind::*;
    let named = [Cpu, Offcpu, Syscall, Alloc, AllocTotal, Pagefault];
    KINDS
        .iter()
        .filter(move |k| k.stored_as.is_some() && !named.contains(&k.kind))
}

/// A random window of `host` starting at `start` (ns), `version` in its labels.
fn window(r: &mut Rng, host: &str, version: &str, start: u64, len: u64) -> Profile {
    let mut phases = vec![PHASE_NONE_NAME.to_string()];
    for p in PHASES {
        if r.below(3) > 0 {
            phases.push(p.to_string());
        }
    }
    // Phase order differs between windows (a restarted agent probes in another order).
    for i in (2..phases.len()).rev() {
        let j = 1 + r.below(i as u64) as usize;
        phases.swap(i, j);
    }
    let mut events = vec![EventKind::Cpu, EventKind::Syscall];
    for k in [EventKind::Offcpu, EventKind::Alloc, EventKind::Pagefault] {
        if r.below(4) > 0 {
            events.push(k);
        }
    }
    events.extend(unnamed_kinds().map(|k| k.event));
    events.dedup();
    let mut meta = Meta {
        pids: vec![100, 101],
        comm: "node".into(),
        events: events.clone(),
        frequency_hz: 99,
        start_unix_ns: start,
        end_unix_ns: start + len,
        syscall_stack_every: 16,
        labels: [("host", host), ("service", "node"), ("version", version)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Meta::default()
    };
    if r.below(4) > 0 {
        meta.targets_cpu_ns = Some(r.below(1 << 30));
    }
    meta.names_late = r.below(3);
    if r.below(2) > 0 {
        meta.phase_probes = Some(PhaseProbeCost {
            calls: r.below(1000),
            switch_hits: r.below(10),
            probe_ns: r.below(1 << 24),
            target_cpu_ns: r.below(1 << 30),
        });
    }
    let mut b = ProfileBuilder::new(meta, phases.clone());
    let frames: Vec<u32> = (0..30u64)
        .map(|i| {
            b.intern_frame(Frame {
                function: format!("node::module_{}::f{i}", i % 5),
                module: ["node", "libc.so.6", "[kernel]"][(i % 3) as usize].into(),
                kind: if i % 3 == 2 {
                    FrameKind::Kernel
                } else {
                    FrameKind::User
                },
                inlined: i % 7 == 0,
            })
        })
        .collect();
    let stacks: Vec<u32> = (0..12)
        .map(|_| {
            let depth = 1 + r.below(6);
            let f = (0..depth).map(|_| frames[r.below(30) as usize]).collect();
            b.intern_stack(f)
        })
        .collect();
    let n = phases.len() as u64;
    let at = |r: &mut Rng| {
        let phase = r.below(n) as u32;
        let mask = (1u64 << phase) | (r.below(1 << n) & ((1 << n) - 1));
        PhaseAt { phase, mask }
    };
    for _ in 0..r.below(25) {
        let (pid, s, a) = (100 + r.below(2) as u32, stacks[r.below(12) as usize], at(r));
        b.add(
            Sample::new(
                SampleKind::Cpu,
                (pid, pid + r.below(3) as u32),
                a,
                vec![1 + r.below(50)],
            )
            .on(s),
        );
    }
    for _ in 0..r.below(15) {
        let (s, a) = (stacks[r.below(12) as usize], at(r));
        b.add(Sample::new(SampleKind::Offcpu, (100, 100), a, vec![r.below(1 << 33)]).on(s));
    }
    for _ in 0..r.below(25) {
        let (s, a) = (stacks[r.below(12) as usize], at(r));
        let stack = (r.below(3) > 0).then_some(s);
        let nr = [0, 1, 202, 232][r.below(4) as usize];
        // One thread a process: the store sums a process's threads (its rows have no tid), and
        // unsampled syscalls spread over the stacks of their thread, so with several threads
        // the store's per-stack estimates would (rightly) differ from a per-thread merge.
        let pid = 100 + r.below(2) as u32;
        b.add(
            Sample::new(
                SampleKind::Syscall,
                (pid, pid),
                a,
                vec![1 + r.below(40), r.below(1 << 24)],
            )
            .on(stack)
            .syscall(nr),
        );
    }
    for _ in 0..r.below(10) {
        let (s, a) = (stacks[r.below(12) as usize], at(r));
        let count = r.below(1000) as f64 / 8.0;
        b.add(
            Sample::new(
                SampleKind::Alloc,
                (100, 0),
                a,
                vec![r.below(1 << 28), 1 + r.below(9), milli(count)],
            )
            .on(s),
        );
        b.add(Sample::new(
            SampleKind::AllocTotal,
            (100, 0),
            a,
            vec![r.below(1 << 30), r.below(1000), r.below(1000)],
        ));
    }
    for _ in 0..r.below(8) {
        let (s, a) = (stacks[r.below(12) as usize], at(r));
        b.add(Sample::new(SampleKind::Pagefault, (101, 101), a, vec![1 + r.below(30)]).on(s));
    }
    // Kinds added to the kinds' table since this generator was written: random samples of every
    // value, so that the stores are held to carry them exactly too.
    for k in unnamed_kinds() {
        for _ in 0..r.below(8) {
            let (s, a) = (stacks[r.below(12) as usize], at(r));
            let pid = 100 + r.below(2) as u32;
            let tid = if k.per_thread { pid } else { 0 };
            let values = k.values.iter().map(|_| r.below(1 << 20)).collect();
            let stack = (k.stacks != Stacks::Never).then_some(s);
            let nr = r.below(30) as u32;
            b.add(
                Sample::new(k.kind, (pid, tid), a, values)
                    .on(stack)
                    .syscall(nr),
            );
        }
    }
    *b.phase_stats_mut() = (0..n)
        .map(|_| {
            let mut s = PhaseStats {
                calls: r.below(500),
                wall_ns: r.below(1 << 34),
                wall_max_ns: r.below(1 << 30),
                wall_hist: (0..r.below(5))
                    .map(|i| (20 + i as u32 * 7, 1 + r.below(99)))
                    .collect(),
                cpu_ns: r.below(1 << 32),
                offcpu_ns: r.below(1 << 32),
                syscalls: r.below(10_000),
                syscall_ns: r.below(1 << 30),
                alloc_bytes: r.below(1 << 30),
                page_faults: r.below(100),
                ..PhaseStats::default()
            };
            s.costs.insert("flush_syscalls".into(), r.below(300));
            if r.below(2) == 0 {
                s.costs.insert("clone_bytes".into(), r.below(1 << 20));
            }
            s
        })
        .collect();
    let lost = b.lost_mut();
    lost.events = r.below(5);
    lost.stacks = r.below(50);
    lost.by_reason.insert("ring_full".into(), r.below(5));
    lost.by_reason
        .insert("phase_depth_exceeded".into(), r.below(2));
    let mut p = b.finish();
    p.costs.insert("flush_syscalls".into(), r.below(1000));
    p
}

/// Folded stacks of `kind` (optionally within phase `name`) with their values.
fn folded(p: &Profile, kind: EventKind, phase: Option<&str>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Some(phase) = phase.map_or(Some(None), |n| p.phase_index(n).map(Some)) else {
        return out;
    };
    for w in p.weighted_stacks(kind, phase) {
        *out.entry(p.names_root_first(&w).join(";")).or_default() += w.value;
    }
    out
}

/// Asserts that `got` (the store's) shows what `want` (model::merge's) shows.
fn assert_same_views(what: &str, got: &Profile, want: &Profile) {
    assert_eq!(
        (got.meta.start_unix_ns, got.meta.end_unix_ns),
        (want.meta.start_unix_ns, want.meta.end_unix_ns),
        "{what}: span"
    );
    let set = |p: &Profile| {
        p.meta
            .events
            .iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>()
    };
    assert_eq!(set(got), set(want), "{what}: events");
    assert_eq!(got.lost, want.lost, "{what}: lost");
    assert_eq!(got.costs, want.costs, "{what}: costs");
    assert_eq!(
        got.meta.targets_cpu_ns, want.meta.targets_cpu_ns,
        "{what}: targets' CPU time"
    );
    assert_eq!(
        got.meta.names_late, want.meta.names_late,
        "{what}: names late"
    );
    assert_eq!(
        got.meta.phase_probes, want.meta.phase_probes,
        "{what}: phase probes"
    );
    let stats = |p: &Profile| -> BTreeMap<String, PhaseStats> {
        (p.phases.iter().cloned().zip(p.phase_stats.iter().cloned()))
            .map(|(n, mut s)| {
                s.wall_hist.sort();
                (n, s)
            })
            .collect()
    };
    assert_eq!(stats(got), stats(want), "{what}: phase totals");
    let mut phases: Vec<Option<&str>> = want.phases.iter().map(|n| Some(n.as_str())).collect();
    phases.push(None);
    for kind in EventKind::ALL {
        for phase in &phases {
            let (g, w) = (folded(got, kind, *phase), folded(want, kind, *phase));
            assert_eq!(g, w, "{what}: {kind} stacks in {phase:?}");
        }
    }
    // Every value of every kind the stores keep, summed by kind: exactly equal.
    for k in phaseprof_model::KINDS
        .iter()
        .filter(|k| k.stored_as.is_some())
    {
        for (i, v) in k.values.iter().enumerate() {
            let (g, w) = (got.total(k.kind, i), want.total(k.kind, i));
            assert_eq!(g, w, "{what}: {} {}", k.name, v.name);
        }
    }
}

/// Numbers equal to 1e-9 (sums of fractions in another order), everything else exactly.
fn assert_json_close(path: &str, got: &serde_json::Value, want: &serde_json::Value) {
    use serde_json::Value;
    match (got, want) {
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            assert!(a == b || rel_diff(a, b) < 1e-9, "{path}: {a} vs {b}");
        }
        (Value::Array(a), Value::Array(b)) => {
            assert_eq!(a.len(), b.len(), "{path}: lengths");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert_json_close(&format!("{path}[{i}]"), x, y);
            }
        }
        (Value::Object(a), Value::Object(b)) => {
            assert_eq!(
                a.keys().collect::<Vec<_>>(),
                b.keys().collect::<Vec<_>>(),
                "{path}"
            );
            for (k, x) in a {
                assert_json_close(&format!("{path}.{k}"), x, &b[k]);
            }
        }
        _ => assert_eq!(got, want, "{path}"),
    }
}

/// Which windows a selection picks.
type Pick = dyn Fn(&Profile) -> bool;

pub(crate) fn download(url: &str) -> Vec<u8> {
    let mut resp = ureq::get(url)
        .call()
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    resp.body_mut()
        .with_config()
        .limit(1 << 30)
        .read_to_vec()
        .unwrap()
}

fn sums_equal_merge(name: &str, store: &[String]) {
    let dir = scratch(&format!("store-sums-{name}"));
    let tokens = dir.join("tokens");
    let lines: String = TOKENS.iter().map(|(h, t)| format!("{h} {t}\n")).collect();
    std::fs::write(&tokens, lines).unwrap();
    let port = free_port();
    let mut coll = Killed(
        Command::new(collector_bin())
            .args(["--listen", &format!("127.0.0.1:{port}"), "--tokens"])
            .arg(&tokens)
            .args(["--agent-rate", "1000"])
            .args(store)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    read_until(
        &mut BufReader::new(coll.0.stderr.take().unwrap()),
        "listening on",
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let s = 1_000_000_000u64;
    // ~3 hours of windows ending a few minutes ago, each host its own clock.
    let base = (now - 4 * 3600 * s) / (3600 * s) * (3600 * s) + 17 * s;
    let mut r = Rng(0x9e37_79b9_7f4a_7c15);
    let mut windows: Vec<Profile> = Vec::new();
    let mut posted_bytes = 0u64;
    for (i, (host, token)) in TOKENS.iter().enumerate() {
        let mut t = base + i as u64 * 3 * s;
        while t < base + 3 * 3600 * s {
            let version = if r.below(2) == 0 { "1.4" } else { "1.5" };
            let len = 1 + r.below(10 * s);
            let p = window(&mut r, host, version, t, len);
            let mut body = Vec::new();
            write_profile(&p, &mut body).unwrap();
            let (status, text) = http_post(
                &format!("http://127.0.0.1:{port}/api/v1/windows"),
                token,
                &body,
            );
            assert_eq!(status, 201, "{text}");
            posted_bytes += body.len() as u64;
            windows.push(p);
            t += 20 * s + r.below(100 * s);
        }
    }
    eprintln!("{name}: {} windows stored", windows.len());
    let url = format!("http://127.0.0.1:{port}/api/v1");
    // The store's footprint counts each body as received (its size was 0 on ClickHouse
    // releases whose parts have no per-column sizes).
    let (status, text) = http_get(&format!("{url}/store"));
    assert_eq!(status, 200, "{text}");
    let footprint: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(footprint["windows"], windows.len(), "{footprint}");
    assert_eq!(footprint["body_bytes"], posted_bytes, "{footprint}");
    // Ranges cutting through hours and minutes, an aligned hour, a range inside one minute.
    let ranges = [
        (base + 1234 * s + 5, base + 3 * 3600 * s - 777 * s),
        (base - 17 * s + 3600 * s, base - 17 * s + 2 * 3600 * s),
        (base + 5000 * s, base + 5040 * s),
        (0, 0),
    ];
    for (from, to) in ranges {
        let selections: [(&str, &Pick); 2] = [
            ("service%3Dnode", &|_| true),
            ("host%3Dhost-b,version%3D1.5", &|p| {
                p.meta.labels["host"] == "host-b" && p.meta.labels["version"] == "1.5"
            }),
        ];
        for (sel, keep) in selections {
            let picked: Vec<&Profile> = (windows.iter())
                .filter(|p| keep(p))
                .filter(|p| p.meta.start_unix_ns >= from && (to == 0 || p.meta.start_unix_ns < to))
                .collect();
            let what = format!("{name} {sel} [{from}, {to})");
            let q = format!("sel={sel}&from={from}&to={to}");
            if picked.is_empty() {
                let (status, _) = http_get(&format!("{url}/merged?{q}"));
                assert_eq!(status, 404, "{what}");
                continue;
            }
            let mut sorted = picked.clone();
            sorted.sort_by_key(|p| p.meta.start_unix_ns);
            let want = merge(&sorted);
            let got = read_profile(&download(&format!("{url}/merged.phaseprof?{q}"))[..]).unwrap();
            assert_same_views(&what, &got, &want);
            eprintln!("{what}: {} windows, equal", picked.len());
        }
    }
    // Pyroscope's API client asks for an hour of it as Grafana would: time series by minute,
    // a merged pprof, a diff.
    let hour = base - 17 * s + 3600 * s;
    crate::pyroscope_series::series_equal_windows(name, port, &windows, hour, hour + 3600 * s);
    // A diff of two selections from each window's sums equals `model::diff` of the windows.
    let side = |v: &str| -> Vec<Profile> {
        let mut w: Vec<Profile> = (windows.iter())
            .filter(|p| p.meta.labels["version"] == v)
            .cloned()
            .collect();
        w.sort_by_key(|p| p.meta.start_unix_ns);
        w
    };
    let want =
        serde_json::to_value(diff(&side("1.4"), &side("1.5"), &DiffOptions::default())).unwrap();
    let (status, got) = http_get(&format!("{url}/diff?a=version%3D1.4&b=version%3D1.5"));
    assert_eq!(status, 200, "{got}");
    let got: serde_json::Value = serde_json::from_str(&got).unwrap();
    assert_json_close("diff", &got, &want);
    // The raw window is still there, as sent.
    let (status, list) = http_get(&format!("{url}/windows?sel=host%3Dhost-a"));
    assert_eq!(status, 200);
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    let first = &list[0];
    let raw = download(&format!("{url}/windows/{}.phaseprof", first["id"]));
    let p = read_profile(&raw[..]).unwrap();
    assert_eq!(p.meta.start_unix_ns, first["start_ns"].as_u64().unwrap());
    assert_eq!(raw.len() as u64, first["bytes"].as_u64().unwrap());
}

// The store's sums over random windows equal `model::merge` of them: SQLite.
#[test]
fn store_sums_equal_merge_sqlite() {
    let dir = scratch("store-sums-sqlite-data");
    sums_equal_merge("SQLite", &["--data".into(), dir.display().to_string()]);
}

// The same on a real clickhouse-server (Debian's 18.16, installed by scripts/setup.sh), or on
// the one `PHASEPROF_TEST_CLICKHOUSE` names (a URL; with `PHASEPROF_TEST_CLICKHOUSE_TABLE`, e.g.
// Distributed tables over a cluster's shards, docs/fleet-store.md).
#[test]
fn store_sums_equal_merge_clickhouse() {
    if let Ok(url) = std::env::var("PHASEPROF_TEST_CLICKHOUSE") {
        let table = std::env::var("PHASEPROF_TEST_CLICKHOUSE_TABLE")
            .unwrap_or_else(|_| "phaseprof_windows".into());
        let args = [
            "--clickhouse".into(),
            url,
            "--clickhouse-table".into(),
            table,
        ];
        return sums_equal_merge("ClickHouse (given)", &args);
    }
    let Some(ch) = ClickHouse::start("store-sums-clickhouse") else {
        panic!("clickhouse-server is not installed: run scripts/setup.sh");
    };
    sums_equal_merge("ClickHouse", &["--clickhouse".into(), ch.url.clone()]);
}
