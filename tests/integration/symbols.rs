//! Symbolization of targets in other languages.

use phaseprof_e2e::*;

use crate::require_root;

// Checks that a Go binary with symbols resolves to Go names: the burn function, under the Go
// runtime's entry frames, takes ≥90% of the samples of the main goroutine's path. The workload
// burns 800 ms of its own CPU time (~79 samples at 99 Hz however busy the machine is).
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn go_frames_have_go_names() {
    require_root!();
    let Some(bin) = go_workload("go-spin") else {
        eprintln!("SKIPPED: Go is not installed");
        return;
    };
    let _g = bpf_lock();
    let (out, truth) = record_workload("gospin", &[], &bin, &["800"]);
    let burn_fn = truth["burn_fn"].as_str().unwrap();
    // Only the main goroutine's work counts: runtime threads (sysmon, GC workers) have no
    // main.main frame and may take samples when the machine is busy.
    let (_, main_path) = folded_cpu_share(&out, |stack| stack.contains("runtime.main;main.main"));
    let (_, hot) = folded_cpu_share(&out, |stack| {
        stack.contains("runtime.main;main.main;") && stack.split(';').any(|f| f == burn_fn)
    });
    eprintln!("{hot}/{main_path} samples of main.main in {burn_fn}");
    assert!(
        main_path >= 50 && hot as f64 >= 0.9 * main_path as f64,
        "{hot}/{main_path}"
    );
}
