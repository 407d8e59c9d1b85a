//! The kernel matrix's checks: `scripts/kernels/matrix.sh` runs this module (with
//! `phases::go_goroutine_phases_are_exact` and `exactness::syscall_counts_equal_strace`) on this
//! kernel and inside Debian's stock 5.10, 6.1 and 6.12 booted under qemu's software emulation.
//! Each compares phaseprof's numbers with the workload's own truth, exactly where the kernel
//! allows it, and compares like with like so that a slow, emulated machine changes nothing: the
//! guest reads its programs over 9p, so a page fault there can block for milliseconds, and only
//! the off-CPU time spent in the sleep is compared with the time slept. On a kernel that cannot
//! run a part, phaseprof refuses it in one line, and the matrix shows that line.
use phaseprof_e2e::*;

use crate::require_root;

const WORKLOAD: [&str; 8] = [
    "--blocks",
    "25",
    "--flushes",
    "13",
    "--sleep-ms",
    "20",
    "--burn-ms",
    "4",
];

/// No event lost: every count is whole. A stack can be lost now and then on 5.10 and 6.1 (their
/// stack maps refuse an update at times; see allocation_totals_exact): counted, and printed.
fn assert_nothing_lost(report: &serde_json::Value) {
    assert_eq!(report["lost"]["events"], 0, "lost: {}", report["lost"]);
    eprintln!("stacks lost: {}", report["lost"]["stacks"]);
}

// Checks the default events on `record -- CMD`: write(2) count exactly the truth, the off-CPU
// time in the sleep's stacks never above the slept time (+2%) and at least 85% of it (the slept
// time also holds the sleep syscall's own CPU work around the switch: ~0.4 ms a call under
// emulation, several times that when the host deschedules the guest's vCPUs), cpu samples taken,
// nothing lost, and the kernel and its features recorded. Off-CPU stacks are sampled by default:
// the time the report says had no stack of its own (`total_ns - with_stack_ns`) was spread over
// the sampled stacks by estimate, so either bound moves by at most that much (under emulation a
// 9p page fault blocks for milliseconds, and on 5.10 a burst of them got unsampled time onto the
// sleep's stacks: 3.8% over).
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn syscalls_exact_and_offcpu_equals_sleep() {
    require_root!();
    let _g = bpf_lock();
    let sim = rust_workload("validator-sim");
    let (out, truth) = record_workload("k-default", &[], &sim, &WORKLOAD);
    let report = report_json(&out);
    assert_eq!(
        report["events"]["syscall"]["by_name"]["write"]["count"],
        truth["write_syscalls"]
    );
    let (_, in_sleep) = folded_event_share(&out, "offcpu", |s| s.contains("nanosleep"));
    let slept = truth["slept_ns"].as_f64().unwrap();
    let offcpu = &report["events"]["offcpu"];
    let spread = offcpu["total_ns"].as_u64().unwrap() - offcpu["with_stack_ns"].as_u64().unwrap();
    let ratio = in_sleep as f64 / slept;
    eprintln!(
        "off-cpu in the sleep {in_sleep} ns vs slept {slept} ns: {ratio:.4}; \
         spread by estimate: {spread} ns"
    );
    let (low, high) = (0.85 * slept - spread as f64, 1.02 * slept + spread as f64);
    assert!(
        (low..=high).contains(&(in_sleep as f64)),
        "off-cpu in the sleep {in_sleep} ns vs slept {slept} ns, {spread} ns spread by estimate"
    );
    assert!(report["events"]["cpu"]["samples"].as_u64().unwrap_or(0) > 0);
    assert_nothing_lost(&report);
    let target = &report["target"];
    assert!(!target["kernel"].as_str().unwrap_or("").is_empty());
    assert_eq!(target["kernel_features"]["ringbuf"], "yes", "{target}");
}

