//! `diff` with replicated runs of validator-sim: a real change is judged improved with an
//! interval that excludes zero; runs of the same build are never judged changed.
use std::path::PathBuf;

use phaseprof_e2e::*;

use crate::require_root;

/// One run: long enough (~0.3 s of work) that the recording's fixed start (tables going in at
/// the program's exec and entry) does not dominate its per-second rates on a loaded machine.
fn run(name: &str, flushes: &str) -> PathBuf {
    record_sim_with_phases(
        name,
        &["--blocks", "60", "--burn-ms", "5", "--flushes", flushes],
    )
}

fn runs(name: &str, flushes: &str, n: usize) -> Vec<PathBuf> {
    (0..n)
        .map(|i| run(&format!("{name}-{i}"), flushes))
        .collect()
}

/// `n` runs per side recorded alternately in ABBA order, as a benchmark should be: a machine that
/// drifts (caches warming, a neighbour's load) then affects both sides alike, and so does
/// whatever the run just before leaves behind (B is not always the second of a pair).
fn alternating(a: (&str, &str), b: (&str, &str), n: usize) -> (Vec<PathBuf>, Vec<PathBuf>) {
    (0..n)
        .map(|i| {
            let run_a = || run(&format!("{}-{i}", a.0), a.1);
            let run_b = || run(&format!("{}-{i}", b.0), b.1);
            if i % 2 == 0 {
                let ra = run_a();
                (ra, run_b())
            } else {
                let rb = run_b();
                (run_a(), rb)
            }
        })
        .unzip()
}

fn diff_json(a: &[PathBuf], b: &[PathBuf]) -> serde_json::Value {
    let mut args: Vec<&str> = vec!["diff"];
    args.extend(a.iter().map(|p| p.to_str().unwrap()));
    args.push("--vs");
    args.extend(b.iter().map(|p| p.to_str().unwrap()));
    args.push("--json");
    serde_json::from_slice(&phaseprof_ok(&args).stdout).expect("diff --json is JSON")
}

fn metric<'a>(r: &'a serde_json::Value, phase: &str, name: &str) -> &'a serde_json::Value {
    r["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["phase"] == phase && m["metric"] == name)
        .unwrap_or_else(|| panic!("no {phase}/{name} in the diff"))
}

// Checks 5 runs with 100 flushes per block against 5 with 25: flush_syscalls improved (per
// finalize call and in total) with an interval excluding zero; and 5 runs against 5 of the same
// build, recorded alternately: no metric judged improved or regressed. (Recorded one batch after
// the other, a drifting machine made `duration_ns` look "improved" once: a real difference
// between the batches, which is why runs alternate.)
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn replicated_diff_verdicts() {
    require_root!();
    let _g = bpf_lock();
    let (a, b) = alternating(("diff-a", "100"), ("diff-b", "25"), 5);
    let r = diff_json(&a, &b);
    for phase in ["finalize", "(total)"] {
        let m = metric(&r, phase, "flush_syscalls");
        eprintln!("{phase} flush_syscalls: {}", m);
        assert_eq!(m["verdict"], "improved", "{m}");
        assert!(m["diff"]["high"].as_f64().unwrap() < 0.0, "{m}");
    }
    let (a, same) = alternating(("diff-a2", "100"), ("diff-same", "100"), 5);
    let r = diff_json(&a, &same);
    let claimed: Vec<String> = r["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["verdict"] == "improved" || m["verdict"] == "regressed")
        .map(|m| format!("{}/{}: {}", m["phase"], m["metric"], m["verdict"]))
        .collect();
    let verdicts: Vec<String> = r["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{}/{} {} {}",
                m["phase"], m["metric"], m["verdict"], m["diff"]
            )
        })
        .collect();
    eprintln!("same build: {verdicts:?}");
    assert!(claimed.is_empty(), "same build judged changed: {claimed:?}");
}

// Checks `diff -o` writes a differential flamegraph and an HTML page with the verdict table.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn diff_writes_svg_and_html() {
    require_root!();
    let _g = bpf_lock();
    let a = runs("diff-one-a", "40", 1);
    let b = runs("diff-one-b", "10", 1);
    let dir = scratch("diff-out");
    for (file, needle) in [("d.svg", "red: grew"), ("d.html", "id=\"verdicts\"")] {
        let out = dir.join(file);
        phaseprof_ok(&[
            "diff",
            a[0].to_str().unwrap(),
            "--vs",
            b[0].to_str().unwrap(),
            "--event",
            "syscall",
            "-o",
            out.to_str().unwrap(),
        ]);
        let text = std::fs::read_to_string(&out).unwrap();
        assert!(text.contains(needle), "{file} lacks {needle}");
        assert!(
            text.contains("syscall:write"),
            "{file} lacks the write stacks"
        );
    }
}

// Checks 3 runs against 3 with finalize's sleep doubled (5 ms → 10 ms a block): finalize's wall
// time per call judged `regressed` (over its calls: method `calls`), with units in the text
// (`ms`, never `1.0e7`) and a warning when one side is a different program.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn doubled_phase_wall_time_over_3_runs_is_regressed() {
    require_root!();
    let _g = bpf_lock();
    let sleep = |name: &str, ms: &str| {
        record_sim_with_phases(
            name,
            &[
                "--blocks",
                "20",
                "--burn-ms",
                "2",
                "--flushes",
                "3",
                "--sleep-ms",
                ms,
            ],
        )
    };
    let (a, b): (Vec<PathBuf>, Vec<PathBuf>) = (0..3)
        .map(|i| {
            (
                sleep(&format!("wall-a-{i}"), "5"),
                sleep(&format!("wall-b-{i}"), "10"),
            )
        })
        .unzip();
    let r = diff_json(&a, &b);
    let wall = metric(&r, "finalize", "wall_ns");
    eprintln!("finalize wall_ns: {wall}");
    assert_eq!(wall["verdict"], "regressed", "{wall}");
    assert_eq!(wall["diff"]["method"], "calls", "{wall}");
    assert_eq!(wall["unit"], "ns");
    let rel = wall["relative"].as_f64().unwrap();
    assert!((0.8..1.2).contains(&rel), "doubled: {rel}");
    assert!(
        r["warnings"].as_array().unwrap().is_empty(),
        "{}",
        r["warnings"]
    );

    let mut args: Vec<&str> = vec!["diff"];
    args.extend(a.iter().map(|p| p.to_str().unwrap()));
    args.push("--vs");
    args.extend(b.iter().map(|p| p.to_str().unwrap()));
    let text = String::from_utf8(phaseprof_ok(&args).stdout).unwrap();
    let row = text
        .lines()
        .find(|l| l.starts_with("finalize") && l.contains("wall_ns"))
        .expect("a finalize wall_ns row");
    assert!(row.contains(" ms") && row.contains("regressed"), "{row}");
    assert!(!text.contains("e6") && !text.contains("e7"), "{text}");

    // A recording of another program on the B side is called out.
    let other = scratch("wall-other").join("true.phaseprof");
    phaseprof_ok(&["record", "-o", other.to_str().unwrap(), "--", "true"]);
    let r = diff_json(&a[..1], &[other]);
    let warnings = r["warnings"].to_string();
    assert!(warnings.contains("different programs"), "{warnings}");
    assert!(
        warnings.contains("recorded with phases and B without"),
        "{warnings}"
    );
}
