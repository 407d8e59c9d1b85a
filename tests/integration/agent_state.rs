//! The fleet agent's state stays bounded while targets keep making new call paths: stacks are
//! recycled per window, losses of every kind (stacks included) are in `/metrics`.
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use phaseprof_e2e::*;

use crate::fleet::{agent, by_name, merged, sqlite_collector, Transport};
use crate::require_root;

const TOKEN: &str = "agent-c-token-0123456789";

/// The `chains` workload (tests/workloads/chains): random call chains 4 to 8 deep.
pub(crate) fn chains() -> std::path::PathBuf {
    c_workload(
        "chains",
        "",
        &["-fno-omit-frame-pointer", "-fno-optimize-sibling-calls"],
    )
}

/// Runs an agent (labelled `host-c`, config lines `extra`) recording `target` (waiting on
/// stdin, named `name`) until it ends; returns the target's truth and the agent's /metrics
/// once the last windows reached the collector, then stops the agent (SIGTERM).
fn run_agent_on(
    dir: &std::path::Path,
    (port, metrics_port): (u16, u16),
    target: &mut Killed,
    name: &str,
    extra: &str,
) -> (serde_json::Value, String) {
    let t = Transport::Http;
    let (mut a, mut err) = agent(
        &t,
        dir,
        "c",
        (port, metrics_port),
        TOKEN,
        "host-c",
        name,
        extra,
    );
    let recording = format!("recording pid {}", target.0.id());
    let line = read_until(&mut err, &recording);
    assert!(line.contains(&recording), "the agent did not start: {line}");
    // The agent's stderr from here on, to say why it is gone if it is.
    let said = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut rest);
        rest
    });
    writeln!(target.0.stdin.take().unwrap()).unwrap();
    let out = std::mem::replace(&mut target.0, Command::new("true").spawn().unwrap())
        .wait_with_output()
        .unwrap();
    // The last windows reach the collector.
    std::thread::sleep(Duration::from_secs(3));
    let url = format!("http://127.0.0.1:{metrics_port}/metrics");
    let (status, metrics) = match try_http_request("GET", &url, "", b"") {
        Ok(got) => got,
        Err(e) => {
            let exit = a.0.try_wait();
            // SAFETY: signalling a child we spawned (so that its stderr ends).
            unsafe { libc::kill(a.0.id() as i32, libc::SIGKILL) };
            let said = said.join().unwrap_or_default();
            let lines: Vec<&str> = said.lines().collect();
            let tail = lines[lines.len().saturating_sub(30)..].join("\n");
            panic!("GET {url}: {e}; the agent: {exit:?}, its last words:\n{tail}");
        }
    };
    assert_eq!(status, 200);
    // SAFETY: signalling a child we spawned.
    unsafe { libc::kill(a.0.id() as i32, libc::SIGTERM) };
    assert!(a.0.wait().unwrap().success());
    (truth_from(&out.stdout), metrics)
}

