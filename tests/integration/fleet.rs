//! The fleet: two agents (different `host` labels) push windows of two workloads to a
//! collector on 127.0.0.1; the collector is killed for 30 s and restarted; nothing is lost.
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use phaseprof_e2e::*;

use crate::require_root;

const TOKEN_A: &str = "agent-a-token-0123456789";
const TOKEN_B: &str = "agent-b-token-0123456789";

/// A collector on `port` storing with `store` (`--data DIR` or `--clickhouse URL`), killed
/// when dropped.
pub(crate) fn collector(port: u16, store: &[String], tokens: &Path) -> Killed {
    let mut c = Command::new(collector_bin())
        .args([
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--tokens",
            tokens.to_str().unwrap(),
        ])
        .args(store)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(c.stderr.take().unwrap());
    read_until(&mut err, "listening on");
    Killed(c)
}

/// A collector on a free port storing in SQLite under `dir`, accepting agent `host` with
/// `token`: its port and its guard.
pub(crate) fn sqlite_collector(dir: &Path, host: &str, token: &str) -> (u16, Killed) {
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("{host} {token}\n")).unwrap();
    let port = free_port();
    let store = ["--data".to_string(), dir.join("data").display().to_string()];
    (port, collector(port, &store, &tokens))
}

/// An agent (killed when dropped) pushing to the collector on `port`, serving its metrics on
/// `metrics_port`; `extra`: more agent.toml lines. The target's phases file is used if it has
/// one.
#[allow(clippy::too_many_arguments)]
pub(crate) fn agent(
    t: &Transport,
    dir: &Path,
    name: &str,
    ports: (u16, u16),
    token: &str,
    host: &str,
    target: &str,
    extra: &str,
) -> (Killed, std::io::BufReader<std::process::ChildStderr>) {
    let mut cmd = agent_command(t, dir, name, ports, token, host, target, extra);
    spawn_agent(&mut cmd)
}

/// Starts the agent `cmd` (killed when dropped), its stderr piped.
pub(crate) fn spawn_agent(
    cmd: &mut Command,
) -> (Killed, std::io::BufReader<std::process::ChildStderr>) {
    let mut a = cmd.stderr(Stdio::piped()).spawn().unwrap();
    let err = std::io::BufReader::new(a.stderr.take().unwrap());
    (Killed(a), err)
}

/// `agent`'s command, its agent.toml written, not started.
#[allow(clippy::too_many_arguments)]
pub(crate) fn agent_command(
    t: &Transport,
    dir: &Path,
    name: &str,
    (port, metrics_port): (u16, u16),
    token: &str,
    host: &str,
    target: &str,
    extra: &str,
) -> Command {
    let cfg = dir.join(format!("{name}.toml"));
    let phases = root()
        .join("tests/workloads")
        .join(target)
        .join("phases.toml");
    let phases = if phases.exists() {
        format!("phases = \"{}\"\n", phases.display())
    } else {
        String::new()
    };
    // The tests compare phase and syscall totals with the workloads' truth: exact phases and
    // syscalls, unless a test asks for the agent's default budget (or another) itself.
    let mut extra = extra.to_string();
    for budget in ["phase_budget", "syscall_budget"] {
        if !extra.contains(budget) {
            extra = format!("{budget} = \"exact\"\n{extra}");
        }
    }
    std::fs::write(
        &cfg,
        format!(
            "collector = \"{}\"\n{}token = \"{token}\"\nwindow = \"1s\"\n{extra}\
             spool_dir = \"{}\"\nmetrics_listen = \"127.0.0.1:{metrics_port}\"\n[labels]\nhost = \"{host}\"\nservice = \"{target}\"\n\
             [[target]]\nname = \"{target}\"\n{phases}",
            t.url(port),
            t.agent_config(),
            dir.join(format!("{name}-spool")).display(),
        ),
    )
    .unwrap();
    let mut cmd = Command::new(phaseprof_bin());
    cmd.args(["agent", "--config", cfg.to_str().unwrap()]);
    cmd
}

