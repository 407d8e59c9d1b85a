//! Phases against validator-sim's ground truth: exact calls and flushes per phase, on-CPU and
//! off-CPU time and wall-time percentiles within tolerance, nesting inclusive.
use phaseprof_e2e::*;

use crate::require_root;

// Checks per-phase attribution against the truth: calls and flush_syscalls exact, finalize's
// off-CPU within 2% of the slept time, propose's CPU within 5% of the burned CPU, propose's
// wall p50 within 5% of its known 20 ms.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn phases_match_ground_truth() {
    require_root!();
    let _g = bpf_lock();
    let sim = rust_workload("validator-sim");
    let (out, truth) = record_with_phases(
        "phases",
        "validator-sim",
        &[],
        &sim,
        &[
            "--blocks",
            "30",
            "--burn-ms",
            "20",
            "--flushes",
            "5",
            "--sleep-ms",
            "15",
            "--clone-bytes",
            "4096",
        ],
    );
    let report = report_json(&out);
    for name in ["propose", "replay", "finalize"] {
        assert_eq!(
            phase_json(&report, name)["calls"],
            truth["calls"][name],
            "{name} calls"
        );
    }
    let flushes = |name: &str| num(&phase_json(&report, name)["costs"]["flush_syscalls"]);
    assert_eq!(flushes("finalize"), num(&truth["flushes"]));
    assert_eq!(flushes("propose"), 0);
    assert_eq!(flushes("replay"), 0);
    // The truth line itself is the one write outside any phase.
    assert_eq!(flushes("(none)"), 1);
    // Every syscall of a phase, exactly: finalize's flushes and one clock_nanosleep per block;
    // burn_cpu reads its thread's CPU clock twice (no vDSO for that clock); replay's 4 KiB
    // clone makes none. No probe-made syscall (uretprobe) among them.
    let syscalls = |name: &str| num(&phase_json(&report, name)["syscalls"]);
    let blocks = num(&truth["blocks"]);
    assert_eq!(syscalls("finalize"), num(&truth["flushes"]) + blocks);
    assert_eq!(syscalls("propose"), 2 * blocks);
    assert_eq!(syscalls("replay"), 0);
    assert!(report["events"]["syscall"]["by_name"]
        .get("uretprobe")
        .is_none());
    // Nor counted as in flight when recording began (a uretprobe syscall leaves as number -1).
    assert_eq!(report["lost"]["syscalls_in_flight_at_start"], 0);

    let finalize = phase_json(&report, "finalize");
    let offcpu = finalize["offcpu_ns"].as_f64().unwrap();
    let cpu_wait = finalize["cpu_wait_ns"].as_f64().unwrap();
    assert_offcpu_covers_sleep(offcpu, cpu_wait, &truth);
    assert_offcpu_misses_nothing(offcpu_totals(&report).0, &truth);

    let cpu = phase_json(&report, "propose")["cpu_ns"].as_f64().unwrap();
    let burned = truth["burn_cpu_ns"].as_f64().unwrap();
    eprintln!(
        "propose cpu {cpu} vs burned {burned}: {:.2}%",
        100.0 * rel_diff(cpu, burned)
    );
    assert!(rel_diff(cpu, burned) < 0.05);

    // Wall time against like things: a call burns 20 ms of CPU, so its median wall time is at
    // least that (more when other work holds the CPUs), and a phase's wall time is its on-CPU
    // plus its off-CPU time (one thread; the sched_switch accounting is independent of the
    // entry and return probes that time the calls).
    let propose = phase_json(&report, "propose");
    let num = |k: &str| propose[k].as_f64().unwrap();
    let p50 = propose["wall_ns"]["p50"].as_f64().unwrap();
    let wall = propose["wall_ns"]["total"].as_f64().unwrap();
    let (on, off) = (num("cpu_ns"), num("offcpu_ns"));
    eprintln!(
        "propose wall p50 {p50} vs 20 ms burned; wall {wall} vs cpu + off-cpu {}: {:.2}%",
        on + off,
        100.0 * rel_diff(wall, on + off)
    );
    assert!(p50 >= 0.95 * 20e6, "{p50}");
    assert!(rel_diff(wall, on + off) < 0.05);
    assert_eq!(report["lost"]["events"], 0, "{}", report["lost"]);
}

