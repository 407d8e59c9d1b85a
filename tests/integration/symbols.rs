//! Symbolization of targets in other languages.

use phaseprof_e2e::*;

use crate::require_root;

// Checks that a Go binary with symbols resolves to Go names: the burn function, under the Go
// runtime's entry frames, takes ≥90% of the samples of the main goroutine's path. The workload
// burns 800 ms of its own CPU time (~79 samples at 99 Hz however busy the machine is).
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn go_frames_have_go_names() {
    require_root!();
    let Some(bin) = go_workload("go-spin") else {
        eprintln!("SKIPPED: Go is not installed");
        return;
    };
    let _g = bpf_lock();
    let (out, truth) = record_workload("gospin", &[], &bin, &["800"]);
    let burn_fn = truth["burn_fn"].as_str().unwrap();
    // Only the main goroutine's work counts: runtime threads (sysmon, GC workers) have no
    // main.main frame and may take samples when the machine is busy.
    let (_, main_path) = folded_cpu_share(&out, |stack| stack.contains("runtime.main;main.main"));
    let (_, hot) = folded_cpu_share(&out, |stack| {
        stack.contains("runtime.main;main.main;") && stack.split(';').any(|f| f == burn_fn)
    });
    eprintln!("{hot}/{main_path} samples of main.main in {burn_fn}");
    assert!(
        main_path >= 50 && hot as f64 >= 0.9 * main_path as f64,
        "{hot}/{main_path}"
    );
}

// Checks that a program run by a symlink is named as it was run, as Debian's redis-server (a
// link to redis-check-rdb) is: Debian's gzip run by a link `my-gzip`, with `-- CMD` and with
// `-p`, is `my-gzip` in the report's header, its frames and the pprof mapping, not `gzip`.
#[test]
#[ignore = "needs root: run as root with --include-ignored"]
fn a_program_is_named_as_it_was_run() {
    require_root!();
    let _g = bpf_lock();
    let dir = scratch("run-name");
    let link = dir.join("my-gzip");
    std::os::unix::fs::symlink("/usr/bin/gzip", &link).unwrap();
    let input = dir.join("input.bin");
    std::fs::write(&input, vec![7u8; 64 << 20]).unwrap();
    let named_as_run = |out: &std::path::Path| {
        let report = report_json(out);
        assert_eq!(report["target"]["exe"], link.to_str().unwrap());
        let path = out.to_str().unwrap();
        let args = [
            "export", path, "--format", "folded", "--event", "syscall", "-o", "-",
        ];
        let folded = String::from_utf8(phaseprof_ok(&args).stdout).unwrap();
        assert!(folded.contains("my-gzip"), "{folded}");
        assert!(
            !folded.contains(";gzip+") && !folded.starts_with("gzip+"),
            "{folded}"
        );
    };

    let out = dir.join("cmd.phaseprof");
    let o = std::process::Command::new(phaseprof_bin())
        .args([
            "record",
            "--events",
            "syscall",
            "-o",
            out.to_str().unwrap(),
            "--",
        ])
        .arg(&link)
        .args(["-c", input.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    named_as_run(&out);

    // By pid: gzip reading a pipe we feed after attaching.
    let mut gz = Killed(
        std::process::Command::new(&link)
            .arg("-c")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let out = dir.join("pid.phaseprof");
    let pid = gz.0.id().to_string();
    let (rec, _err) = record_until_attached(&[
        "--pid".as_ref(),
        pid.as_ref(),
        "--events".as_ref(),
        "syscall".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    let mut rec = Killed(rec);
    let mut stdin = gz.0.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, &vec![7u8; 8 << 20]).unwrap();
    drop(stdin);
    assert!(gz.0.wait().unwrap().success());
    assert!(rec.0.wait().unwrap().success());
    named_as_run(&out);
}
