//! `record -- CMD` at a terminal, as an SRE runs it: Ctrl-C typed on a pty, a `kill` of phaseprof,
//! the end of `--duration`. The command is stopped (never orphaned), the file is written and
//! phaseprof exits with the command's status, as perf and strace do.
use std::time::Duration;

use phaseprof_e2e::*;

use crate::require_root;

/// A shell that says `ready`, then waits in short sleeps until SIGINT makes it exit with `code`.
fn interruptible(code: u8) -> String {
    format!("trap 'exit {code}' INT; echo ready; while :; do sleep 0.05; done")
}

/// The pid in `the command (pid N)` of phaseprof's closing line.
fn command_pid(output: &str) -> u32 {
    let at = output
        .find("the command (pid ")
        .expect("closing line names the command")
        + 17;
    output[at..]
        .split(')')
        .next()
        .unwrap()
        .parse()
        .expect("a pid")
}

/// Checks that `pid` has exited (reaped, not a zombie) and no process is its child.
fn assert_gone(pid: u32) {
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the command (pid {pid}) still exists"
    );
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().nth(1));
        assert_ne!(
            ppid,
            Some(pid.to_string().as_str()),
            "a child of {pid} remains: {stat}"
        );
    }
}

/// Checks how a `record -- CMD` ended: phaseprof's status is the command's, its closing line says
/// `why`, the command is gone with all it started, and the file was written.
fn assert_ended(o: &std::process::Output, status: i32, why: &str, out: &std::path::Path) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(status), "{err}");
    assert!(err.contains(why), "{err}");
    assert_gone(command_pid(&err));
    assert!(out.exists());
}

// Checks Ctrl-C typed at a terminal: the command (in the same foreground group) gets SIGINT from
// the terminal, once, exits by its handler, and phaseprof writes the file and returns its status.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn ctrl_c_at_a_terminal_ends_the_command_and_the_recording() {
    require_root!();
    let _g = bpf_lock();
    let out = scratch("terminal-ctrl-c").join("t.phaseprof");
    let script = interruptible(7);
    let mut pty = Pty::spawn(
        &phaseprof_bin(),
        &[
            "record",
            "-o",
            out.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            &script,
        ],
    );
    pty.wait_for("ready", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(300));
    pty.type_bytes(b"\x03");
    let code = pty.wait_exit(Duration::from_secs(20));
    let output = pty.output();
    assert_eq!(code, 7, "{output}");
    assert!(
        output
            .contains("exited with status 7 after SIGINT from the terminal (which reached it too)"),
        "{output}"
    );
    assert_gone(command_pid(&output));
    let report = report_json(&out);
    assert!(num(&report["events"]["syscall"]["count"]) > 0, "{report}");
}

// Checks `kill -INT <phaseprof>` (the command does not get it from anywhere else): forwarded, the
// command exits by its handler, the status is phaseprof's.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn a_signal_to_phaseprof_is_forwarded_to_the_command() {
    require_root!();
    let _g = bpf_lock();
    let out = scratch("terminal-kill").join("t.phaseprof");
    let script = interruptible(5);
    let mut rec = std::process::Command::new(phaseprof_bin());
    rec.args([
        "record",
        "-o",
        out.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        &script,
    ])
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped());
    // As from a shell at a terminal: SIGINT not ignored (an ignored one stays ignored).
    // SAFETY: default_signals only calls signal(2), async-signal-safe.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut rec, || {
            default_signals();
            Ok(())
        })
    };
    let mut rec = rec.spawn().unwrap();
    let mut stdout = std::io::BufReader::new(rec.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    // SAFETY: signalling the phaseprof we started.
    unsafe { libc::kill(rec.id() as i32, libc::SIGINT) };
    let o = rec.wait_with_output().unwrap();
    assert_ended(&o, 5, "after SIGINT from a process, forwarded to it", &out);
}

// Checks `--duration` with a command: SIGTERM at its end (as `timeout` sends), the command and
// what it started stopped, the status (128 + SIGTERM) returned; and a plain exit status passed on.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn duration_stops_the_command_and_statuses_pass_through() {
    require_root!();
    let _g = bpf_lock();
    let out = scratch("terminal-duration").join("t.phaseprof");
    let o = phaseprof(&[
        "record",
        "--duration",
        "1s",
        "-o",
        out.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "sleep 60; true",
    ]);
    assert_ended(&o, 143, "after SIGTERM at the end of --duration", &out);

    let o = phaseprof(&[
        "record",
        "-o",
        out.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "exit 3",
    ]);
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
