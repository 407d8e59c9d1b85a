//! Symbols from where they are: a stripped C program's functions named from its separate debug
//! file found by `.gnu_debuglink`, by build ID under `/usr/lib/debug/.build-id/`, or fetched
//! from a debuginfod server (`DEBUGINFOD_URLS`, cached); and JIT code named by a perf map.
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use phaseprof_e2e::*;

use crate::require_root;

fn run(cmd: &str, args: &[&std::ffi::OsStr]) {
    let st = Command::new(cmd).args(args).status().expect(cmd);
    assert!(st.success(), "{cmd} {args:?}");
}

/// stripped-sim built with debug info, then split: `dir/stripped-sim` stripped of every symbol
/// (with a `.gnu_debuglink` when `link`), its debug file returned; and its build ID.
pub(crate) fn stripped(dir: &Path, link: bool) -> (PathBuf, PathBuf, String) {
    let built = c_workload(
        "stripped-sim",
        "",
        &["-fno-omit-frame-pointer", "-Wl,--build-id"],
    );
    let (bin, debug) = (dir.join("stripped-sim"), dir.join("stripped-sim.debug"));
    std::fs::copy(&built, &bin).unwrap();
    let os = |p: &Path| p.as_os_str().to_owned();
    run(
        "objcopy",
        &["--only-keep-debug".as_ref(), &os(&bin), &os(&debug)],
    );
    run("objcopy", &["--strip-all".as_ref(), &os(&bin)]);
    if link {
        let arg = format!("--add-gnu-debuglink={}", debug.display());
        run("objcopy", &[arg.as_ref(), &os(&bin)]);
    }
    let notes = Command::new("readelf")
        .arg("-n")
        .arg(&bin)
        .output()
        .unwrap();
    let id = String::from_utf8_lossy(&notes.stdout)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: ").map(str::to_string))
        .expect("a build id");
    (bin, debug, id)
}

/// Records `bin` (cpu only) with extra environment: the report's cpu functions, most self first.
fn cpu_functions(name: &str, bin: &Path, env: &[(&str, &str)]) -> Vec<String> {
    let out = scratch(&format!("rec-{name}")).join("out.phaseprof");
    let o = Command::new(phaseprof_bin())
        .args([
            "record",
            "--events",
            "cpu",
            "-o",
            out.to_str().unwrap(),
            "--",
        ])
        .arg(bin)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let report = phaseprof_ok(&["report", out.to_str().unwrap(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&report.stdout).unwrap();
    v["top_functions"]["cpu"]["functions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_string())
        .collect()
}

fn names_the_spin(functions: &[String]) -> bool {
    functions.first().map(String::as_str) == Some("stripped_spin_leaf")
        && functions.iter().any(|f| f == "stripped_spin_outer")
}

/// A debuginfod server (its HTTP API's `/buildid/ID/debuginfo`) serving `file` as build `id`
/// after `delay` (other builds: 404 at once).
pub(crate) fn debuginfod(id: String, file: PathBuf, delay: Duration) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut reader = std::io::BufReader::new(&conn);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            while reader.read_line(&mut String::new()).is_ok_and(|n| n > 2) {}
            let want = format!("GET /buildid/{id}/debuginfo ");
            let mut conn = &conn;
            if line.starts_with(&want) {
                std::thread::sleep(delay);
                let body = std::fs::read(&file).unwrap();
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = conn.write_all(head.as_bytes());
                let _ = conn.write_all(&body);
            } else {
                let _ = conn.write_all(
                    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                );
            }
        }
    });
    url
}

