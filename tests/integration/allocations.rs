//! Allocations against ground truth: validator-sim's counting allocator (exact bytes, exact
//! clone bytes per phase), relay-sim's `bytes.Clone` through Go's sampling, and a leak named by
//! the live heap.
use phaseprof_e2e::*;

use crate::require_root;

fn alloc_events(report: &serde_json::Value) -> &serde_json::Value {
    &report["events"]["alloc"]
}

// Checks exact totals with every allocation sampled: bytes within 0.1% of the workload's own
// count, clone_bytes per phase exact, and the free probe placed past free's NULL test on an
// instruction the kernel emulates.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn validator_sim_allocations_are_exact() {
    require_root!();
    let _g = bpf_lock();
    let sim = rust_workload("validator-sim");
    let cfg = root().join("tests/workloads/validator-sim/phases.toml");
    let (out, truth) = record_workload(
        "alloc-exact",
        &[
            "--events",
            "alloc",
            "--alloc-sample-bytes",
            "1",
            "--phases",
            cfg.to_str().unwrap(),
        ],
        &sim,
        &[
            "--blocks",
            "50",
            "--threads",
            "2",
            "--clone-bytes",
            "1000000",
            "--flushes",
            "3",
        ],
    );
    let report = report_json(&out);
    let alloc = alloc_events(&report);
    let bytes = num(&alloc["bytes"]) as f64;
    let want = num(&truth["alloc_bytes"]) as f64;
    eprintln!(
        "alloc bytes {bytes} vs truth {want}: {:.4}%",
        rel_diff(bytes, want) * 100.0
    );
    assert!(
        rel_diff(bytes, want) < 0.001,
        "bytes {bytes} vs truth {want}"
    );
    assert!(num(&alloc["count"]) >= num(&truth["allocs"]));
    assert_eq!(alloc["exact"], true);
    let clone = |p: &str| num(&phase_json(&report, p)["costs"]["clone_bytes"]);
    assert_eq!(clone("replay"), num(&truth["clone_bytes"]));
    assert_eq!(clone("propose"), 0);
    assert_eq!(clone("finalize"), 0);
    // Each replay allocates its clone and frees it: per phase, exact.
    let replay = phase_json(&report, "replay");
    assert_eq!(num(&replay["alloc_bytes"]), num(&truth["clone_bytes"]));
    assert_eq!(num(&replay["allocs"]), num(&truth["calls"]["replay"]));
    assert_eq!(num(&replay["frees"]), num(&truth["calls"]["replay"]));
    let probes: Vec<&str> = alloc["probes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    let free = probes
        .iter()
        .find(|p| p.starts_with("free@"))
        .expect("free is probed");
    assert!(
        free.ends_with("(emulated)") && !free.contains("+0x0 "),
        "{free}"
    );
    assert_eq!(report["lost"]["events"], 0);
    assert_eq!(report["lost"]["stacks"], 0);
}

// Checks that totals stay exact when stacks are sampled (the default 512 KiB period) and that
// the sampled clone bytes estimate the truth.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn sampled_stacks_keep_exact_totals() {
    require_root!();
    let _g = bpf_lock();
    let sim = rust_workload("validator-sim");
    let (out, truth) = record_workload(
        "alloc-sampled",
        &["--events", "alloc"],
        &sim,
        &["--blocks", "200", "--clone-bytes", "1000000"],
    );
    let report = report_json(&out);
    let bytes = num(&alloc_events(&report)["bytes"]) as f64;
    let want = num(&truth["alloc_bytes"]) as f64;
    assert!(
        rel_diff(bytes, want) < 0.001,
        "bytes {bytes} vs truth {want}"
    );
    // 200 MB in 1 MB clones sampled every 512 KiB: each clone crosses about two sample points,
    // so the estimate's error is a fraction of one period per clone, far below 5% overall.
    let clone = num(&report["costs"]["clone_bytes"]) as f64;
    let want = num(&truth["clone_bytes"]) as f64;
    eprintln!("sampled clone bytes {clone} vs truth {want}");
    assert!(
        rel_diff(clone, want) < 0.05,
        "clone {clone} vs truth {want}"
    );
}

// Checks Go: relay-sim's bytes.Clone bytes attributed to `verify` through Go's own heap samples
// (enabled by phaseprof for the recording), within four standard errors of Go's sampling.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn relay_sim_clone_bytes_in_verify() {
    require_root!();
    let Some(relay) = go_workload("relay-sim") else {
        eprintln!("SKIPPED: no Go toolchain");
        return;
    };
    let _g = bpf_lock();
    let cfg = root().join("tests/workloads/relay-sim/phases.toml");
    let (iterations, size) = (3000u64, 65536u64);
    let (out, truth) = record_workload(
        "alloc-go",
        &["--events", "alloc", "--phases", cfg.to_str().unwrap()],
        &relay,
        &[
            "-iterations",
            &iterations.to_string(),
            "-msg-bytes",
            &size.to_string(),
        ],
    );
    let report = report_json(&out);
    let verify = num(&phase_json(&report, "verify")["costs"]["clone_bytes"]) as f64;
    let want = num(&truth["clone_bytes"]) as f64;
    // Each clone is sampled with p = 1 - exp(-size/rate); the estimate's relative standard
    // error over n clones is sqrt((1 - p) / (n p)).
    let p = 1.0 - (-(size as f64) / (512.0 * 1024.0)).exp();
    let se = ((1.0 - p) / (iterations as f64 * p)).sqrt();
    eprintln!(
        "verify clone bytes {verify:.0} vs truth {want}: {:.1}% (4 standard errors: {:.1}%)",
        rel_diff(verify, want) * 100.0,
        4.0 * se * 100.0
    );
    assert!(
        rel_diff(verify, want) < 4.0 * se,
        "verify {verify} vs {want}"
    );
    for other in ["ingest", "commit", "fanout"] {
        assert_eq!(
            num(&phase_json(&report, other)["costs"]["clone_bytes"]),
            0,
            "{other}"
        );
    }
    assert_eq!(alloc_events(&report)["exact"], false);
}

