//! Exports read by the tools users feed them to.
use std::process::Command;

use phaseprof_e2e::*;

use crate::require_root;

/// validator-sim burning CPU (with a few flushes), recorded with default events.
fn record_burn(name: &str) -> (std::path::PathBuf, serde_json::Value) {
    let sim = rust_workload("validator-sim");
    record_workload(
        name,
        &[],
        &sim,
        &["--blocks", "6", "--burn-ms", "150", "--flushes", "2"],
    )
}

// Checks that `go tool pprof -top` reads the exported pprof and lists the burn function first.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn go_pprof_lists_the_burn_function_first() {
    require_root!();
    let Some(go) = go_binary() else {
        eprintln!("SKIPPED: Go is not installed");
        return;
    };
    let _g = bpf_lock();
    let (file, truth) = record_burn("pprof");
    let dir = file.parent().unwrap().to_path_buf();
    let pb = dir.join("cpu.pb.gz");
    phaseprof_ok(&[
        "export",
        file.to_str().unwrap(),
        "--format",
        "pprof",
        "--event",
        "cpu",
        "-o",
        pb.to_str().unwrap(),
    ]);
    let o = Command::new(go)
        .args(["tool", "pprof", "-top", pb.to_str().unwrap()])
        .env("HOME", &dir)
        .env("PPROF_TMPDIR", &dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "go tool pprof failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Rows follow the "flat  flat%   sum%        cum   cum%" header; the first is the hottest.
    let first = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .nth(1)
        .unwrap_or_else(|| panic!("no rows in:\n{text}"));
    eprintln!("{text}");
    assert!(
        first.ends_with(truth["burn_fn"].as_str().unwrap()),
        "first row: {first}"
    );

    // `-raw` lists the mappings: the program first (pprof's main binary), with its path, its
    // address range and its build ID as `readelf -n` reads it, then libc with its own.
    let raw = Command::new(go_binary().unwrap())
        .args(["tool", "pprof", "-raw", pb.to_str().unwrap()])
        .env("HOME", &dir)
        .output()
        .unwrap();
    let raw = String::from_utf8_lossy(&raw.stdout);
    let mappings: Vec<&str> = raw
        .lines()
        .skip_while(|l| *l != "Mappings")
        .skip(1)
        .collect();
    let sim = rust_workload("validator-sim");
    let notes = Command::new("readelf")
        .arg("-n")
        .arg(&sim)
        .output()
        .unwrap();
    let build_id = String::from_utf8_lossy(&notes.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
        .expect("validator-sim has a build id");
    let main = mappings
        .first()
        .unwrap_or_else(|| panic!("no mappings in:\n{raw}"));
    assert!(main.starts_with("1: 0x"), "{main}");
    assert!(
        main.contains(sim.to_str().unwrap()) && main.contains(&build_id),
        "{main}"
    );
    assert!(
        mappings
            .iter()
            .any(|m| m.contains("libc.so.6") && m.split_whitespace().count() >= 4),
        "libc with a build id: {mappings:?}"
    );
}

// Checks the SVG flamegraph names kind, unit and target in its title and holds the burn frame;
// and that folded output sums to the sample count of the report.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn svg_and_folded_agree_with_the_report() {
    require_root!();
    let _g = bpf_lock();
    let (file, truth) = record_burn("svg");
    let dir = file.parent().unwrap().to_path_buf();
    let svg = dir.join("cpu.svg");
    phaseprof_ok(&[
        "export",
        file.to_str().unwrap(),
        "--format",
        "svg",
        "-o",
        svg.to_str().unwrap(),
    ]);
    let svg = std::fs::read_to_string(svg).unwrap();
    let pid = truth["pid"].as_u64().unwrap();
    assert!(
        svg.contains(&format!("cpu — samples — validator-sim (pid {pid})")),
        "title missing"
    );
    assert!(svg.contains("validator_sim::work::burn_cpu"));
    let folded = phaseprof_ok(&[
        "export",
        file.to_str().unwrap(),
        "--format",
        "folded",
        "-o",
        "-",
    ]);
    let sum: u64 = String::from_utf8(folded.stdout)
        .unwrap()
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    assert_eq!(
        sum,
        report_json(&file)["events"]["cpu"]["samples"]
            .as_u64()
            .unwrap()
    );
}

