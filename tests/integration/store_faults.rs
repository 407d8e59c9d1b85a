//! Exactly once under faults, in both stores. ClickHouse: a fault-injecting proxy between the
//! collector and a real clickhouse-server fails each request of a window's batch in turn,
//! refused (never arrives) or answered and the answer dropped (ClickHouse did the work, the
//! collector never learns it). SQLite: each statement of a batch's transaction fails in turn
//! (a trigger raising an error, put in the store's own file by another connection), and its
//! commit (the disk full). The sender retries with the same Idempotency-Key as the agent does.
//! The merged view must count every window's writes once, phase totals too, and list each
//! window once.
use std::io::BufReader;
use std::process::{Command, Stdio};

use phaseprof_e2e::*;
use phaseprof_model::*;

const TOKEN: &str = "store-faults-token-0123456789";

/// Window `i`: `10 + i` write(2) calls on one stack, `i + 1` cpu samples, one phase called
/// `i + 2` times. Unless `fresh`, every window shares its frames, stacks and labels, so after
/// the first one each batch makes the same requests (no new dictionary rows); a `fresh` one
/// has a function, module, label set and phase set of its own (a row in every dictionary table).
fn window(i: u64, start: u64, fresh: bool) -> Profile {
    let own = |name: &str| {
        if fresh {
            format!("{name}{i}")
        } else {
            name.to_string()
        }
    };
    let meta = Meta {
        pids: vec![100],
        comm: "node".into(),
        events: vec![EventKind::Cpu, EventKind::Syscall],
        frequency_hz: 99,
        start_unix_ns: start,
        end_unix_ns: start + 1_000_000_000,
        labels: [("host", "h".to_string()), ("service", own("node"))]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        ..Meta::default()
    };
    let mut phases = vec![PHASE_NONE_NAME.to_string(), "commit".into()];
    if fresh {
        phases.push(own("step"));
    }
    let mut b = ProfileBuilder::new(meta, phases.clone());
    let f = b.intern_frame(Frame {
        function: own("node::commit"),
        module: own("node"),
        kind: FrameKind::User,
        inlined: false,
    });
    let s = b.intern_stack(vec![f]);
    let at = PhaseAt {
        phase: 1,
        mask: if fresh { 7 } else { 3 },
    };
    b.add(
        Sample::new(SampleKind::Syscall, (100, 100), at, vec![10 + i, 1000])
            .on(Some(s))
            .syscall(1),
    );
    b.add(Sample::new(SampleKind::Cpu, (100, 100), at, vec![i + 1]).on(s));
    let mut stats = vec![
        PhaseStats::default(),
        PhaseStats {
            calls: i + 2,
            ..PhaseStats::default()
        },
    ];
    stats.resize(phases.len(), PhaseStats::default());
    *b.phase_stats_mut() = stats;
    b.finish()
}

/// POSTs `p` under `key` until the collector stores it (at most 4 tries): what the agent does.
fn deliver(url: &str, key: &str, p: &Profile) -> usize {
    deliver_mending(url, key, p, || ()).0
}

/// `deliver`, calling `mend` after each failed attempt: the attempts, and the last answer.
fn deliver_mending(url: &str, key: &str, p: &Profile, mut mend: impl FnMut()) -> (usize, String) {
    let mut body = Vec::new();
    write_profile(p, &mut body).unwrap();
    let headers = format!("Authorization: Bearer {TOKEN}\r\nIdempotency-Key: {key}\r\n");
    for attempt in 1..=4 {
        match try_http_request("POST", url, &headers, &body) {
            Ok((200 | 201, text)) => return (attempt, text),
            Ok((status, text)) if status >= 500 || status == 408 => {
                eprintln!("{key}: attempt {attempt}: {status} {}", text.trim());
                mend();
            }
            other => panic!("{key}: {other:?}"),
        }
    }
    panic!("{key}: not stored after 4 attempts");
}

