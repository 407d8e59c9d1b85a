//! `attach`: windows of a live validator-sim served while it runs, a clean detach, and the ring
//! saved as one profile whose totals are the windows' sum.
use std::process::{Command, Stdio};

use phaseprof_e2e::*;

use crate::require_root;

// Checks that attach serves at least two 1 s windows of a running target with per-window phase
// calls, that a range of windows downloads as one profile whose calls are the windows' sum,
// that Ctrl-C detaches leaving the target to finish normally, and that the saved ring holds at
// least those calls and no more than the target made.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn attach_serves_windows_and_detaches() {
    require_root!();
    let _g = bpf_lock();
    let sim = rust_workload("validator-sim");
    let cfg = root().join("tests/workloads/validator-sim/phases.toml");
    let target = Command::new(&sim)
        .args([
            "--blocks",
            "250",
            "--burn-ms",
            "5",
            "--flushes",
            "5",
            "--sleep-ms",
            "15",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = scratch("attach").join("ring.phaseprof");
    let mut agent = Command::new(phaseprof_bin())
        .args([
            "attach",
            "--pid",
            &target.id().to_string(),
            "--phases",
            cfg.to_str().unwrap(),
            "--window",
            "1s",
            "--listen",
            "127.0.0.1:0",
            "-o",
            out.to_str().unwrap(),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(agent.stderr.take().unwrap());
    let url = served_url(&mut stderr);
    std::thread::sleep(std::time::Duration::from_millis(3500));
    let (status, body) = http_get(&format!("{url}/api/profiles"));
    assert_eq!(status, 200);
    let windows: serde_json::Value = serde_json::from_str(&body).unwrap();
    let ids: Vec<String> = windows
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["id"].as_str().unwrap().to_string())
        .collect();
    assert!(ids.len() >= 2, "windows: {body}");
    let (status, page) = http_get(&format!("{url}/"));
    assert_eq!(status, 200);
    assert!(
        page.contains("data-refresh"),
        "the live index refreshes itself"
    );
    let (status, _) = http_get(&format!("{url}/diff?a={}&b={}", ids[0], ids[1]));
    assert_eq!(status, 200);
    let calls_in = |id: &str| -> u64 {
        let (_, body) = http_get(&format!("{url}/api/profiles/{id}/phases"));
        let phases: serde_json::Value = serde_json::from_str(&body).unwrap();
        phases
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "propose")
            .map(|p| p["calls"].as_u64().unwrap())
            .unwrap()
    };
    let per_window: Vec<u64> = ids.iter().map(|id| calls_in(id)).collect();
    eprintln!("propose calls per window: {per_window:?}");
    assert!(per_window.iter().all(|&c| c > 0));
    let nums: Vec<u64> = ids.iter().map(|i| i.parse().unwrap()).collect();
    let (lo, hi) = (nums.iter().min().unwrap(), nums.iter().max().unwrap());
    let range = scratch("attach-range").join("range.phaseprof");
    let status = Command::new("curl")
        .args(["-sf", "-o", range.to_str().unwrap()])
        .arg(format!("{url}/range/{lo}/{hi}/download.phaseprof"))
        .status()
        .unwrap();
    assert!(status.success());
    let merged = phase_json(&report_json(&range), "propose")["calls"]
        .as_u64()
        .unwrap();
    assert_eq!(merged, per_window.iter().sum::<u64>());
    // SAFETY: signalling a child we spawned.
    unsafe { libc::kill(agent.id() as i32, libc::SIGINT) };
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert!(agent.wait().unwrap().success(), "{rest}");
    assert!(rest.contains("detached from pid"), "{rest}");
    // The target was not disturbed: it runs to its end.
    let done = target.wait_with_output().unwrap();
    assert!(done.status.success());
    let truth = truth_from(&done.stdout);
    let saved = phase_json(&report_json(&out), "propose")["calls"]
        .as_u64()
        .unwrap();
    eprintln!(
        "saved ring: {saved} propose calls; the target made {}",
        truth["calls"]["propose"]
    );
    assert!(saved >= merged && saved <= truth["calls"]["propose"].as_u64().unwrap());
}

// Checks that every live route of every window tells the same story as the window itself: the
// summary route equals `report --json` of the window downloaded, and within a window the phase
// table's exact totals equal its samples filtered to the phase (syscalls by name, off-CPU time),
// as they do in a recording served from a file. Phase totals used to be read at another moment
// than the samples, so a window's `finalize` syscalls disagreed with its syscall route.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn attach_routes_agree_with_their_window() {
    require_root!();
    let _g = bpf_lock();
    let sim = rust_workload("validator-sim");
    let cfg = root().join("tests/workloads/validator-sim/phases.toml");
    let args = ["--blocks", "400", "--burn-ms", "2", "--flushes", "20"];
    let target = Killed(
        Command::new(&sim)
            .args(args)
            .args(["--sleep-ms", "5"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = target.0.id().to_string();
    let mut agent = Killed(
        Command::new(phaseprof_bin())
            .args(["attach", "--pid", &pid, "--phases", cfg.to_str().unwrap()])
            .args(["--window", "500ms", "--listen", "127.0.0.1:0"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut stderr = std::io::BufReader::new(agent.0.stderr.take().unwrap());
    let url = served_url(&mut stderr);
    std::thread::sleep(std::time::Duration::from_millis(3000));
    let json = |path: &str| -> serde_json::Value {
        let (status, body) = http_get(&format!("{url}{path}"));
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap()
    };
    let windows = json("/api/profiles");
    let ids: Vec<&str> = (windows.as_array().unwrap().iter())
        .map(|w| w["id"].as_str().unwrap())
        .collect();
    assert!(ids.len() >= 3, "windows: {windows}");
    let dir = scratch("attach-routes");
    for id in &ids {
        let summary = json(&format!("/api/profiles/{id}"));
        let file = dir.join(format!("{id}.phaseprof"));
        let status = Command::new("curl")
            .args(["-sf", "-o", file.to_str().unwrap()])
            .arg(format!("{url}/profile/{id}/download.phaseprof"))
            .status()
            .unwrap();
        assert!(status.success());
        let report = report_json(&file);
        for part in ["phases", "events", "lost", "duration_ns"] {
            assert_eq!(summary[part], report[part], "window {id}: {part}");
        }
        assert_eq!(
            json(&format!("/api/profiles/{id}/phases")),
            report["phases"]
        );
        for phase in ["propose", "finalize"] {
            let row = phase_json(&report, phase);
            let rows = json(&format!("/api/profiles/{id}/syscalls?phase={phase}"));
            let counted: u64 = (rows.as_array().unwrap().iter())
                .map(|r| r["count"].as_u64().unwrap())
                .sum();
            let offcpu = json(&format!(
                "/api/profiles/{id}/top?event=offcpu&phase={phase}"
            ));
            eprintln!(
                "window {id} {phase}: {} calls, syscalls {} (route {counted}), off-cpu {} ns \
                 (route {})",
                row["calls"], row["syscalls"], row["offcpu_ns"], offcpu["total"]
            );
            assert_eq!(
                row["syscalls"].as_u64(),
                Some(counted),
                "window {id} {phase}"
            );
            assert_eq!(row["offcpu_ns"], offcpu["total"], "window {id} {phase}");
        }
    }
    // SAFETY: signalling a child we spawned.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGINT) };
    assert!(agent.0.wait().unwrap().success());
    drop(target);
}
