//! Phases under `record -- CMD` when the command is a wrapper (`env`, `timeout`, `nice`,
//! `sh -c`): they resolve in the program the command's tree execs that defines them.

use phaseprof_e2e::*;

use crate::require_root;

// Checks `record --phases … -- env FOO=1 timeout 60 nice validator-sim …`: env execs timeout,
// which forks a child that execs nice, which execs validator-sim; the phases resolve there (and
// say so), every call counted as the workload's truth says, complete. A command whose programs
// never define them (`sh -c true`) records all the same and warns.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn phases_follow_exec_through_wrappers() {
    require_root!();
    let sim = rust_workload("validator-sim");
    let _g = bpf_lock();
    let phases = root().join("tests/workloads/validator-sim/phases.toml");
    let out = scratch("phases-exec").join("wrapped.phaseprof");
    let sim_args = ["--blocks", "12", "--sleep-ms", "2", "--flushes", "3"];
    let mut args = vec!["record", "--phases", phases.to_str().unwrap(), "-o"];
    args.push(out.to_str().unwrap());
    args.extend(["--", "env", "FOO=1", "timeout", "60", "nice"]);
    args.push(sim.to_str().unwrap());
    args.extend(sim_args);
    let o = phaseprof_ok(&args);
    let err = String::from_utf8_lossy(&o.stderr);
    let truth = truth_from(&o.stdout);
    assert!(
        err.contains(&format!("resolved in {}", sim.display())),
        "{err}"
    );
    let report = report_json(&out);
    for name in ["propose", "replay", "finalize"] {
        assert_eq!(
            phase_json(&report, name)["calls"],
            truth["calls"][name],
            "{name}"
        );
    }
    assert_eq!(
        report["lost"]["phases_complete"], true,
        "{}",
        report["lost"]
    );

    let out = scratch("phases-exec-none").join("none.phaseprof");
    let o = phaseprof_ok(&[
        "record",
        "--phases",
        phases.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "true",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("warning: no program the command ran defines the phases"),
        "{err}"
    );
    assert!(out.exists());
}
