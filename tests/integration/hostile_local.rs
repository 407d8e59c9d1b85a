//! Root phaseprof against a hostile unprivileged user on the same host (a user the test
//! creates), who controls the files phaseprof opens on a target's behalf: the perf map as a
//! FIFO, as a symlink to a root-only file of "symbols", as a 2 GiB sparse file, appended to
//! without end; a 2 GiB sparse file mapped executable; a mapped library deleted and replaced by
//! a FIFO; a `.gnu_debuglink` whose target is a FIFO; a debuginfod server that streams garbage
//! forever. Each recording must end on time with the attack said in a warning, name no secret,
//! and stay under 200 MiB. Then `kill -9` of `record -- CMD` while the command is held: the
//! command runs on within 2 s, 10 times of 10.
use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use phaseprof_e2e::*;

use crate::require_root;

/// The unprivileged user, created for the test and removed after it.
struct User {
    name: &'static str,
    uid: u32,
    gid: u32,
    created: bool,
}

impl User {
    fn create() -> User {
        let name = "pp-hostile";
        let id = |flag: &str| {
            let o = Command::new("id").args([flag, name]).output().unwrap();
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<u32>()
                .ok()
        };
        let created = id("-u").is_none();
        if created {
            let st = Command::new("useradd")
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    name,
                ])
                .status()
                .unwrap();
            assert!(st.success(), "useradd {name}");
        }
        User {
            name,
            uid: id("-u").unwrap(),
            gid: id("-g").unwrap(),
            created,
        }
    }

    /// Makes `path` (a file, FIFO or symlink) the user's, as if the user had made it.
    fn owns(&self, path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: lchown with a NUL-terminated path.
        assert_eq!(unsafe { libc::lchown(c.as_ptr(), self.uid, self.gid) }, 0);
    }
}

impl Drop for User {
    fn drop(&mut self) {
        if self.created {
            let _ = Command::new("userdel").arg(self.name).status();
        }
    }
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0, "{path:?}");
}

/// hostile-target running as `user` for `seconds` (mapping `file` first): it and its pid and
/// JIT code address.
fn target(user: &User, seconds: u32, file: Option<&Path>) -> (Killed, u32, u64) {
    let bin = c_workload("hostile-target", "", &[]);
    let mut cmd = Command::new(bin);
    cmd.arg(seconds.to_string());
    if let Some(f) = file {
        cmd.arg(f);
    }
    let mut child = cmd
        .uid(user.uid)
        .gid(user.gid)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    let jit = u64::from_str_radix(v["jit"].as_str().unwrap(), 16).unwrap();
    (Killed(child), v["pid"].as_u64().unwrap() as u32, jit)
}

/// What one recording did: its exit, stderr, wall time and peak RSS.
struct Run {
    ok: bool,
    stderr: String,
    took: Duration,
    peak_mib: u64,
    out: PathBuf,
}