// Checks nesting: `block` encloses propose and finalize, so its totals include theirs
// (inclusive), its calls are exact, and `--phase block` stacks include the nested burn function.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn nested_phases_are_inclusive() {
    require_root!();
    let _g = bpf_lock();
    let sim = rust_workload("validator-sim");
    let cfg = root().join("tests/workloads/validator-sim/phases-nested.toml");
    let (out, truth) = record_workload(
        "nested",
        &["--phases", cfg.to_str().unwrap()],
        &sim,
        &[
            "--blocks",
            "12",
            "--burn-ms",
            "15",
            "--flushes",
            "3",
            "--sleep-ms",
            "10",
        ],
    );
    let report = report_json(&out);
    let (block, propose, finalize) = (
        phase_json(&report, "block"),
        phase_json(&report, "propose"),
        phase_json(&report, "finalize"),
    );
    assert_eq!(block["calls"], truth["calls"]["block"]);
    assert_eq!(propose["calls"], truth["calls"]["propose"]);
    assert_eq!(
        num(&block["costs"]["flush_syscalls"]),
        num(&finalize["costs"]["flush_syscalls"])
    );
    assert_eq!(
        num(&finalize["costs"]["flush_syscalls"]),
        num(&truth["flushes"])
    );
    assert!(num(&block["cpu_ns"]) >= num(&propose["cpu_ns"]));
    assert!(num(&block["offcpu_ns"]) >= num(&finalize["offcpu_ns"]));
    assert!(num(&block["syscalls"]) >= num(&propose["syscalls"]) + num(&finalize["syscalls"]));
    assert!(
        num(&block["wall_ns"]["total"])
            >= num(&propose["wall_ns"]["total"]) + num(&finalize["wall_ns"]["total"])
    );
    // Stacks: `--phase block` includes the samples taken while the nested propose ran: every
    // burn-function sample is inside propose, hence inside block.
    let burn_fn = truth["burn_fn"].as_str().unwrap();
    let (in_block, burning_in_block) =
        folded_cpu_share_in_phase(&out, "block", |s| s.contains(burn_fn));
    let (in_propose, burning_in_propose) =
        folded_cpu_share_in_phase(&out, "propose", |s| s.contains(burn_fn));
    eprintln!("block: {burning_in_block}/{in_block} samples burning; propose: {burning_in_propose}/{in_propose}");
    assert!(burning_in_propose > 0);
    assert_eq!(burning_in_block, burning_in_propose);
    assert!(in_block >= in_propose);
}