// Checks cpu sampling: the samples with the burn function on their stack against what the
// workload's own burned CPU time calls for at the rate asked: never more (+10%), at least half
// (a guest's clocks run on while the host deschedules its vCPUs, which its sampling timer
// cannot see; its slow program loading adds samples outside the burn, so the burn is compared
// with the burn, not with the whole run).
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn cpu_samples_in_the_burn_function() {
    require_root!();
    let _g = bpf_lock();
    let sim = rust_workload("validator-sim");
    let args = ["--blocks", "8", "--burn-ms", "200"];
    let (out, truth) = record_workload("k-burn", &["--freq", "199"], &sim, &args);
    let burn_fn = truth["burn_fn"].as_str().unwrap();
    let (total, burning) = folded_cpu_share(&out, |s| s.split(';').any(|f| f == burn_fn));
    let expected = truth["burn_cpu_ns"].as_f64().unwrap() / 1e9 * 199.0;
    eprintln!("{burning}/{total} samples in {burn_fn}; the burned CPU calls for {expected:.0}");
    let ratio = burning as f64 / expected;
    assert!(
        (0.5..=1.1).contains(&ratio),
        "{burning} samples in the burn for {expected:.0}"
    );
    assert_nothing_lost(&report_json(&out));
}

// Checks native phases (uprobes and uretprobes on the Rust workload's functions): calls per
// phase and the flushes counted in finalize exactly the truth, every entry matched.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn native_phases_exact() {
    require_root!();
    let _g = bpf_lock();
    let sim = rust_workload("validator-sim");
    let (out, truth) = record_with_phases("k-phases", "validator-sim", &[], &sim, &WORKLOAD);
    let report = report_json(&out);
    for name in ["propose", "replay", "finalize"] {
        let calls = &phase_json(&report, name)["calls"];
        assert_eq!(calls, &truth["calls"][name], "{name} calls");
    }
    let flushes = &phase_json(&report, "finalize")["costs"]["flush_syscalls"];
    assert_eq!(flushes, &truth["flushes"]);
    assert_eq!(
        report["lost"]["phases_complete"], true,
        "{}",
        report["lost"]
    );
    assert_nothing_lost(&report);
}

// Checks allocations with every one sampled: bytes within 0.1% of the workload's own count (the
// C library's own allocations are not in it) and nothing the totals rely on lost (their map, the
// threads' state). A sampled stack was lost now and then on 5.10 and 6.1 (1 to 3 of ~160: the
// stack maps refused an update, likely EBUSY from a preempted program holding the bucket on the
// same CPU; not confirmed): counted in `lost`, and not part of the totals.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn allocation_totals_exact() {
    require_root!();
    let _g = bpf_lock();
    let sim = rust_workload("validator-sim");
    let opts = ["--events", "alloc", "--alloc-sample-bytes", "1"];
    let args = [
        "--blocks",
        "50",
        "--threads",
        "2",
        "--clone-bytes",
        "100000",
    ];
    let (out, truth) = record_workload("k-alloc", &opts, &sim, &args);
    let report = report_json(&out);
    let alloc = &report["events"]["alloc"];
    let bytes = alloc["bytes"].as_f64().unwrap_or(0.0);
    let truth_bytes = truth["alloc_bytes"].as_f64().unwrap();
    eprintln!("alloc bytes {bytes} vs truth {truth_bytes}; {alloc}");
    assert!(
        rel_diff(bytes, truth_bytes) < 0.001,
        "{bytes} vs {truth_bytes}"
    );
    let lost = &report["lost"]["by_reason"];
    assert_eq!(lost["alloc_totals_full"], 0, "{lost}");
    assert_eq!(lost["alloc_thread_state"], 0, "{lost}");
}