/// `phaseprof record ARGS -o OUT` with `env`, killed (and failed) past `limit`.
fn record(name: &str, args: &[String], env: &[(&str, &str)], limit: Duration) -> Run {
    let out = scratch(&format!("local-{name}")).join("out.phaseprof");
    let err = out.with_extension("stderr");
    let t = Instant::now();
    let child = Command::new(phaseprof_bin())
        .arg("record")
        .args(["-o", out.to_str().unwrap()])
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut guard = Killed(child);
    // Its peak RSS: VmHWM, read as it runs (the rusage of a forked child would count the
    // test process's own pages from before the exec).
    let (mut status, mut peak_kib) = (0, 0u64);
    loop {
        if let Some(kib) = vm_hwm_kib(pid as u32) {
            peak_kib = peak_kib.max(kib);
        }
        // SAFETY: waitpid on our own child with a valid status pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break;
        }
        if t.elapsed() > limit {
            let _ = guard.0.kill();
            panic!(
                "{name}: phaseprof still running after {limit:?}: {}",
                std::fs::read_to_string(&err).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    std::mem::forget(guard); // reaped above
    let stderr = std::fs::read_to_string(&err).unwrap_or_default();
    eprintln!(
        "{name}: {:.1} s, peak RSS {} MiB; {}",
        t.elapsed().as_secs_f64(),
        peak_kib / 1024,
        stderr
            .lines()
            .filter(|l| l.contains("warning"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    Run {
        ok: libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        stderr,
        took: t.elapsed(),
        peak_mib: peak_kib / 1024,
        out,
    }
}

fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?;
    line.split_whitespace().next()?.parse().ok()
}

/// Everything a user sees of a recording: the report and the folded stacks.
fn everything_shown(out: &Path) -> String {
    let report = phaseprof_ok(&["report", out.to_str().unwrap()]);
    let folded = phaseprof_ok(&["export", out.to_str().unwrap(), "--format", "folded"]);
    format!(
        "{}{}",
        String::from_utf8_lossy(&report.stdout),
        String::from_utf8_lossy(&folded.stdout)
    )
}

fn check(run: &Run, name: &str, warning: &str) {
    assert!(run.ok, "{name}: {}", run.stderr);
    assert!(
        run.took < Duration::from_secs(15),
        "{name}: took {:?}",
        run.took
    );
    assert!(run.peak_mib < 200, "{name}: peak RSS {} MiB", run.peak_mib);
    assert!(
        run.stderr.contains(warning),
        "{name}: no warning `{warning}` in {}",
        run.stderr
    );
}

/// A sparse file of 2 GiB owned by the user, starting with `head`.
fn sparse(user: &User, path: &Path, head: &[u8]) {
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(head).unwrap();
    f.set_len(2 << 30).unwrap();
    user.owns(path);
}

// Checks every local attack of the module comment, one recording each.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn a_hostile_local_user_cannot_freeze_blow_up_or_read_through_phaseprof() {
    require_root!();
    let _g = bpf_lock();
    let user = User::create();
    let dir = scratch("hostile-local");
    // The targets, ended before the user is removed.
    let mut procs = Vec::new();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let rec = |pid: u32| {
        vec![
            "-p".to_string(),
            pid.to_string(),
            "--duration".into(),
            "3s".into(),
            "--events".into(),
            "cpu".into(),
        ]
    };

    // The perf map as a FIFO.
    let (t, pid, _) = target(&user, 20, None);
    procs.push(t);
    let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    mkfifo(&map);
    user.owns(&map);
    let run = record("fifo-map", &rec(pid), &[], Duration::from_secs(30));
    let _ = std::fs::remove_file(&map);
    check(&run, "fifo-map", "not a regular file");

    // The perf map as a symlink to a root-only file whose lines name the JIT code.
    let (t, pid, jit) = target(&user, 20, None);
    procs.push(t);
    let secret = dir.join("secret");
    std::fs::write(&secret, format!("{jit:x} 1000 SECRET_ROOT_ONLY\n")).unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    std::os::unix::fs::symlink(&secret, &map).unwrap();
    user.owns(&map);
    let run = record("symlink-map", &rec(pid), &[], Duration::from_secs(30));
    let _ = std::fs::remove_file(&map);
    check(&run, "symlink-map", "symbolic link");
    assert!(
        !everything_shown(&run.out).contains("SECRET"),
        "the secret was shown"
    );

    // A 2 GiB sparse perf map, whose first line names the JIT code.
    let (t, pid, jit) = target(&user, 20, None);
    procs.push(t);
    let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    sparse(&user, &map, format!("{jit:x} 1000 jit_named\n").as_bytes());
    let run = record("sparse-map", &rec(pid), &[], Duration::from_secs(30));
    let _ = std::fs::remove_file(&map);
    check(&run, "sparse-map", "perf map of pid");
    assert!(
        everything_shown(&run.out).contains("jit_named"),
        "the map's first line is read"
    );

    // A perf map appended to without end, with names that never match.
    let (t, pid, _) = target(&user, 20, None);
    procs.push(t);
    let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    std::fs::write(&map, "").unwrap();
    user.owns(&map);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (map, stop) = (map.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut f = std::fs::OpenOptions::new().append(true).open(&map).unwrap();
            let line = format!("{:x} 10 {}\n", 0x1000u64, "x".repeat(200));
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = f.write_all(line.repeat(1000).as_bytes());
            }
        })
    };
    let run = record("growing-map", &rec(pid), &[], Duration::from_secs(30));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    let _ = std::fs::remove_file(&map);
    check(&run, "growing-map", "perf map of pid");

    // A 2 GiB sparse file mapped executable, walked by tables (each mapped file is read).
    let big = dir.join("big.so");
    sparse(&user, &big, b"\x7fELF");
    let (t, pid, _) = target(&user, 20, Some(&big));
    procs.push(t);
    let mut a = rec(pid);
    a.extend(["--unwind".to_string(), "dwarf".to_string()]);
    let run = record("sparse-mapped", &a, &[], Duration::from_secs(30));
    assert!(
        run.ok && run.peak_mib < 200,
        "sparse-mapped: {} MiB {}",
        run.peak_mib,
        run.stderr
    );

    // A mapped library deleted and replaced by a FIFO at its path.
    let lib = dir.join("libgone.so");
    std::fs::copy(c_workload("hostile-target", "", &[]), &lib).unwrap();
    user.owns(&lib);
    let (t, pid, _) = target(&user, 20, Some(&lib));
    procs.push(t);
    std::fs::remove_file(&lib).unwrap();
    mkfifo(&lib);
    user.owns(&lib);
    let mut a = rec(pid);
    a.extend(["--unwind".to_string(), "dwarf".to_string()]);
    let run = record("fifo-mapped", &a, &[], Duration::from_secs(30));
    assert!(
        run.ok && run.took < Duration::from_secs(15),
        "fifo-mapped: {}",
        run.stderr
    );
    let _ = std::fs::remove_file(&lib);

    debug_link_fifo(&user, &dir);
    endless_debuginfod(&user, &dir);
    drop(procs);
    drop(user);
    let _ = std::fs::remove_dir_all(&dir);
}