// Checks that a function glob matching nothing fails before recording, naming file, line and
// the closest function names, and that a function that exists only inlined is probed there.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn unknown_phase_function_suggests_near_names() {
    require_root!();
    let sim = rust_workload("validator-sim");
    let dir = scratch("badphase");
    let cfg = dir.join("phases.toml");
    std::fs::write(
        &cfg,
        "[[phase]]\nname = \"propose\"\nfunction = \"validator_sim::phases::propse\"\n",
    )
    .unwrap();
    let o = phaseprof(&[
        "record",
        "--phases",
        cfg.to_str().unwrap(),
        "-o",
        dir.join("x.phaseprof").to_str().unwrap(),
        "--",
        sim.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains(&format!("{}:1: phase `propose`", cfg.display())),
        "{err}"
    );
    assert!(
        err.contains("matches no function; closest: validator_sim::phases::propose"),
        "{err}"
    );
    assert!(!dir.join("x.phaseprof").exists());

    // parse_args exists only inlined into main (just its closure has a symbol): probed at its
    // inlined copy, its one call counted.
    std::fs::write(
        &cfg,
        "[[phase]]\nname = \"args\"\nfunction = \"validator_sim::parse_args\"\n",
    )
    .unwrap();
    let out = dir.join("x.phaseprof");
    let o = phaseprof(&[
        "record",
        "--phases",
        cfg.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--",
        sim.to_str().unwrap(),
        "--blocks",
        "2",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("phase `args`: 1 inlined copy probed (in validator_sim::main)"),
        "{err}"
    );
    let report = report_json(&out);
    assert_eq!(phase_json(&report, "args")["calls"], 1);
    assert_eq!(
        report["lost"]["phases_complete"], true,
        "{}",
        report["lost"]
    );
}

// Checks a Go target: relay-sim runs 10,000 iterations under phase probes (exits probed on
// return instructions, since a uretprobe would corrupt the goroutine stacks verify grows) without
// crashing, its loop free to migrate between OS threads, with exact calls and flush_syscalls per
// phase and phases reported complete.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn go_relay_phases_are_exact() {
    require_root!();
    let Some(bin) = go_workload("relay-sim") else {
        eprintln!("SKIPPED: Go is not installed");
        return;
    };
    let _g = bpf_lock();
    let (out, truth) = record_with_phases(
        "relay",
        "relay-sim",
        &[],
        &bin,
        &[
            "-iterations",
            "10000",
            "-subscribers",
            "3",
            "-depth",
            "3000",
        ],
    );
    assert_eq!(num(&truth["iterations"]), 10000, "relay-sim completed");
    let report = report_json(&out);
    for name in ["ingest", "verify", "commit", "fanout"] {
        assert_eq!(
            phase_json(&report, name)["calls"],
            truth["calls"][name],
            "{name} calls"
        );
    }
    let flushes = |name: &str| num(&phase_json(&report, name)["costs"]["flush_syscalls"]);
    assert_eq!(
        flushes("commit"),
        num(&truth["commit_writes"]) + num(&truth["fsyncs"])
    );
    assert_eq!(flushes("fanout"), num(&truth["fanout_flushes"]));
    assert_eq!(flushes("ingest") + flushes("verify"), 0);
    assert_eq!(report["lost"]["events"], 0, "{}", report["lost"]);
    assert_eq!(
        report["lost"]["phases_complete"], true,
        "{}",
        report["lost"]
    );
}

// Checks goroutine phases: goroutines-sim runs 8 goroutines per round on GOMAXPROCS 2 (fresh
// goroutines each round, so persist's recursion grows and moves their stacks), nothing locked to
// a thread. Calls of the nested phases and their writes (2 per persist) are exact, and await's
// goroutine wait (blocked in a channel receive) is within 2% of the time the program measured
// around the receive, while its thread off-CPU time stays apart.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn go_goroutine_phases_are_exact() {
    require_root!();
    let Some(bin) = go_workload("goroutines-sim") else {
        eprintln!("SKIPPED: Go is not installed");
        return;
    };
    let _g = bpf_lock();
    let (out, truth) = record_with_phases(
        "goroutines",
        "goroutines-sim",
        &[],
        &bin,
        &[
            "-goroutines",
            "8",
            "-rounds",
            "10",
            "-calls",
            "50",
            "-wait",
            "2ms",
        ],
    );
    assert!(num(&truth["gomaxprocs"]) >= 2);
    assert_eq!(
        num(&truth["calls"]["handle"]),
        4000,
        "goroutines-sim completed"
    );
    let report = report_json(&out);
    for name in ["handle", "persist", "await"] {
        assert_eq!(
            phase_json(&report, name)["calls"],
            truth["calls"][name],
            "{name} calls"
        );
    }
    let flushes = |name: &str| num(&phase_json(&report, name)["costs"]["flush_syscalls"]);
    assert_eq!(flushes("persist"), num(&truth["writes"]));
    assert_eq!(
        flushes("handle"),
        num(&truth["writes"]),
        "nesting is inclusive"
    );
    assert_eq!(flushes("await"), 0);
    let gowait = num(&phase_json(&report, "await")["gowait_ns"]) as f64;
    let waited = num(&truth["waited_ns"]) as f64;
    eprintln!(
        "await goroutine wait {gowait} vs measured {waited}: {:.2}%",
        100.0 * rel_diff(gowait, waited)
    );
    assert!(rel_diff(gowait, waited) < 0.02);
    // Parked goroutines are not thread off-CPU time.
    assert!(num(&phase_json(&report, "await")["offcpu_ns"]) as f64 <= 0.1 * waited);
    assert_eq!(report["lost"]["events"], 0, "{}", report["lost"]);
    assert_eq!(
        report["lost"]["phases_complete"], true,
        "{}",
        report["lost"]
    );
}