/// validator-sim (`args`, held until the agent records it) under an agent (`extra`: agent.toml
/// lines) pushing to a SQLite collector as host-c: the collector's port and guard, and the
/// workload's truth.
fn validator_sim_with_agent(
    name: &str,
    args: &[&str],
    extra: &str,
) -> (u16, Killed, serde_json::Value) {
    let dir = scratch(name);
    let (port, coll) = sqlite_collector(&dir, "host-c", TOKEN);
    let mut target = Killed(
        Command::new(rust_workload("validator-sim"))
            .arg("--wait-stdin")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (truth, _) = run_agent_on(
        &dir,
        (port, free_port()),
        &mut target,
        "validator-sim",
        extra,
    );
    (port, coll, truth)
}

/// The value of metric `line` (its name and labels) in a /metrics text.
fn metric(metrics: &str, line: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(line)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `{line}` in\n{metrics}"))
}

// Checks that an agent whose kernel stack map holds 1,024 stacks keeps every stack of a target
// that makes ~10,000 distinct call paths (30 s of 300 random chains a second, each sleeping and
// making two syscalls at its leaf (glibc sleeps with clock_nanosleep)): the merged view has no stack lost and the exact syscall counts
// of the workload's truth; /metrics says no stack was lost, the map stayed under its size and
// entries were recycled.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn agent_keeps_taking_stacks_past_its_map_size() {
    require_root!();
    let _g = bpf_lock();
    let dir = scratch("agent-state");
    let (port, _coll) = sqlite_collector(&dir, "host-c", TOKEN);
    let mut target = Killed(
        Command::new(chains())
            .args(["30", "300", "wait"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let metrics_port = free_port();
    let t = Transport::Http;
    let (truth, metrics) = run_agent_on(
        &dir,
        (port, metrics_port),
        &mut target,
        "chains",
        // Every switch-out's stack: each chain's sleep is an off-CPU path never seen before.
        "stack_entries = 1024\noffcpu_stacks = \"all\"\n",
    );
    let m = merged(&t, port, "host-c");
    eprintln!(
        "getppid {} (truth {}), nanosleep {} (truth {}), lost {}",
        by_name(&m, "getppid"),
        truth["getppid"],
        by_name(&m, "clock_nanosleep"),
        truth["nanosleep"],
        m["lost"]
    );
    eprintln!(
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("stack") || l.contains("lost") || l.contains("resident"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(by_name(&m, "getppid"), num(&truth["getppid"]));
    assert_eq!(by_name(&m, "clock_nanosleep"), num(&truth["nanosleep"]));
    assert_eq!(m["lost"]["stacks"], 0, "{}", m["lost"]);
    assert_eq!(m["lost"]["events"], 0, "{}", m["lost"]);
    assert_eq!(metric(&metrics, "phaseprof_agent_lost_stacks_total"), 0.0);
    assert_eq!(
        metric(
            &metrics,
            "phaseprof_agent_lost_total{reason=\"user_stack\"}"
        ),
        0.0
    );
    // Two maps (process context, cpu-clock interrupt) of 1,024 each.
    assert!(metric(&metrics, "phaseprof_agent_stack_map_entries") < 2048.0);
    assert!(metric(&metrics, "phaseprof_agent_stacks_recycled_total") > 1024.0);
    // The off-CPU stacks alone: one distinct path per chain, far more than the map holds.
    assert!(num(&truth["chains"]) > 4 * 1024);
}

// Checks allocation events in the agent (`events = [..., "alloc"]`, no budget: probes always
// attached): in the collector's merged view, validator-sim's `replay` phase allocated and freed
// exactly its clones (the workload's counting allocator is the truth), once per call.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn agent_allocation_totals_per_phase_are_exact() {
    require_root!();
    let _g = bpf_lock();
    let (port, _coll, truth) = validator_sim_with_agent(
        "agent-alloc",
        &[
            "--blocks",
            "60",
            "--threads",
            "2",
            "--clone-bytes",
            "1000000",
            "--sleep-ms",
            "20",
        ],
        "events = [\"cpu\", \"syscall\", \"alloc\"]\n",
    );
    let t = Transport::Http;
    let m = merged(&t, port, "host-c");
    let replay = phase_json(&m, "replay");
    eprintln!(
        "replay: {} bytes in {} allocations, {} frees (truth: {} bytes, {} calls); alloc {}",
        replay["alloc_bytes"],
        replay["allocs"],
        replay["frees"],
        truth["clone_bytes"],
        truth["calls"]["replay"],
        m["events"]["alloc"]
    );
    assert_eq!(num(&replay["alloc_bytes"]), num(&truth["clone_bytes"]));
    assert_eq!(num(&replay["allocs"]), num(&truth["calls"]["replay"]));
    assert_eq!(num(&replay["frees"]), num(&truth["calls"]["replay"]));
    assert_eq!(m["lost"]["events"], 0, "{}", m["lost"]);
}

// Checks the agent's allocation budget: with `alloc_budget = "2%"` (the probes cost validator-sim
// ~8% here while attached: 100 small allocations per 4-ms block) the allocator probes are
// attached for part of the run, every window says so with its budget, and the merged `replay`
// allocations, extrapolated window by window from the targets' own CPU time, estimate the
// workload's truth. An estimate: printed, and held to a third of the truth (the estimator's
// accuracy where probes dominate the CPU is a matter of its own).
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn agent_allocation_budget_estimates_per_phase() {
    require_root!();
    let _g = bpf_lock();
    let (port, _coll, truth) = validator_sim_with_agent(
        "agent-alloc-budget",
        &[
            "--blocks",
            "800",
            "--threads",
            "2",
            "--burn-ms",
            "4",
            "--small-allocs",
            "100",
            "--sleep-ms",
            "5",
        ],
        "events = [\"cpu\", \"alloc\"]\nalloc_budget = \"2%\"\n",
    );
    let t = Transport::Http;
    let m = merged(&t, port, "host-c");
    let replay = phase_json(&m, "replay");
    let calls = num(&truth["calls"]["replay"]);
    let (true_allocs, true_bytes) = (calls * 100, calls * 100 * 64);
    let (allocs, bytes) = (num(&replay["allocs"]), num(&replay["alloc_bytes"]));
    let (status, list) = http_get(&format!(
        "http://127.0.0.1:{port}/api/v1/windows?sel=host%3Dhost-c"
    ));
    assert_eq!(status, 200);
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    let mut fractions = Vec::new();
    for w in list.as_array().unwrap() {
        let body = crate::store_sums::download(&format!(
            "http://127.0.0.1:{port}/api/v1/windows/{}",
            w["id"]
        ));
        let p = phaseprof_model::read_profile(&mut &body[..]).unwrap();
        let info = p
            .meta
            .alloc
            .expect("every window says how allocations were taken");
        assert_eq!(info.budget, Some(0.02));
        fractions.push(info.attached_fraction);
    }
    let attached = fractions.iter().sum::<f64>() / fractions.len() as f64;
    eprintln!(
        "replay: {allocs} allocations, {bytes} bytes (truth {true_allocs}, {true_bytes}: {:.3}x); probes attached {:.1}% of {} windows",
        allocs as f64 / true_allocs as f64,
        attached * 100.0,
        fractions.len()
    );
    assert!(
        attached < 0.9,
        "the budget left the probes attached: {fractions:?}"
    );
    // The merged view says so: an estimate, attached that share of the time.
    let alloc = &m["events"]["alloc"];
    assert_eq!(alloc["exact"], false, "{alloc}");
    assert!(
        alloc["attached_fraction"].as_f64().unwrap() < 0.9,
        "{alloc}"
    );
    let ratio = allocs as f64 / true_allocs as f64;
    assert!((0.67..1.5).contains(&ratio), "{allocs} vs {true_allocs}");
    let ratio = bytes as f64 / true_bytes as f64;
    assert!((0.67..1.5).contains(&ratio), "{bytes} vs {true_bytes}");
}

// Checks the agent's phase budget window by window on blocks of ~10 µs, each making 10 writes,
// that the phase probes slow ~70%: every stored window says how its phases were taken, every
// window the target worked in has phase totals (its slices', or the last slices' rates where
// none fell in it), and the merged calls of each phase land within 10% of the workload's truth
// (extrapolated by the writes in and out of slices, thousands of blocks a slice).
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn agent_phase_budget_estimates_per_window() {
    require_root!();
    let _g = bpf_lock();
    let (port, _coll, truth) = validator_sim_with_agent(
        "agent-phase-budget",
        &[
            "--blocks",
            "300000",
            "--burn-ms",
            "0",
            "--flushes",
            "10",
            "--sleep-ms",
            "0",
            "--flush-to",
            "/dev/null",
        ],
        "phase_budget = \"5%\"\n",
    );
    let t = Transport::Http;
    let m = merged(&t, port, "host-c");
    let (status, list) = http_get(&format!(
        "http://127.0.0.1:{port}/api/v1/windows?sel=host%3Dhost-c"
    ));
    assert_eq!(status, 200);
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    for w in list.as_array().unwrap() {
        let body = crate::store_sums::download(&format!(
            "http://127.0.0.1:{port}/api/v1/windows/{}",
            w["id"]
        ));
        let p = phaseprof_model::read_profile(&mut &body[..]).unwrap();
        let info = (p.meta.phase_budget).expect("every window says how its phases were taken");
        assert_eq!(info.budget, 0.05);
        // A window the target worked in has totals, from its own slices or carried from the
        // last ones.
        let calls: u64 = p.phase_stats.iter().map(|s| s.calls).sum();
        assert!(
            info.syscalls == 0 || calls > 0,
            "window {} made {} {} and has no phase totals: {info:?}",
            w["id"],
            info.syscalls,
            info.syscall
        );
    }
    eprintln!("merged phase budget: {}", m["phase_budget"]);
    for name in ["propose", "replay", "finalize"] {
        let calls = num(&phase_json(&m, name)["calls"]) as f64;
        let want = num(&truth["calls"][name]) as f64;
        eprintln!("{name}: {calls} calls (truth {want})");
        assert!(
            (calls / want - 1.0).abs() < 0.10,
            "{name}: {calls} calls against {want}"
        );
    }
}

/// validator-sim writing once per block (4,000,000 blocks, a write every few µs) under an agent
/// with the budgets `extra`: its writes in the merged view, in `finalize` (the phase that makes
/// them), the truth, and the merged syscall budget.
fn writes_under_budgets(name: &str, extra: &str) -> (f64, f64, f64, serde_json::Value) {
    let (port, _coll, truth) = validator_sim_with_agent(
        name,
        &[
            "--blocks",
            "4000000",
            "--burn-ms",
            "0",
            "--flushes",
            "1",
            "--sleep-ms",
            "0",
        ],
        extra,
    );
    let m = merged(&Transport::Http, port, "host-c");
    let budget = m["syscall_budget"].clone();
    let want = num(&truth["write_syscalls"]) as f64;
    let writes = by_name(&m, "write") as f64;
    let finalize = num(&phase_json(&m, "finalize")["syscalls"]) as f64;
    eprintln!("writes {writes}, in finalize {finalize} (truth {want}); syscall budget {budget}; phase budget {}", m["phase_budget"]);
    assert_eq!(budget["estimated"], true, "{budget}");
    assert!(
        (writes / want - 1.0).abs() < 0.05,
        "{writes} writes against {want}"
    );
    (writes, finalize, want, m)
}

// Checks the agent's syscall budget with exact phases: windows count syscalls in slices, the
// merged view says its totals are estimated, and the writes (in all and in `finalize`) land
// within 5% of the workload's own count.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn agent_syscall_budget_estimates_writes() {
    require_root!();
    let _g = bpf_lock();
    let (_, finalize, want, m) =
        writes_under_budgets("agent-syscall-budget", "syscall_budget = \"1%\"\n");
    let budget = &m["syscall_budget"];
    assert!(num(&budget["slices"]) > 1, "{budget}");
    assert!(
        (finalize / want - 1.0).abs() < 0.05,
        "{finalize} in finalize against {want}"
    );
}

// Checks the agent's defaults, both budgets: the syscall programs are in force through every
// phase slice, so `finalize`'s writes are estimated with its other totals (within 10%, as the
// phase budget's calls are), and the writes in all from the syscalls' own slices (within 5%).
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn agent_phase_and_syscall_budgets_together() {
    require_root!();
    let _g = bpf_lock();
    let extra = "phase_budget = \"1%\"\nsyscall_budget = \"1%\"\n";
    let (_, finalize, want, m) = writes_under_budgets("agent-both-budgets", extra);
    assert_eq!(
        m["phase_budget"]["estimated"], true,
        "{}",
        m["phase_budget"]
    );
    assert!(
        (finalize / want - 1.0).abs() < 0.10,
        "{finalize} in finalize against {want}"
    );
}