/// A collector on a free port with `store` (its arguments), accepting host `h`: its port and
/// its guard. What it says keeps flowing to the test's output (a closed pipe would fail its
/// writes).
fn logged_collector(dir: &std::path::Path, store: &[&str]) -> (u16, Killed) {
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("h {TOKEN}\n")).unwrap();
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
    let mut err = BufReader::new(coll.0.stderr.take().unwrap());
    let mut line = String::new();
    while std::io::BufRead::read_line(&mut err, &mut line).unwrap() > 0 {
        eprint!("collector: {line}");
        if line.contains("listening on") {
            break;
        }
        line.clear();
    }
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(err).map_while(Result::ok) {
            eprintln!("collector: {line}");
        }
    });
    (port, coll)
}

/// Checks the merged view of host `h` against the `n` windows sent: writes, cpu samples and
/// commit calls equal their sums, and each window is listed once.
fn assert_merged_once(port: u16, n: u64) {
    let (status, merged) = http_get(&format!(
        "http://127.0.0.1:{port}/api/v1/merged?sel=host%3Dh"
    ));
    assert_eq!(status, 200, "{merged}");
    let m: serde_json::Value = serde_json::from_str(&merged).unwrap();
    let writes: u64 = (0..n).map(|i| 10 + i).sum();
    let samples: u64 = (0..n).map(|i| i + 1).sum();
    let calls: u64 = (0..n).map(|i| i + 2).sum();
    eprintln!(
        "{n} windows: writes {} (sent {writes}), cpu samples {} (sent {samples}), commit calls {} (sent {calls})",
        m["events"]["syscall"]["by_name"]["write"]["count"],
        m["events"]["cpu"]["samples"],
        phase_json(&m, "commit")["calls"],
    );
    assert_eq!(m["events"]["syscall"]["by_name"]["write"]["count"], writes);
    assert_eq!(m["events"]["cpu"]["samples"], samples);
    assert_eq!(phase_json(&m, "commit")["calls"], calls);
    let (status, list) = http_get(&format!(
        "http://127.0.0.1:{port}/api/v1/windows?sel=host%3Dh"
    ));
    assert_eq!(status, 200);
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    assert_eq!(list.as_array().unwrap().len() as u64, n, "{list}");
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

// Checks exactly-once storage on ClickHouse: every request of a batch failed once in each of
// the two ways, each window retried until stored; the merged writes, cpu samples and phase
// calls equal the sums over the windows sent, and each window is listed once.
#[test]
fn every_failed_step_of_a_clickhouse_batch_counts_once() {
    let Some(ch) = ClickHouse::start("store-faults") else {
        eprintln!("SKIPPED: clickhouse-server is not installed (scripts/setup.sh installs it)");
        return;
    };
    let upstream = ch
        .url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let proxy = FaultProxy::start(upstream);
    let dir = scratch("store-faults-collector");
    let (port, _coll) = logged_collector(&dir, &["--clickhouse", &proxy.url]);
    let url = format!("http://127.0.0.1:{port}/api/v1/windows");
    let start = now_ns() - 3600 * 1_000_000_000;
    let mut sent = Vec::new();
    // The first window stores the dictionary; the second shows the requests of a batch.
    for i in 0..2 {
        let p = window(i, start + i * 1_000_000_000, false);
        proxy.arm(None);
        assert_eq!(deliver(&url, &format!("w{i}"), &p), 1);
        sent.push(p);
    }
    let steps = proxy.log();
    eprintln!("a batch's requests:\n  {}", steps.join("\n  "));
    assert!(steps.len() >= 4, "{steps:?}");
    let mut retried = 0;
    for (k, fault) in (0..steps.len()).flat_map(|k| [(k, Fault::Refuse), (k, Fault::DropAnswer)]) {
        let i = sent.len() as u64;
        let p = window(i, start + i * 1_000_000_000, false);
        proxy.arm(Some((k, fault)));
        let attempts = deliver(&url, &format!("w{i}"), &p);
        eprintln!("step {k} {fault:?}: stored after {attempts} attempt(s)");
        retried += attempts - 1;
        sent.push(p);
    }
    proxy.arm(None);
    assert!(retried > 0, "no fault made a retry: the proxy did nothing");
    assert_merged_once(port, sent.len() as u64);
    drop(ch);
}

/// A tmpfs of `mib` MiB mounted at `dir` until dropped (lazily unmounted: whatever still has a
/// file open there).
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: std::path::PathBuf, mib: u32) -> Tmpfs {
        std::fs::create_dir_all(&dir).unwrap();
        let size = format!("size={mib}m");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &size, "tmpfs"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(ok.success(), "mounting a tmpfs at {}", dir.display());
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system of `dir` with `dir/filler` until it has no byte left.
fn fill(dir: &std::path::Path) {
    use std::io::Write;
    let mut f = std::fs::File::create(dir.join("filler")).unwrap();
    let block = vec![0u8; 64 << 10];
    while f.write_all(&block).is_ok() {}
    while f.write_all(&[0]).is_ok() {}
}

// Checks exactly-once storage on SQLite: each table a batch's transaction writes refuses its
// insert once (a trigger another connection put in the store's file), then its commit fails
// (the disk full); each window is retried until stored, one is sent again after it was
// stored (its answer lost), and the merged sums count every window once.
#[test]
fn every_failed_step_of_a_sqlite_transaction_counts_once() {
    if !is_root() {
        eprintln!("SKIPPED: mounting a tmpfs needs root");
        return;
    }
    let dir = scratch("store-faults-sqlite");
    // The guards' order: the collector is killed before its file system goes.
    let disk = Tmpfs::mount(dir.join("data"), 16);
    let (port, _coll) = logged_collector(&dir, &["--data", dir.join("data").to_str().unwrap()]);
    let url = format!("http://127.0.0.1:{port}/api/v1/windows");
    let start = now_ns() - 3600 * 1_000_000_000;
    let mut sent = vec![window(0, start, true)];
    assert_eq!(deliver(&url, "w0", &sent[0]), 1);
    let db = rusqlite::Connection::open(disk.0.join("windows.sqlite")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(10)).unwrap();
    let tables = [
        "labelsets",
        "functions",
        "mappings",
        "stacks",
        "phasesets",
        "windows",
        "bodies",
        "rollups",
    ];
    for table in tables {
        let i = sent.len() as u64;
        let p = window(i, start + i * 1_000_000_000, true);
        db.execute_batch(&format!(
            "CREATE TRIGGER fault BEFORE INSERT ON {table} \
             BEGIN SELECT RAISE(ABORT, 'injected fault in {table}'); END;"
        ))
        .unwrap();
        let mend = || db.execute_batch("DROP TRIGGER IF EXISTS fault").unwrap();
        let (attempts, _) = deliver_mending(&url, &format!("w{i}"), &p, mend);
        mend();
        eprintln!("insert into {table} failed: stored after {attempts} attempts");
        assert_eq!(attempts, 2, "the fault in {table} did not fail the batch");
        sent.push(p);
    }
    // The commit: its pages go to the write-ahead log at commit, on a full disk.
    let i = sent.len() as u64;
    let p = window(i, start + i * 1_000_000_000, true);
    fill(&disk.0);
    let mend = || {
        let _ = std::fs::remove_file(disk.0.join("filler"));
    };
    let (attempts, _) = deliver_mending(&url, &format!("w{i}"), &p, mend);
    mend();
    eprintln!("commit on a full disk failed: stored after {attempts} attempts");
    assert_eq!(attempts, 2, "a full disk did not fail the commit");
    // Stored, its answer lost: the sender sends it again.
    let (attempts, answer) = deliver_mending(&url, &format!("w{i}"), &p, || ());
    assert_eq!(attempts, 1);
    assert!(answer.contains("\"duplicate\":true"), "{answer}");
    sent.push(p);
    assert_merged_once(port, sent.len() as u64);
    // The dictionary rows of the failed transactions were written again by their retries.
    let body = crate::store_sums::download(&format!(
        "http://127.0.0.1:{port}/api/v1/merged.phaseprof?sel=host%3Dh"
    ));
    let merged = read_profile(&mut &body[..]).unwrap();
    for i in 0..sent.len() {
        let named =
            |f: &Frame| f.function == format!("node::commit{i}") && f.module == format!("node{i}");
        assert!(
            merged.frames.iter().any(named),
            "window {i}'s frame is not named"
        );
        assert!(
            merged.phases.contains(&format!("step{i}")),
            "window {i}'s phase is not named"
        );
    }
}
