//! The web UI in headless Chromium (Debian's, driven by npm playwright-core): a served profile of
//! validator-sim, filtered to the `propose` phase by a click, and the diff page's verdict.
//! Screenshots are kept in target/browser-artifacts/.
use std::process::{Command, Stdio};

use phaseprof_e2e::*;

use crate::require_root;

fn record(name: &str, flushes: &str) -> std::path::PathBuf {
    record_sim_with_phases(
        name,
        &[
            "--blocks",
            "30",
            "--burn-ms",
            "10",
            "--flushes",
            flushes,
            "--sleep-ms",
            "2",
            "--threads",
            "2",
        ],
    )
}

// Checks in a real browser: clicking `propose` in the phase table filters the page to it (the
// filter line, the selected row, the graph's URL and title change), the syscall tab shows its
// table, and the diff page of 100 vs 25 flushes reads `improved`-side numbers for
// finalize/flush_syscalls (one run per side: a delta).
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn profile_page_and_diff_in_chromium() {
    require_root!();
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let ui = root().join("tests/browser/ui.mjs");
    assert!(
        std::path::Path::new(&chromium).exists()
            && root()
                .join("tests/browser/node_modules/playwright-core")
                .exists(),
        "chromium and tests/browser/node_modules are installed by scripts/setup.sh"
    );
    let _g = bpf_lock();
    let a = record("browser-a", "100");
    let b = record("browser-b", "25");
    let mut server = Command::new(phaseprof_bin())
        .args([
            "serve",
            a.to_str().unwrap(),
            b.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(server.stderr.take().unwrap());
    let url = served_url(&mut stderr);
    let artifacts = root().join("target/browser-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let diff_html = artifacts.join("diff.html");
    phaseprof_ok(&[
        "diff",
        a.to_str().unwrap(),
        "--vs",
        b.to_str().unwrap(),
        "-o",
        diff_html.to_str().unwrap(),
    ]);
    let out = Command::new("node")
        .arg(&ui)
        .args([
            &url,
            artifacts.to_str().unwrap(),
            diff_html.to_str().unwrap(),
        ])
        .env("CHROMIUM", &chromium)
        .output()
        .expect("running node");
    let _ = server.kill();
    let _ = server.wait();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the browser run failed");
    let seen: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("ui.mjs prints JSON");
    assert_eq!(seen["before_filter"], "all phases");
    assert!(seen["after_filter"].as_str().unwrap().contains("propose"));
    assert_eq!(seen["selected_row"], "propose");
    assert!(seen["after_graph"]
        .as_str()
        .unwrap()
        .ends_with("cpu.svg?phase=propose"));
    assert!(seen["graph_title"]
        .as_str()
        .unwrap()
        .contains("phase propose"));
    assert_eq!(seen["after_top"], "validator_sim::work::burn_cpu");
    assert_eq!(seen["syscall_tab_visible"], true);
    let flush = &seen["diff_flush"];
    assert_eq!(flush[2], "100");
    assert_eq!(flush[3], "25");
    assert_eq!(flush[4], "-75");
    // Values with units: finalize sleeps 2 ms a block, so its wall time per call reads in ms.
    let wall = &seen["diff_wall"];
    for cell in [&wall[2], &wall[3]] {
        assert!(cell.as_str().unwrap().ends_with(" ms"), "{wall}");
    }
    // Grouped by thread: a row per worker thread of validator-sim (named validator-N), with
    // cpu samples; the phase filter kept; the graph split under `tid N (name) of pid P`.
    let threads = seen["threads"].as_array().unwrap();
    let workers: Vec<_> = threads
        .iter()
        .filter(|r| r[1].as_str().unwrap().starts_with("validator-"))
        .collect();
    assert_eq!(workers.len(), 2, "{threads:?}");
    assert!(
        workers.iter().all(|r| r[3].as_str().unwrap() != "0"),
        "{threads:?}"
    );
    assert_eq!(seen["phases_table_shown"], false);
    let graph = seen["thread_graph"].as_str().unwrap();
    assert!(
        graph.contains("phase=propose") && graph.contains("by=thread"),
        "{graph}"
    );
    let roots = seen["thread_graph_roots"].to_string();
    assert!(roots.contains("(validator-0) of pid"), "{roots}");
    let (width, viewport) = (
        seen["diff_html_width"].as_f64().unwrap(),
        seen["viewport_width"].as_f64().unwrap(),
    );
    assert!(
        width > 0.9 * viewport - 40.0,
        "diff.html graph {width} px of {viewport}"
    );
    for shot in [
        "profile.png",
        "profile-propose.png",
        "profile-threads.png",
        "diff.png",
    ] {
        assert!(
            artifacts.join(shot).metadata().unwrap().len() > 10_000,
            "{shot}"
        );
    }
}
