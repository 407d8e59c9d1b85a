//! Exactly once under faults: a fault-injecting proxy between the collector and a real
//! clickhouse-server fails each request of a window's batch in turn, refused (never arrives)
//! or answered and the answer dropped (ClickHouse did the work, the collector never learns
//! it), and the sender retries with the same Idempotency-Key as the agent does. The merged
//! view must count every window's writes once, phase totals too, and list each window once.
use std::io::BufReader;
use std::process::{Command, Stdio};

use phaseprof_e2e::*;
use phaseprof_model::*;

const TOKEN: &str = "store-faults-token-0123456789";

/// Window `i`: `10 + i` write(2) calls on one stack, `i + 1` cpu samples, one phase called
/// `i + 2` times. Every window shares its frames and stacks, so after the first one each
/// batch makes the same requests (no new dictionary rows).
fn window(i: u64, start: u64) -> Profile {
    let meta = Meta {
        pids: vec![100],
        comm: "node".into(),
        events: vec![EventKind::Cpu, EventKind::Syscall],
        frequency_hz: 99,
        start_unix_ns: start,
        end_unix_ns: start + 1_000_000_000,
        labels: [("host", "h"), ("service", "node")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Meta::default()
    };
    let mut b = ProfileBuilder::new(meta, vec![PHASE_NONE_NAME.into(), "commit".into()]);
    let f = b.intern_frame(Frame {
        function: "node::commit".into(),
        module: "node".into(),
        kind: FrameKind::User,
        inlined: false,
    });
    let s = b.intern_stack(vec![f]);
    let at = PhaseAt { phase: 1, mask: 3 };
    b.add_syscall((100, 100), at, 1, Some(s), 10 + i, 1000);
    b.add_cpu(100, 100, at, s, i + 1);
    *b.phase_stats_mut() = vec![
        PhaseStats::default(),
        PhaseStats {
            calls: i + 2,
            ..PhaseStats::default()
        },
    ];
    b.finish()
}

/// POSTs `p` under `key` until the collector stores it (at most 4 tries): what the agent does.
fn deliver(url: &str, key: &str, p: &Profile) -> usize {
    let mut body = Vec::new();
    write_profile(p, &mut body).unwrap();
    let headers = format!("Authorization: Bearer {TOKEN}\r\nIdempotency-Key: {key}\r\n");
    for attempt in 1..=4 {
        match try_http_request("POST", url, &headers, &body) {
            Ok((200 | 201, _)) => return attempt,
            Ok((status, text)) if status >= 500 || status == 408 => {
                eprintln!("{key}: attempt {attempt}: {status} {}", text.trim())
            }
            other => panic!("{key}: {other:?}"),
        }
    }
    panic!("{key}: not stored after 4 attempts");
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
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("h {TOKEN}\n")).unwrap();
    let port = free_port();
    let mut coll = Killed(
        Command::new(collector_bin())
            .args(["--listen", &format!("127.0.0.1:{port}"), "--tokens"])
            .arg(&tokens)
            .args(["--agent-rate", "1000", "--clickhouse", &proxy.url])
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
    // The collector says what failed: kept flowing (a closed pipe would fail its writes).
    std::thread::spawn(move || {
        for line in std::io::BufRead::lines(err).map_while(Result::ok) {
            eprintln!("collector: {line}");
        }
    });
    let url = format!("http://127.0.0.1:{port}/api/v1/windows");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let start = now - 3600 * 1_000_000_000;
    let mut sent = Vec::new();
    // The first window stores the dictionary; the second shows the requests of a batch.
    for i in 0..2 {
        let p = window(i, start + i * 1_000_000_000);
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
        let p = window(i, start + i * 1_000_000_000);
        proxy.arm(Some((k, fault)));
        let attempts = deliver(&url, &format!("w{i}"), &p);
        eprintln!("step {k} {fault:?}: stored after {attempts} attempt(s)");
        retried += attempts - 1;
        sent.push(p);
    }
    proxy.arm(None);
    assert!(retried > 0, "no fault made a retry: the proxy did nothing");
    let (status, merged) = http_get(&format!(
        "http://127.0.0.1:{port}/api/v1/merged?sel=host%3Dh"
    ));
    assert_eq!(status, 200, "{merged}");
    let m: serde_json::Value = serde_json::from_str(&merged).unwrap();
    let n = sent.len() as u64;
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
    drop(ch);
}
