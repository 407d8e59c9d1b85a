//! `record -p` follows the children its targets fork after attach, as `strace -f -p` does:
//! Debian's bash, attached while it waits, then running dd and gzip.
use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use phaseprof_e2e::*;

use crate::exactness::fixed_file;
use crate::require_root;

/// The shell attached to: blocked reading its stdin, then two children that write.
const SCRIPT: &str = "read go; dd if=/dev/zero of=/dev/null bs=512 count=3000 2>/dev/null; \
                      gzip -c \"$0\" > /dev/null; echo done";

/// Starts the shell on `input`, attaches `phaseprof record -p` (with `flags`) and
/// `strace -f -c -p` to it, lets it go, and returns (our report, strace's counts by name).
fn shell_under_both(name: &str, flags: &[&str]) -> (serde_json::Value, BTreeMap<String, u64>) {
    let dir = scratch(name);
    let input = dir.join("input.bin");
    fixed_file(&input);
    let mut shell = Killed(
        Command::new("bash")
            .args(["-c", SCRIPT])
            .arg(&input)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = shell.0.id().to_string();
    let out = dir.join("shell.phaseprof");
    let mut args: Vec<&std::ffi::OsStr> = vec!["--pid".as_ref(), pid.as_ref()];
    args.extend(flags.iter().map(std::ffi::OsStr::new));
    for arg in ["--events", "syscall", "-o"] {
        args.push(arg.as_ref());
    }
    args.push(out.as_os_str());
    let (rec, _stderr) = record_until_attached(&args);
    let mut rec = Killed(rec);
    let st = dir.join("strace.txt");
    let mut strace = Killed(
        Command::new("strace")
            .args(["-f", "-c", "-o", st.to_str().unwrap(), "-p", &pid])
            .stderr(Stdio::piped())
            .spawn()
            .expect("strace is installed by the setup"),
    );
    let mut errs = std::io::BufReader::new(strace.0.stderr.take().unwrap());
    let line = read_until(&mut errs, "attached");
    assert!(line.contains("attached"), "strace did not attach: {line}");
    shell.0.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(shell.0.wait().unwrap().success());
    assert!(rec.0.wait().unwrap().success());
    assert!(strace.0.wait().unwrap().success());
    let summary = std::fs::read_to_string(&st).unwrap();
    (report_json(&out), strace_counts(&summary))
}

/// A report's syscall counts by name.
fn counts(report: &serde_json::Value) -> BTreeMap<String, u64> {
    (report["events"]["syscall"]["by_name"]
        .as_object()
        .unwrap()
        .iter())
    .map(|(k, v)| (k.clone(), v["count"].as_u64().unwrap()))
    .collect()
}

// Checks that `record -p` counts the syscalls of the children forked after attach exactly as
// `strace -f -p` does (neither counts the read(stdin) in flight when they attached, which
// phaseprof reports as such; strace lists no exit_group), and that `--no-follow` records the
// shell alone.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn record_pid_follows_children_as_strace_f_does() {
    require_root!();
    let _g = bpf_lock();
    let (report, expected) = shell_under_both("follow", &[]);
    let pids = report["target"]["pids"].as_array().unwrap().len();
    assert_eq!(pids, 3, "the shell, dd and gzip: {}", report["target"]);
    let mut ours = counts(&report);
    assert_eq!(ours.remove("exit_group"), Some(3));
    assert_eq!(report["lost"]["syscalls_in_flight_at_start"], 1);
    eprintln!(
        "writes: ours {:?}, strace {:?}",
        ours.get("write"),
        expected.get("write")
    );
    assert!(ours["write"] > 3000, "{ours:?}");
    assert_eq!(ours, expected);

    let (alone, _) = shell_under_both("no-follow", &["--no-follow"]);
    assert_eq!(alone["target"]["pids"].as_array().unwrap().len(), 1);
    let writes = counts(&alone).get("write").copied().unwrap_or(0);
    assert!(writes < 10, "the shell's own writes only: {writes}");
}