// Checks the live heap: a workload leaking through `validator_sim::work::leak` has that stack
// on top of `report --live`, holding the leaked bytes (every allocation sampled).
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn live_heap_names_the_leak() {
    require_root!();
    let _g = bpf_lock();
    let sim = rust_workload("validator-sim");
    let (out, truth) = record_workload(
        "alloc-live",
        &["--events", "alloc", "--alloc-sample-bytes", "1"],
        &sim,
        &[
            "--blocks",
            "40",
            "--leak-bytes",
            "100000",
            "--clone-bytes",
            "300000",
        ],
    );
    let text = phaseprof_ok(&["report", out.to_str().unwrap(), "--live", "--top", "3"]);
    let text = String::from_utf8(text.stdout).unwrap();
    eprintln!("{text}");
    let rows: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("== live heap"))
        .skip(2)
        .collect();
    assert!(
        rows[0].contains("validator_sim::work::leak"),
        "top live stack: {}",
        rows[0]
    );
    let leaked_mib = num(&truth["leaked_bytes"]) as f64 / (1024.0 * 1024.0);
    let shown: f64 = rows[0].split_whitespace().next().unwrap().parse().unwrap();
    assert!(
        rel_diff(shown, leaked_mib) < 0.01,
        "{shown} MiB vs {leaked_mib}"
    );
}

// Checks page faults: the leak's pages are touched in `replay`, so replay has at least one
// fault per leaked page, and most faults have replay on their stack (the leaf itself may be
// memset, which keeps no frame of its own).
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn page_faults_by_phase() {
    require_root!();
    let _g = bpf_lock();
    let sim = rust_workload("validator-sim");
    let cfg = root().join("tests/workloads/validator-sim/phases.toml");
    let (out, truth) = record_workload(
        "pagefault",
        &["--events", "pagefault", "--phases", cfg.to_str().unwrap()],
        &sim,
        &["--blocks", "20", "--leak-bytes", "1048576"],
    );
    let report = report_json(&out);
    let pages = num(&truth["leaked_bytes"]) / 4096;
    let replay = num(&phase_json(&report, "replay")["page_faults"]);
    eprintln!("replay page faults {replay} for {pages} leaked pages");
    assert!(replay >= pages, "{replay} faults < {pages} pages");
    // propose touches no data: its few faults are its code's first runs.
    assert!(num(&phase_json(&report, "propose")["page_faults"]) < 50);
    let path = out.to_str().unwrap();
    let folded = phaseprof_ok(&[
        "export",
        path,
        "--format",
        "folded",
        "--event",
        "pagefault",
        "-o",
        "-",
    ]);
    let (mut total, mut in_replay) = (0, 0);
    for line in String::from_utf8(folded.stdout).unwrap().lines() {
        let (stack, n) = line.rsplit_once(' ').unwrap();
        let n: u64 = n.parse().unwrap();
        total += n;
        if stack.contains("validator_sim::phases::replay") {
            in_replay += n;
        }
    }
    assert_eq!(total, num(&report["events"]["pagefault"]["count"]));
    assert!(
        in_replay * 2 > total,
        "{in_replay} of {total} faults under replay"
    );
}

// Checks an allocation budget's totals against the workload's own count: validator-sim's
// blocks each make 100 small allocations and 10 writes, so the slices' share of its writes
// (the kernel's per-process count) is their share of its allocations; the report says it
// extrapolated by them and the probes' slowdown measured by them, and the count lands within
// 5% of the truth (the basis errs by 1/√n for n writes in slices).
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn allocation_budget_totals_by_syscalls() {
    require_root!();
    let _g = bpf_lock();
    let sim = rust_workload("validator-sim");
    let (out, truth) = record_workload(
        "alloc-budget",
        &["--events", "cpu,alloc", "--alloc-budget", "5%"],
        &sim,
        &[
            "--blocks",
            "3000",
            "--burn-ms",
            "1",
            "--small-allocs",
            "100",
            "--flushes",
            "10",
        ],
    );
    let report = report_json(&out);
    let alloc = alloc_events(&report);
    eprintln!("{alloc}");
    assert_eq!(alloc["exact"], false);
    assert_eq!(alloc["basis"], "syscalls", "{alloc}");
    let (count, want) = (num(&alloc["count"]) as f64, num(&truth["allocs"]) as f64);
    eprintln!(
        "allocations {count} vs truth {want}: {:+.2}%",
        (count / want - 1.0) * 100.0
    );
    assert!(
        rel_diff(count, want) < 0.05,
        "allocations {count} vs truth {want}"
    );
}
