//! Symbolization of targets in other languages.

use phaseprof_e2e::*;

use crate::require_root;

// Checks that a Go binary with symbols resolves to Go names: the burn function takes ≥90% of
// the samples and the Go runtime's entry frames appear above it.
#[test]
fn go_frames_have_go_names() {
    require_root!();
    let Some(bin) = go_workload("go-spin") else {
        eprintln!("SKIPPED: Go is not installed");
        return;
    };
    let _g = bpf_lock();
    let dir = scratch("gospin");
    let out = dir.join("go.phaseprof");
    let o = phaseprof_ok(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--",
        bin.to_str().unwrap(),
        "800",
    ]);
    let truth = truth_from(&o.stdout);
    let folded = phaseprof_ok(&[
        "export",
        out.to_str().unwrap(),
        "--format",
        "folded",
        "-o",
        "-",
    ]);
    let folded = String::from_utf8(folded.stdout).unwrap();
    let (mut total, mut hot) = (0u64, 0u64);
    for line in folded.lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        total += n;
        if stack.ends_with(truth["burn_fn"].as_str().unwrap()) {
            hot += n;
            assert!(
                stack.contains("runtime.main;main.main;"),
                "Go caller frames missing: {stack}"
            );
        }
    }
    eprintln!("{hot}/{total} samples in main.spinHot");
    assert!(
        total >= 50 && hot as f64 >= 0.9 * total as f64,
        "{hot}/{total}"
    );
}