/// stripped-sim copied into `dir`, owned by `user`, stripped, with its debug file split off
/// beside it (and linked when `link`); returns the binary and the debug file.
fn stripped_copy(user: &User, dir: &Path, link: bool) -> (PathBuf, PathBuf) {
    let built = c_workload(
        "stripped-sim",
        "-buildid",
        &["-fno-omit-frame-pointer", "-Wl,--build-id"],
    );
    let name = if link { "linked-sim" } else { "id-sim" };
    let (bin, debug) = (dir.join(name), dir.join(format!("{name}.debug")));
    std::fs::copy(&built, &bin).unwrap();
    let run = |args: &[&std::ffi::OsStr]| {
        assert!(Command::new("objcopy")
            .args(args)
            .status()
            .unwrap()
            .success());
    };
    run(&[
        "--only-keep-debug".as_ref(),
        bin.as_os_str(),
        debug.as_os_str(),
    ]);
    run(&["--strip-all".as_ref(), bin.as_os_str()]);
    if link {
        let arg = format!("--add-gnu-debuglink={}", debug.display());
        run(&[arg.as_ref(), bin.as_os_str()]);
    }
    user.owns(&bin);
    (bin, debug)
}

/// `record -- CMD` of `bin` run as `user` (setpriv), with `env`.
fn record_as_user(name: &str, user: &User, bin: &Path, env: &[(&str, &str)]) -> Run {
    let (uid, gid) = (
        format!("--reuid={}", user.uid),
        format!("--regid={}", user.gid),
    );
    let args = [
        "--events",
        "cpu",
        "--",
        "setpriv",
        &uid,
        &gid,
        "--clear-groups",
    ];
    let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    args.push(bin.display().to_string());
    record(name, &args, env, Duration::from_secs(60))
}

// The `.gnu_debuglink` target beside a user's stripped binary is a FIFO.
fn debug_link_fifo(user: &User, dir: &Path) {
    let (bin, debug) = stripped_copy(user, dir, true);
    std::fs::remove_file(&debug).unwrap();
    mkfifo(&debug);
    user.owns(&debug);
    let run = record_as_user("fifo-debuglink", user, &bin, &[]);
    check(&run, "fifo-debuglink", "not a regular file");
}