/// How agents and the test reach the collector: plain HTTP, or HTTPS trusting a private CA.
#[derive(Clone)]
pub(crate) enum Transport {
    Http,
    Https { ca: PathBuf },
}

impl Transport {
    fn url(&self, port: u16) -> String {
        match self {
            Transport::Http => format!("http://127.0.0.1:{port}"),
            Transport::Https { .. } => format!("https://127.0.0.1:{port}"),
        }
    }

    fn get(&self, url: &str) -> (u16, String) {
        match self {
            Transport::Http => http_get(url),
            Transport::Https { ca } => https_get(url, ca),
        }
    }

    /// The agent.toml line trusting the CA.
    fn agent_config(&self) -> String {
        match self {
            Transport::Http => String::new(),
            Transport::Https { ca } => format!("ca_file = \"{}\"\n", ca.display()),
        }
    }
}

pub(crate) fn merged(t: &Transport, port: u16, host: &str) -> serde_json::Value {
    let (status, body) = t.get(&format!("{}/api/v1/merged?sel=host%3D{host}", t.url(port)));
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

pub(crate) fn by_name(m: &serde_json::Value, name: &str) -> u64 {
    m["events"]["syscall"]["by_name"][name]["count"]
        .as_u64()
        .unwrap_or(0)
}

// Checks that two agents' windows reach the collector labelled by host, that the merged view
// per host equals the workloads' ground truth exactly (validator-sim's writes, relay-sim's
// fsyncs), and that killing the collector for 30 s and restarting it loses no window: the
// agents spool and deliver afterwards, dropping nothing; each target has its own phases file and
// the calls per phase are exact too. Embedded SQLite store.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn two_agents_and_a_collector_outage() {
    require_root!();
    let dir = scratch("fleet");
    let data = dir.join("data").display().to_string();
    two_agents_and_an_outage(&dir, &["--data".into(), data], &Transport::Http);
}

// The same against a real clickhouse-server (Debian's, installed by scripts/setup.sh) on
// 127.0.0.1: the collector restarted after the outage finds everything stored before it. Agents
// push over HTTPS here (the collector's rustls listener, a private CA in the agents' ca_file).
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn two_agents_and_a_collector_outage_clickhouse() {
    require_root!();
    let Some(ch) = ClickHouse::start("fleet-clickhouse-server") else {
        panic!("clickhouse-server is not installed: run scripts/setup.sh");
    };
    let dir = scratch("fleet-clickhouse");
    let (ca, cert, key) = tls_files(&dir);
    let store = [
        "--clickhouse".into(),
        ch.url.clone(),
        "--tls-cert".into(),
        cert.display().to_string(),
        "--tls-key".into(),
        key.display().to_string(),
    ];
    two_agents_and_an_outage(&dir, &store, &Transport::Https { ca });
}