// Checks --unwind dwarf on the workload built without frame pointers: at least 95% of cpu
// samples reach the thread's entry by name (the walker's own counts are printed beside):
// 99.9% on this machine's kernel, 97.2-99.0% in 12 runs in guests of 5.10 and 6.12. The rest
// is the process's last moments (`_exit`, whose caller's frame is gone) and its loader's first.
// Named, not just walked: a run once named 4.5% because libc's file, refused in a race with
// the command's exec, was never tried again.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn dwarf_stacks_reach_the_entry() {
    require_root!();
    let nofp = rust_workload_without_frame_pointers("validator-sim");
    let _g = bpf_lock();
    let opts = ["--events", "cpu", "--freq", "499", "--unwind", "dwarf"];
    let args = ["--blocks", "40", "--threads", "2", "--burn-ms", "25"];
    let (out, _) = record_workload("k-dwarf", &opts, &nofp, &args);
    let entry = |s: &str| {
        s.starts_with("_start;") || s.split(';').any(|f| f == "main" || f == "start_thread")
    };
    let (total, whole) = folded_cpu_share(&out, entry);
    let walks = &report_json(&out)["events"]["cpu"]["unwind"]["walks"];
    eprintln!("{whole}/{total} samples reach the entry; walks {walks}");
    assert!(total > 0 && whole as f64 >= 0.95 * total as f64);
}

// Checks a command that execs the same program again and again (a shell loop running Debian's
// `cat`, without frame pointers, 30 times: what `record -- make` or a build script does) under
// the default `auto`: each `cat`'s one `write` (its output, after its entry point) has a stack
// walked from tables through `__libc_start_main` and named. The first `cat` stops at its exec; each later
// one stops at its entry point, or on kernels with the task VMA iterator (6.7) runs on with
// the block the kernel filled there from the tables already in: either way its tables are in
// before its code runs. `record` returning at all says no `cat` was left stopped.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn exec_loop_stacks_from_tables() {
    require_root!();
    let _g = bpf_lock();
    let out = scratch("k-execs").join("k-execs.phaseprof");
    let script = "i=0; while [ $i -lt 30 ]; do cat /etc/hostname >/dev/null; i=$((i+1)); done";
    let path = out.to_str().expect("UTF-8 path");
    phaseprof_ok(&[
        "record", "--events", "syscall", "-o", path, "--", "sh", "-c", script,
    ]);
    let (_, writes) = folded_event_share(&out, "syscall", |s| s.ends_with("syscall:write"));
    let (_, whole) = folded_event_share(&out, "syscall", |s| {
        // Debian's libc names it `__libc_start_main_impl`.
        s.ends_with("syscall:write") && s.split(';').any(|f| f.starts_with("__libc_start_main"))
    });
    eprintln!("{whole} of {writes} writes of the 30 cats reach __libc_start_main");
    assert_eq!((writes, whole), (30, 30));
}

// Checks `--version`: the version and git revision the binary was built from (this checkout's
// HEAD, where git can tell it), and the running kernel's release with each BPF feature
// phaseprof probes, and for each missing one what stands in for it.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn version_says_the_revision_and_what_the_kernel_can_do() {
    require_root!();
    let out = phaseprof_ok(&["--version"]);
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("");
    assert!(
        first.starts_with("phaseprof ") && first.contains(" (git "),
        "{text}"
    );
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(root())
        .output()
        .ok()
        .filter(|o| o.status.success());
    if let Some(head) = head {
        let head = String::from_utf8_lossy(&head.stdout).trim().to_string();
        assert!(
            first.contains(&head),
            "{first} is not built from HEAD {head}"
        );
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let kernel = lines.next().unwrap_or("");
    assert!(
        kernel.starts_with(&format!("kernel {}: ", release.trim())),
        "{text}"
    );
    for feature in ["btf yes", "ringbuf yes", "uprobe_multi ", "sched_info "] {
        assert!(kernel.contains(feature), "{feature}: {text}");
    }
    // Each missing feature says what replaces it, on a line of its own.
    let missing = kernel.matches(" no").count();
    assert_eq!(
        lines.filter(|l| l.starts_with("  ")).count(),
        missing,
        "{text}"
    );
}
