//! Phases against validator-sim's ground truth: exact calls and flushes per phase, on-CPU and
//! off-CPU time and wall-time percentiles within tolerance, nesting inclusive.
use phaseprof_e2e::*;

use crate::require_root;

fn phase<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["phases"]
        .as_array()
        .expect("phases array")
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no phase `{name}` in {}", report["phases"]))
}

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

// Checks per-phase attribution against the truth: calls and flush_syscalls exact, finalize's
// off-CPU within 2% of the slept time, propose's CPU within 5% of the burned CPU, propose's
// wall p50 within 5% of its known 20 ms.
#[test]
fn phases_match_ground_truth() {
    require_root!();
    let _g = bpf_lock();
    let sim = rust_workload("validator-sim");
    let cfg = root().join("tests/workloads/validator-sim/phases.toml");
    let (out, truth) = record_workload(
        "phases",
        &["--phases", cfg.to_str().unwrap()],
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
            phase(&report, name)["calls"],
            truth["calls"][name],
            "{name} calls"
        );
    }
    let flushes = |name: &str| u(&phase(&report, name)["costs"]["flush_syscalls"]);
    assert_eq!(flushes("finalize"), u(&truth["flushes"]));
    assert_eq!(flushes("propose"), 0);
    assert_eq!(flushes("replay"), 0);
    // The truth line itself is the one write outside any phase.
    assert_eq!(flushes("(none)"), 1);

    let offcpu = phase(&report, "finalize")["offcpu_ns"].as_f64().unwrap();
    let slept = truth["slept_ns"].as_f64().unwrap();
    eprintln!(
        "finalize off-cpu {offcpu} vs slept {slept}: {:.2}%",
        100.0 * rel_diff(offcpu, slept)
    );
    assert!(rel_diff(offcpu, slept) < 0.02);

    let cpu = phase(&report, "propose")["cpu_ns"].as_f64().unwrap();
    let burned = truth["burn_cpu_ns"].as_f64().unwrap();
    eprintln!(
        "propose cpu {cpu} vs burned {burned}: {:.2}%",
        100.0 * rel_diff(cpu, burned)
    );
    assert!(rel_diff(cpu, burned) < 0.05);

    let p50 = phase(&report, "propose")["wall_ns"]["p50"]
        .as_f64()
        .unwrap();
    eprintln!(
        "propose wall p50 {p50} vs 20 ms: {:.2}%",
        100.0 * rel_diff(p50, 20e6)
    );
    assert!(rel_diff(p50, 20e6) < 0.05);
    assert_eq!(report["lost"]["events"], 0, "{}", report["lost"]);
}

// Checks nesting: `block` encloses propose and finalize, so its totals include theirs
// (inclusive), its calls are exact, and `--phase block` stacks include the nested burn function.
#[test]
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
        phase(&report, "block"),
        phase(&report, "propose"),
        phase(&report, "finalize"),
    );
    assert_eq!(block["calls"], truth["calls"]["block"]);
    assert_eq!(propose["calls"], truth["calls"]["propose"]);
    assert_eq!(
        u(&block["costs"]["flush_syscalls"]),
        u(&finalize["costs"]["flush_syscalls"])
    );
    assert_eq!(
        u(&finalize["costs"]["flush_syscalls"]),
        u(&truth["flushes"])
    );
    assert!(u(&block["cpu_ns"]) >= u(&propose["cpu_ns"]));
    assert!(u(&block["offcpu_ns"]) >= u(&finalize["offcpu_ns"]));
    assert!(u(&block["syscalls"]) >= u(&propose["syscalls"]) + u(&finalize["syscalls"]));
    assert!(
        u(&block["wall_ns"]["total"])
            >= u(&propose["wall_ns"]["total"]) + u(&finalize["wall_ns"]["total"])
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
// the closest function names, and that a function that exists only inlined is called so.
#[test]
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
        err.contains("closest names: validator_sim::phases::propose"),
        "{err}"
    );
    assert!(!dir.join("x.phaseprof").exists());

    // parse_args exists only inlined into main (just its closure has a symbol): say so.
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
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("`parse_args` appears in the binary but in no symbol"),
        "{err}"
    );
    assert!(err.contains("inlined copies cannot be probed"), "{err}");
}

// Checks a Go target: relay-sim runs 10,000 iterations under phase probes (exits probed on
// return instructions, since a uretprobe would corrupt the goroutine stacks verify grows) without
// crashing, with exact calls and flush_syscalls per phase.
#[test]
fn go_relay_phases_are_exact() {
    require_root!();
    let Some(bin) = go_workload("relay-sim") else {
        eprintln!("SKIPPED: Go is not installed");
        return;
    };
    let _g = bpf_lock();
    let cfg = root().join("tests/workloads/relay-sim/phases.toml");
    let (out, truth) = record_workload(
        "relay",
        &["--phases", cfg.to_str().unwrap()],
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
    assert_eq!(u(&truth["iterations"]), 10000, "relay-sim completed");
    let report = report_json(&out);
    for name in ["ingest", "verify", "commit", "fanout"] {
        assert_eq!(
            phase(&report, name)["calls"],
            truth["calls"][name],
            "{name} calls"
        );
    }
    let flushes = |name: &str| u(&phase(&report, name)["costs"]["flush_syscalls"]);
    assert_eq!(
        flushes("commit"),
        u(&truth["commit_writes"]) + u(&truth["fsyncs"])
    );
    assert_eq!(flushes("fanout"), u(&truth["fanout_flushes"]));
    assert_eq!(flushes("ingest") + flushes("verify"), 0);
    assert_eq!(report["lost"]["events"], 0, "{}", report["lost"]);
}
