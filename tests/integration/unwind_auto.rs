//! `--unwind auto`: each module walked its own way (frame pointers where it keeps them, its
//! unwind tables where it does not), in one walk.

use phaseprof_e2e::*;

use crate::require_root;
use crate::unwind::{assert_whole_stacks, entry_share_by_event, how_walked, reaches_entry};

// Checks `auto` on a Go binary: Go keeps frame pointers (after its stack-bound check, which the
// census must look past), so its stacks are walked by frame pointers.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn auto_keeps_frame_pointers_for_go() {
    require_root!();
    let Some(bin) = go_workload("go-spin") else {
        eprintln!("SKIPPED: Go is not installed");
        return;
    };
    let _g = bpf_lock();
    let (file, _) = record_workload("unwind-go", &["--events", "cpu"], &bin, &["100"]);
    let how = how_walked(&file, 0);
    eprintln!("go-spin: {how}");
    assert!(how.starts_with("fp (auto"), "{how}");
}

// Checks the default `--unwind auto` on a C program built with frame pointers whose waits and
// syscalls start in Debian's libc (built without them): walked per module, the program by frame
// pointers and libc from its tables in one walk, at least 95% of its off-CPU time and syscalls
// have stacks that reach the thread's entry through the program's own callers (the sleeps under
// `pause_briefly`, the writes under `flush_records`); `report -v` says how each module was
// walked and why.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn auto_walks_each_module_its_own_way() {
    require_root!();
    let fp_flags = [
        "-lpthread",
        "-fno-omit-frame-pointer",
        "-fno-optimize-sibling-calls",
    ];
    let bin = c_workload("libc-sim", "-fp", &fp_flags);
    let _g = bpf_lock();
    // Default options.
    let (file, truth) = record_workload("libc-auto-fp", &[], &bin, &["2", "200", "20"]);
    let how = how_walked(&file, 0);
    let shares = entry_share_by_event(&file, &["offcpu", "syscall"]);
    eprintln!("libc-sim with frame pointers, {how}: {shares:?}");
    assert!(
        how.starts_with("dwarf (auto: per module; the program keeps"),
        "{how}"
    );
    assert_whole_stacks(&file, &shares);
    let has = |s: &str, f: &str| s.split(';').any(|x| x == f);
    let worker = |s: &str| reaches_entry(s) && has(s, "worker") && has(s, "round_once");
    // The workers block only in their sleeps (time waiting for a CPU has a leaf of its own).
    let blocked = |s: &str| worker(s) && !has(s, "[cpu wait]");
    let (_, blocked_ns) = folded_event_share(&file, "offcpu", blocked);
    let (_, slept_ns) =
        folded_event_share(&file, "offcpu", |s| blocked(s) && has(s, "pause_briefly"));
    eprintln!("workers blocked {blocked_ns} ns, {slept_ns} ns under pause_briefly");
    assert!(slept_ns as f64 >= 0.95 * blocked_ns as f64);
    // Syscall stacks are sampled by default: counts by stack are estimates (2%).
    let (_, writes) =
        folded_event_share(&file, "syscall", |s| worker(s) && has(s, "flush_records"));
    let truth_writes = truth["writes"].as_f64().unwrap();
    assert!(
        rel_diff(writes as f64, truth_writes) <= 0.02,
        "{writes} writes of {truth_writes}"
    );
    let verbose = phaseprof_ok(&["report", "-v", file.to_str().unwrap()]).stdout;
    let verbose = String::from_utf8_lossy(&verbose);
    let modules: Vec<&str> = verbose
        .lines()
        .filter(|l| l.starts_with("stacks: module "))
        .collect();
    let module = |name: &str| {
        modules
            .iter()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("no {name} in {modules:?}"))
            .to_string()
    };
    assert!(
        module("libc-sim-fp: fp (").contains("keep frame pointers"),
        "{modules:?}"
    );
    assert!(
        module("libc.so.6: dwarf (").contains("keep frame pointers"),
        "{modules:?}"
    );
}