// Checks native phases under uretprobes (whose trampoline enters the kernel through syscall
// 335 since Linux 6.11): every syscall count of phase-syscalls equals `strace -f -c` (no
// `uretprobe`, no `syscall_335`), and each phase's syscalls are exact: 700 getppid per call in
// ask_parent and in work (which encloses it), none in the pure computation digest.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn phase_probes_add_no_syscalls() {
    require_root!();
    let _g = bpf_lock();
    let bin = c_workload("phase-syscalls", "", &[]);
    let dir = scratch("phase-syscalls");
    let st = dir.join("strace.txt");
    let status = std::process::Command::new("strace")
        .args(["-f", "-c", "-o", st.to_str().unwrap()])
        .arg(&bin)
        .args(["6", "700"])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("strace is installed by the setup");
    assert!(status.success());
    let expected = strace_counts(&std::fs::read_to_string(&st).unwrap());
    assert_eq!(expected.get("getppid"), Some(&4200), "{expected:?}");

    let (out, truth) =
        record_with_phases("phase-syscalls", "phase-syscalls", &[], &bin, &["6", "700"]);
    let report = report_json(&out);
    let mut ours: std::collections::BTreeMap<String, u64> = report["events"]["syscall"]["by_name"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), num(&v["count"])))
        .collect();
    assert_eq!(ours.remove("exit_group"), Some(1));
    assert_eq!(ours, expected);
    let syscalls = |name: &str| num(&phase_json(&report, name)["syscalls"]);
    assert_eq!(syscalls("ask_parent"), num(&truth["getppid"]));
    assert_eq!(syscalls("work"), num(&truth["getppid"]));
    assert_eq!(syscalls("digest"), 0);
    for name in ["work", "ask_parent", "digest"] {
        assert_eq!(
            phase_json(&report, name)["calls"],
            truth["calls"],
            "{name} calls"
        );
    }
    assert_eq!(
        report["lost"]["phases_complete"], true,
        "{}",
        report["lost"]
    );
}

// Checks that phase numbers are never called exact when they are not: attached by pid to
// goroutines-sim while its goroutines are inside phases, the returns of calls entered before
// the probes went in are seen without their entries, and the report, its JSON and the web page
// say the phases are INCOMPLETE, by how much and why.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn attaching_mid_phase_says_phases_are_incomplete() {
    require_root!();
    let Some(bin) = go_workload("goroutines-sim") else {
        eprintln!("SKIPPED: Go is not installed");
        return;
    };
    let _g = bpf_lock();
    let mut target = std::process::Command::new(&bin)
        .args(["-rounds", "40", "-wait", "2ms"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(400));
    let cfg = root().join("tests/workloads/goroutines-sim/phases.toml");
    let out = scratch("midphase").join("mid.phaseprof");
    phaseprof_ok(&[
        "record",
        "--pid",
        &target.id().to_string(),
        "--duration",
        "1s",
        "--phases",
        cfg.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ]);
    target.wait().unwrap();
    let report = report_json(&out);
    let lost = &report["lost"];
    assert_eq!(lost["phases_complete"], false, "{lost}");
    let before = num(&lost["phase_issues"]["phase_exits_before_start"]);
    assert!(before >= 1, "{lost}");
    let text = phaseprof_ok(&["report", out.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&text.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("phases: "))
        .unwrap_or_default();
    assert!(
        line.starts_with("phases: INCOMPLETE: ")
            && line.contains(&format!(
                "{before} calls already running when recording began"
            )),
        "{line}"
    );
    assert!(text.contains("== phases (INCOMPLETE"), "{text}");

    let mut server = std::process::Command::new(phaseprof_bin())
        .args(["serve", out.to_str().unwrap(), "--listen", "127.0.0.1:0"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(server.stderr.take().unwrap());
    let url = served_url(&mut stderr);
    let (_, list) = http_get(&format!("{url}/api/profiles"));
    let list: serde_json::Value = serde_json::from_str(&list).unwrap();
    let id = list[0]["id"].as_str().unwrap().to_string();
    let (status, page) = http_get(&format!("{url}/profile/{id}"));
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(status, 200);
    assert!(
        page.contains("id=\"phase-completeness\">phases: INCOMPLETE: "),
        "the page does not say the phases are incomplete"
    );
}
