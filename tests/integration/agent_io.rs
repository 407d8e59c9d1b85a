//! The fleet agent's recording never waits on a server: a debuginfod server that takes seconds
//! to answer costs no window (debug files are fetched by a thread of their own), and the
//! windows after its answer are named from the debug file.
use std::process::{Command, Stdio};
use std::time::Duration;

use phaseprof_e2e::*;

use crate::debug_symbols::{debuginfod, stripped};
use crate::fleet::{agent_command, spawn_agent, sqlite_collector, Transport};
use crate::require_root;
use crate::store_sums::download;

const TOKEN: &str = "agent-d-token-0123456789";
/// How long the debuginfod server takes to answer.
const SLOW: Duration = Duration::from_secs(6);

// Checks that an agent recording a stripped program (~20 s of CPU in two functions), whose
// debug file a debuginfod server gives only after 6 s, cuts its 1-s windows all the while (none
// lasts 3 s; fetched on the session loop, one window took the whole wait), and that the
// merged view names the functions (windows after the answer) and has them by address too
// (windows before it, so the fetch did happen while recording).
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn a_slow_debuginfod_costs_the_agent_no_window() {
    require_root!();
    let _g = bpf_lock();
    let dir = scratch("agent-io");
    let (bin, debug, id) = stripped(&dir, false);
    let url = debuginfod(id, debug, SLOW);
    let (port, _coll) = sqlite_collector(&dir, "host-d", TOKEN);
    let mut target = Killed(
        Command::new(&bin)
            .arg("80")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let ports = (port, free_port());
    let t = Transport::Http;
    let mut cmd = agent_command(&t, &dir, "d", ports, TOKEN, "host-d", "stripped-sim", "");
    cmd.env("DEBUGINFOD_URLS", &url)
        .env("DEBUGINFOD_CACHE_PATH", dir.join("cache"));
    let (_agent, mut err) = spawn_agent(&mut cmd);
    read_until(&mut err, &format!("recording pid {}", target.0.id()));
    assert!(target.0.wait().unwrap().success());
    // The last windows reach the collector.
    std::thread::sleep(Duration::from_secs(3));
    let (status, body) = http_get(&format!(
        "http://127.0.0.1:{port}/api/v1/windows?sel=host%3Dhost-d"
    ));
    assert_eq!(status, 200, "{body}");
    let windows: serde_json::Value = serde_json::from_str(&body).unwrap();
    let lengths: Vec<f64> = windows
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["end_ns"].as_u64().unwrap() - w["start_ns"].as_u64().unwrap()) as f64 / 1e9)
        .collect();
    eprintln!("window lengths (s): {lengths:?}");
    assert!(lengths.len() >= 5, "{lengths:?}");
    assert!(lengths.iter().all(|&l| l < 3.0), "{lengths:?}");
    let url = format!("http://127.0.0.1:{port}/api/v1/merged.phaseprof?sel=host%3Dhost-d");
    let p = phaseprof_model::read_profile(&download(&url)[..]).unwrap();
    let named = |f: &phaseprof_model::Frame| f.function == "stripped_spin_leaf";
    assert!(p.frames.iter().any(named), "never named");
    let by_address = |f: &phaseprof_model::Frame| f.function.starts_with("stripped-sim+0x");
    assert!(
        p.frames.iter().any(by_address),
        "named from the start: nothing was awaited"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