/// A debuginfod server that answers every request with an ELF header claiming a 1.5 GiB file,
/// then trickles zeros forever.
fn endless_server() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut reader = std::io::BufReader::new(&conn);
                while reader.read_line(&mut String::new()).is_ok_and(|n| n > 2) {}
                let mut conn = &conn;
                let mut header = [0u8; 64];
                header[..5].copy_from_slice(b"\x7fELF\x02");
                header[0x28..0x30].copy_from_slice(&(3u64 << 29).to_le_bytes());
                let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
                let _ = conn.write_all(&header);
                while conn.write_all(&[0u8; 4096]).is_ok() {
                    std::thread::sleep(Duration::from_millis(10));
                }
            });
        }
    });
    url
}

// A debuginfod server that never finishes its answer: the recording ends within its budget,
// and nothing it sent is left in the cache.
fn endless_debuginfod(user: &User, dir: &Path) {
    let (bin, _) = stripped_copy(user, dir, false);
    let cache = dir.join("debuginfod-cache");
    let url = endless_server();
    let env = [
        ("DEBUGINFOD_URLS", url.as_str()),
        ("DEBUGINFOD_CACHE_PATH", cache.to_str().unwrap()),
    ];
    let run = record_as_user("endless-debuginfod", user, &bin, &env);
    assert!(run.ok, "{}", run.stderr);
    assert!(run.took < Duration::from_secs(25), "took {:?}", run.took);
    assert!(run.peak_mib < 200, "peak RSS {} MiB", run.peak_mib);
    assert!(run.stderr.contains("debuginfod"), "{}", run.stderr);
    let left: u64 = walk(&cache)
        .iter()
        .map(|p| p.metadata().map_or(0, |m| m.len()))
        .sum();
    assert_eq!(left, 0, "the cache holds {left} bytes of the answer");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return vec![];
    };
    rd.flatten()
        .flat_map(|e| match e.path().is_dir() {
            true => walk(&e.path()),
            false => vec![e.path()],
        })
        .collect()
}

/// Processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

// Checks kill -9 of `record -- CMD` while the command execs programs that are held at each
// exec (tables built first): within 2 s nothing of the command is left stopped, 10 of 10.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn kill_9_during_holds_leaves_nothing_stopped() {
    require_root!();
    let _g = bpf_lock();
    let out = scratch("kill9-hold").join("out.phaseprof");
    for round in 0..10 {
        let child = Command::new(phaseprof_bin())
            .args([
                "record",
                "--unwind",
                "dwarf",
                "-o",
                out.to_str().unwrap(),
                "--",
            ])
            .args(["sh", "-c", "while :; do /bin/true; done"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut p = Killed(child);
        let pp = p.0.id();
        let deadline = Instant::now() + Duration::from_secs(20);
        // The command is phaseprof's child (its watchdog is no one's: it forks twice).
        let sh = loop {
            if let Some(&c) = children(pp).first() {
                break c;
            }
            assert!(Instant::now() < deadline, "no command started");
            std::thread::sleep(Duration::from_millis(50));
        };
        // Into the loop of execs, each held until its tables are in, at a different moment.
        std::thread::sleep(Duration::from_millis(1000 + 97 * round));
        p.0.kill().unwrap();
        let _ = p.0.wait();
        let killed = Instant::now();
        let mut stopped = vec![];
        while killed.elapsed() < Duration::from_secs(2) {
            stopped = std::iter::once(sh)
                .chain(children(sh))
                .filter(|&c| state(c) == Some('T'))
                .collect();
            if stopped.is_empty() && state(sh).is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let still: Vec<u32> = std::iter::once(sh).chain(children(sh)).collect();
        for c in &still {
            // SAFETY: kill with a valid signal; the command's processes are ours to end.
            unsafe { libc::kill(*c as i32, libc::SIGKILL) };
        }
        assert!(
            stopped.is_empty(),
            "round {round}: still stopped 2 s after kill -9: {stopped:?}"
        );
        eprintln!("kill -9 round {round}: the command ran on");
    }
}