// Checks each place a stripped program's debug file can be, and that without one the functions
// stay unnamed (module+offset), so the named cases are the debug file's doing.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn stripped_binaries_are_named_from_separate_debug_files() {
    require_root!();
    let _g = bpf_lock();
    let dir = scratch("debuglink");
    let (bin, debug, id) = stripped(&dir, true);
    let f = cpu_functions("debuglink", &bin, &[]);
    assert!(names_the_spin(&f), ".gnu_debuglink beside it: {f:?}");
    // No debug link, no debug file anywhere: unnamed.
    let dir = scratch("nolink");
    let (bin, debug2, id2) = stripped(&dir, false);
    assert_eq!(id, id2, "same build");
    std::fs::remove_file(&debug2).unwrap();
    let _ = std::fs::remove_file(&debug);
    let saved = dir.join("kept.debug");
    let (_, debug3, _) = stripped(&scratch("kept"), false);
    std::fs::rename(&debug3, &saved).unwrap();
    let f = cpu_functions("unnamed", &bin, &[]);
    assert!(
        !names_the_spin(&f) && f[0].starts_with("stripped-sim+0x"),
        "no debug file: {f:?}"
    );

    // By build ID under /usr/lib/debug/.build-id/ (removed again after).
    let by_id = Path::new("/usr/lib/debug/.build-id").join(&id[..2]);
    std::fs::create_dir_all(&by_id).unwrap();
    let installed = by_id.join(format!("{}.debug", &id[2..]));
    std::fs::copy(&saved, &installed).unwrap();
    let f = cpu_functions("build-id", &bin, &[]);
    std::fs::remove_file(&installed).unwrap();
    assert!(names_the_spin(&f), "by build id: {f:?}");

    // From debuginfod, into its cache; a second run finds it in the cache with the server gone
    // from the environment's list (an unreachable URL).
    let url = debuginfod(id.clone(), saved.clone(), Duration::ZERO);
    let cache = scratch("debuginfod-cache");
    let cache_s = cache.to_str().unwrap();
    let f = cpu_functions(
        "debuginfod",
        &bin,
        &[
            ("DEBUGINFOD_URLS", &url),
            ("DEBUGINFOD_CACHE_PATH", cache_s),
        ],
    );
    assert!(names_the_spin(&f), "debuginfod: {f:?}");
    assert!(cache.join(&id).join("debuginfo").is_file());
    let f = cpu_functions(
        "debuginfod-cached",
        &bin,
        &[
            ("DEBUGINFOD_URLS", "http://127.0.0.1:9"),
            ("DEBUGINFOD_CACHE_PATH", cache_s),
        ],
    );
    assert!(names_the_spin(&f), "debuginfod cache: {f:?}");
}

// Checks that code in anonymous executable memory is named by the runtime's /tmp/perf-PID.map.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn a_perf_map_names_jit_code() {
    require_root!();
    let _g = bpf_lock();
    let bin = c_workload("jit-sim", "", &[]);
    let f = cpu_functions("jit", &bin, &[]);
    assert_eq!(
        f.first().map(String::as_str),
        Some("jit_spin_loop"),
        "{f:?}"
    );
}

// Checks that phases resolve in a stripped program from its separate debug file, as stacks
// do: by its .gnu_debuglink beside it, then by build ID under /usr/lib/debug/.build-id/ (removed
// again after); the calls equal the program's own loop counts (one outer call per round, 40
// leaf calls in each), and without a debug file the error says where one was looked for.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn phases_resolve_from_separate_debug_files() {
    require_root!();
    let _g = bpf_lock();
    let dir = scratch("phases-debug");
    let cfg = dir.join("phases.toml");
    std::fs::write(
        &cfg,
        "[[phase]]\nname = \"outer\"\nfunction = \"stripped_spin_outer\"\n\n\
         [[phase]]\nname = \"leaf\"\nfunction = \"stripped_spin_leaf\"\n",
    )
    .unwrap();
    let record = |name: &str, bin: &Path| {
        let out = scratch(&format!("phases-debug-{name}")).join("out.phaseprof");
        let o = Command::new(phaseprof_bin())
            .args(["record", "--events", "cpu", "--phases"])
            .arg(&cfg)
            .arg("-o")
            .arg(&out)
            .arg("--")
            .arg(bin)
            .arg("2")
            .output()
            .unwrap();
        (o, out)
    };
    let calls = |out: &Path| {
        let report = report_json(out);
        let n = |p: &str| phase_json(&report, p)["calls"].as_u64().unwrap();
        (n("outer"), n("leaf"))
    };

    let (bin, debug, id) = stripped(&scratch("phases-linked"), true);
    let (o, out) = record("linked", &bin);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("gnu_debuglink"), "{err}");
    assert_eq!(calls(&out), (2, 80), "{err}");

    let (bin, _, _) = stripped(&dir, false);
    let (o, _) = record("none", &bin);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("no separate debug file was found"), "{err}");

    let by_id = Path::new("/usr/lib/debug/.build-id").join(&id[..2]);
    std::fs::create_dir_all(&by_id).unwrap();
    let installed = by_id.join(format!("{}.debug", &id[2..]));
    std::fs::copy(&debug, &installed).unwrap();
    let (o, out) = record("build-id", &bin);
    std::fs::remove_file(&installed).unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains(installed.to_str().unwrap()), "{err}");
    assert_eq!(calls(&out), (2, 80), "{err}");
}