// Checks the speedscope export against speedscope's own file-format schema (from its npm
// package, validated with ajv): one profile per worker thread, named as the thread, and syscall
// weights summing exactly to the recorded syscall count; and `export --by thread` folded lines
// rooted at each thread.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn speedscope_export_passes_its_schema_and_splits_threads() {
    require_root!();
    let _g = bpf_lock();
    let sim = rust_workload("validator-sim");
    let (file, truth) = record_workload(
        "speedscope",
        &[],
        &sim,
        &[
            "--blocks",
            "10",
            "--burn-ms",
            "20",
            "--flushes",
            "3",
            "--threads",
            "2",
        ],
    );
    let report = report_json(&file);
    let dir = file.parent().unwrap().to_path_buf();
    let check = root().join("tests/browser/speedscope-check.mjs");
    for event in ["cpu", "syscall"] {
        let out = dir.join(format!("{event}.speedscope.json"));
        phaseprof_ok(&[
            "export",
            file.to_str().unwrap(),
            "--format",
            "speedscope",
            "--event",
            event,
            "-o",
            out.to_str().unwrap(),
        ]);
        let o = Command::new("node")
            .arg(&check)
            .arg(&out)
            .output()
            .expect("node");
        let said = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && said.trim() == "valid",
            "{event}: {said}"
        );
        let json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        let profiles = json["profiles"].as_array().unwrap();
        let workers = profiles
            .iter()
            .filter(|p| {
                let name = p["name"].as_str().unwrap();
                name.starts_with("validator-0 (tid") || name.starts_with("validator-1 (tid")
            })
            .count();
        assert_eq!(
            workers,
            2,
            "{event}: {:?}",
            profiles.iter().map(|p| &p["name"]).collect::<Vec<_>>()
        );
        if event == "syscall" {
            let weights: u64 = profiles
                .iter()
                .flat_map(|p| p["weights"].as_array().unwrap())
                .map(|w| w.as_u64().unwrap())
                .sum();
            assert_eq!(weights, num(&report["events"]["syscall"]["count"]));
        }
    }
    // Each worker thread's flushes: 3 a block, 10 blocks, all under its own root frame.
    let o = phaseprof_ok(&[
        "export",
        file.to_str().unwrap(),
        "--format",
        "folded",
        "--event",
        "syscall",
        "--by",
        "thread",
    ]);
    let folded = String::from_utf8(o.stdout).unwrap();
    let mut writes_per_worker = std::collections::BTreeMap::<String, u64>::new();
    for line in folded.lines().filter(|l| l.contains("syscall:write")) {
        let root = line.split(';').next().unwrap().to_string();
        let v: u64 = line.rsplit_once(' ').unwrap().1.parse().unwrap();
        if root.contains("(validator-0)") || root.contains("(validator-1)") {
            *writes_per_worker.entry(root).or_default() += v;
        }
    }
    let per_thread = num(&truth["flushes"]) / 2;
    assert_eq!(writes_per_worker.len(), 2, "{writes_per_worker:?}");
    assert!(
        writes_per_worker.values().all(|&n| n == per_thread),
        "{writes_per_worker:?} vs {per_thread} each"
    );
}

// Checks the OTLP profiles export with the OpenTelemetry Collector's own decoder (pdata/pprofile,
// which rejects dangling dictionary references): one profile of cpu time in nanoseconds whose
// total is the report's samples times the period, the burn function the hottest leaf, the
// program's mapping by path, and each worker thread named in the samples' attributes.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn otlp_export_reads_back_in_the_collectors_decoder() {
    require_root!();
    let Some(check) = go_workload("otlp-check") else {
        eprintln!("SKIPPED: Go is not installed");
        return;
    };
    let _g = bpf_lock();
    let sim = rust_workload("validator-sim");
    let (file, truth) = record_workload(
        "otlp",
        &[],
        &sim,
        &["--blocks", "10", "--burn-ms", "30", "--threads", "2"],
    );
    let report = report_json(&file);
    let out = file.with_extension("otlp.pb");
    phaseprof_ok(&[
        "export",
        file.to_str().unwrap(),
        "--format",
        "otlp",
        "-o",
        out.to_str().unwrap(),
    ]);
    let o = Command::new(&check).arg(&out).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let seen: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    eprintln!("{seen}");
    assert_eq!(seen["profiles"], 1);
    assert_eq!(
        (seen["sample_type"].as_str(), seen["unit"].as_str()),
        (Some("cpu"), Some("nanoseconds"))
    );
    let samples = num(&report["events"]["cpu"]["samples"]);
    let period = 1_000_000_000 / num(&report["events"]["cpu"]["frequency_hz"]);
    assert_eq!(num(&seen["total"]), samples * period);
    let by_leaf = seen["by_leaf"].as_object().unwrap();
    let hottest = by_leaf.iter().max_by_key(|(_, v)| v.as_u64()).unwrap().0;
    assert_eq!(hottest, truth["burn_fn"].as_str().unwrap());
    assert!(
        seen["mappings"].to_string().contains(sim.to_str().unwrap()),
        "{}",
        seen["mappings"]
    );
    let threads = seen["threads"].as_object().unwrap();
    assert!(
        threads.contains_key("validator-0") && threads.contains_key("validator-1"),
        "{threads:?}"
    );
}