fn two_agents_and_an_outage(dir: &Path, store: &[String], t: &Transport) {
    let Some(relay) = go_workload("relay-sim") else {
        eprintln!("SKIPPED: no Go toolchain");
        return;
    };
    let _g = bpf_lock();
    let sim = rust_workload("validator-sim");
    let tokens = dir.join("tokens");
    std::fs::write(&tokens, format!("host-a {TOKEN_A}\nhost-b {TOKEN_B}\n")).unwrap();
    let port = free_port();
    let coll = collector(port, store, &tokens);

    let mut va = Command::new(&sim)
        .args([
            "--wait-stdin",
            "--blocks",
            "120",
            "--flushes",
            "5",
            "--sleep-ms",
            "40",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut rb = Command::new(&relay)
        .args(["-wait-stdin", "-iterations", "400"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let metrics_a = free_port();
    let (mut agent_a, mut err_a) = agent(
        t,
        dir,
        "a",
        (port, metrics_a),
        TOKEN_A,
        "host-a",
        "validator-sim",
        "",
    );
    let (mut agent_b, mut err_b) = agent(
        t,
        dir,
        "b",
        (port, free_port()),
        TOKEN_B,
        "host-b",
        "relay-sim",
        "",
    );
    read_until(&mut err_a, &format!("recording pid {}", va.id()));
    read_until(&mut err_b, &format!("recording pid {}", rb.id()));
    // Both targets are recorded: let them run.
    writeln!(va.stdin.take().unwrap()).unwrap();
    writeln!(rb.stdin.take().unwrap()).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    drop(coll);
    std::thread::sleep(Duration::from_secs(30));
    let coll = collector(port, store, &tokens);
    let truth_a = truth_from(&va.wait_with_output().unwrap().stdout);
    let truth_b = truth_from(&rb.wait_with_output().unwrap().stdout);
    std::thread::sleep(Duration::from_secs(2));
    // Every phase call of the finished workload has been counted in a window by now: the
    // agent's /metrics says two probe hits (entry, exit) per call.
    let (status, metrics) = http_get(&format!("http://127.0.0.1:{metrics_a}/metrics"));
    assert_eq!(status, 200);
    let metric = |line: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(line)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no `{line}` in\n{metrics}"))
    };
    let calls: u64 = ["propose", "replay", "finalize"]
        .iter()
        .map(|n| num(&truth_a["calls"][n]))
        .sum();
    assert_eq!(
        metric("phaseprof_agent_probe_hits_total{probe=\"phase\"}"),
        2.0 * calls as f64
    );
    let overhead = metric("phaseprof_agent_estimated_overhead");
    assert!((0.0..1.0).contains(&overhead), "{overhead}");
    assert!(metric("phaseprof_agent_windows_sent_total") > 0.0);
    for a in [&agent_a, &agent_b] {
        // SAFETY: signalling children we spawned.
        unsafe { libc::kill(a.0.id() as i32, libc::SIGTERM) };
    }
    let mut logs = String::new();
    for (a, err) in [(&mut agent_a, &mut err_a), (&mut agent_b, &mut err_b)] {
        assert!(a.0.wait().unwrap().success());
        for line in err.lines() {
            logs += &line.unwrap();
            logs.push('\n');
        }
    }
    eprintln!("{logs}");
    assert!(logs.contains("spooling windows"), "the outage was noticed");
    assert!(!logs.contains("the collector refused"), "no window refused");
    let a = merged(t, port, "host-a");
    let b = merged(t, port, "host-b");
    eprintln!(
        "host-a writes {} (truth {}), host-b fsyncs {} (truth {})",
        by_name(&a, "write"),
        truth_a["write_syscalls"],
        by_name(&b, "fsync"),
        truth_b["fsyncs"]
    );
    assert_eq!(
        by_name(&a, "write"),
        truth_a["write_syscalls"].as_u64().unwrap()
    );
    assert_eq!(by_name(&b, "fsync"), truth_b["fsyncs"].as_u64().unwrap());
    // Each target's own phases file: calls per phase exact on both hosts.
    for (m, truth, names) in [
        (&a, &truth_a, &["propose", "replay", "finalize"][..]),
        (&b, &truth_b, &["ingest", "verify", "commit", "fanout"][..]),
    ] {
        for name in names {
            assert_eq!(
                phase_json(m, name)["calls"],
                truth["calls"][name],
                "{} {name}",
                m["labels"]["host"]
            );
        }
    }
    assert_eq!(a["labels"]["host"], "host-a");
    assert_eq!(b["labels"]["service"], "relay-sim");
    assert_eq!(a["lost"]["events"], 0);
    // The same merge through the collector's pages: the index offers the hosts in its label
    // pickers, and the selection's profile (its JSON) counts the same writes.
    let (status, index) = t.get(&format!("{}/", t.url(port)));
    assert_eq!(status, 200, "{index}");
    assert!(index.contains("<option>host-b</option>"), "{index}");
    let (status, page) = t.get(&format!("{}/api/profiles/host%3Dhost-a%407d", t.url(port)));
    assert_eq!(status, 200, "{page}");
    let page: serde_json::Value = serde_json::from_str(&page).unwrap();
    assert_eq!(by_name(&page, "write"), by_name(&a, "write"));
    drop(coll);
}
