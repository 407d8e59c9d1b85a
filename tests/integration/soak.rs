//! `soak` against a workload that leaks a known number of bytes per second.
use std::process::{Command, Stdio};

use phaseprof_e2e::*;

// Checks that soak's RSS slope is within 10% of the leak rate the workload reports, that it
// names anonymous memory as the growing class, and that the top live-heap stack it recorded
// meanwhile is the leaking one, growing at the leak rate.
#[test]
fn soak_slope_matches_the_leak() {
    let _g = bpf_lock();
    let sim = rust_workload("validator-sim");
    // 512 KiB per 50 ms block: about 10 MiB/s for about 5 s.
    let target = Command::new(&sim)
        .args([
            "--blocks",
            "100",
            "--sleep-ms",
            "50",
            "--leak-bytes",
            "524288",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let o = phaseprof_ok(&[
        "soak",
        "--pid",
        &target.id().to_string(),
        "--duration",
        "3s",
        "--interval",
        "200ms",
        "--json",
    ]);
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let truth = truth_from(&target.wait_with_output().unwrap().stdout);
    let rate = truth["leaked_bytes"].as_f64().unwrap() / truth["elapsed_ns"].as_f64().unwrap()
        * 1e9
        / (1024.0 * 1024.0);
    let slope = report["classes"]["rss"]["slope_mib_s"].as_f64().unwrap();
    eprintln!("rss slope {slope:.3} MiB/s vs leak {rate:.3} MiB/s");
    assert!(rel_diff(slope, rate) < 0.10, "slope {slope} vs leak {rate}");
    assert_eq!(report["dominant"], "anonymous");
    assert!(report["classes"]["rss"]["stderr_mib_s"].as_f64().unwrap() < 0.05 * rate);
    let top = &report["live_heap"][0];
    let frames: Vec<&str> = top["frames"]
        .as_array()
        .expect("live_heap frames")
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert!(
        frames.contains(&"validator_sim::work::leak"),
        "top live-heap stack: {frames:?}"
    );
    let live_rate = top["mib_s"].as_f64().unwrap();
    eprintln!("live heap growth {live_rate:.3} MiB/s vs leak {rate:.3} MiB/s");
    assert!(
        rel_diff(live_rate, rate) < 0.15,
        "live {live_rate} vs leak {rate}"
    );
}

// Checks that soak of a pid with no process fails with the pid in the message.
#[test]
fn soak_unknown_pid() {
    let o = phaseprof(&[
        "soak",
        "--pid",
        "999999999",
        "--duration",
        "1s",
        "--interval",
        "100ms",
    ]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no process with pid 999999999"));
}
