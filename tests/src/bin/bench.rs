//! `bench`: phaseprof's overhead, measured A/B alternating in one run, printed (never asserted).
//!
//! Run as root after `cargo build --release --workspace`: `target/release/bench [--rounds N]`.
//! Prints: ns per syscall of a getppid loop bare / with our probes attached but the loop not a
//! target (the floor) / under `record` (stacks on and off) / under bpftrace doing the same
//! counting; validator-sim's wall time bare vs recorded; the agent's CPU% and peak RSS while
//! recording a 16-thread validator-sim at 99 Hz.
use std::process::{Command, Stdio};
use std::time::Instant;

use phaseprof_e2e::{phaseprof_bin, read_until, rust_workload, truth_from};

const LOOP_CALLS: u64 = 2_000_000;

fn syscall_loop(n: u64) {
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: getppid has no preconditions.
        unsafe { libc::getppid() };
    }
    println!("{}", t.elapsed().as_nanos() as f64 / n as f64);
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Runs `cmd`, returning its stdout.
fn run(cmd: &mut Command) -> String {
    let o = cmd.stderr(Stdio::null()).output().expect("run");
    assert!(o.status.success(), "{cmd:?} failed");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn ns_per_call(out: &str) -> f64 {
    out.lines()
        .filter_map(|l| l.trim().parse::<f64>().ok())
        .next_back()
        .expect("loop printed ns/call")
}

/// CPU seconds and peak RSS (KiB) of a child, via wait4.
fn wait_rusage(child: std::process::Child) -> (f64, i64) {
    let pid = child.id() as i32;
    let mut status = 0;
    // SAFETY: rusage is plain data that wait4 fills; pid is our child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to status and rusage; waiting on our own child.
    unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    std::mem::forget(child); // reaped above
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (secs(ru.ru_utime) + secs(ru.ru_stime), ru.ru_maxrss)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("syscall-loop") {
        syscall_loop(args[2].parse().unwrap());
        return;
    }
    let rounds: usize = args
        .iter()
        .position(|a| a == "--rounds")
        .map(|i| args[i + 1].parse().unwrap())
        .unwrap_or(5);
    let me = std::env::current_exe().unwrap();
    let pp = phaseprof_bin();
    let tmp = std::env::temp_dir().join("phaseprof-bench.phaseprof");
    let tmp = tmp.to_str().unwrap();
    let n = LOOP_CALLS.to_string();
    let has_bpftrace = Command::new("bpftrace").arg("--version").output().is_ok();
    if has_bpftrace && !std::path::Path::new("/sys/kernel/tracing/events").exists() {
        // bpftrace's tracepoints need tracefs, which these machines do not mount at boot.
        let _ = Command::new("mount")
            .args(["-t", "tracefs", "nodev", "/sys/kernel/tracing"])
            .status();
    }

    // 1. Syscall-heavy loop: every variant once per round, rounds alternating. Each variant
    //    returns the loop's ns per call.
    let loop_cmd = format!("{} syscall-loop {n}", me.display());
    let measure = |mut c: Command| {
        // bpftrace prints its maps after the loop's own line; keep the loop's number.
        let out = run(&mut c);
        let own: Vec<&str> = out.lines().filter(|l| !l.starts_with('@')).collect();
        ns_per_call(&own.join("\n"))
    };
    let bare = || {
        let mut c = Command::new(&me);
        c.args(["syscall-loop", &n]);
        c
    };
    let bpftrace = |script: &'static str| {
        let mut c = Command::new("bpftrace");
        c.args(["-q", "-e", script, "-c", &loop_cmd]);
        c
    };
    let record = |extra: &[&str]| {
        let mut c = Command::new(&pp);
        c.arg("record")
            .args(extra)
            .args(["-o", tmp, "--"])
            .arg(&me)
            .args(["syscall-loop", &n]);
        c
    };
    // Our own floor: probes attached (recording a decoy), the loop not a target.
    let attached_not_target = || {
        let mut decoy = Command::new("sleep").arg("3600").spawn().expect("sleep");
        let mut agent = Command::new(&pp)
            .args([
                "record",
                "-v",
                "--events",
                "syscall",
                "--pid",
                &decoy.id().to_string(),
                "-o",
                tmp,
            ])
            .stderr(Stdio::piped())
            .spawn()
            .expect("phaseprof");
        let mut stderr = std::io::BufReader::new(agent.stderr.take().expect("piped"));
        read_until(&mut stderr, "probes attached");
        let ns = measure(bare());
        // SAFETY: signalling a child we spawned.
        unsafe { libc::kill(agent.id() as i32, libc::SIGINT) };
        let _ = agent.wait();
        let _ = decoy.kill();
        let _ = decoy.wait();
        ns
    };
    let mut variants: Vec<(&str, Box<dyn Fn() -> f64 + '_>)> = vec![
        ("bare", Box::new(|| measure(bare()))),
        (
            "phaseprof attached, loop not a target",
            Box::new(attached_not_target),
        ),
        (
            "record --syscall-stacks false",
            Box::new(|| measure(record(&["--syscall-stacks", "false"]))),
        ),
        (
            "record (syscall stacks on)",
            Box::new(|| measure(record(&[]))),
        ),
    ];
    if has_bpftrace {
        // The rows of BPF-NOTES, re-measured in this run: bpftrace probes doing the same jobs.
        variants.push((
            "bpftrace: empty enter+exit probes",
            Box::new(|| {
                measure(bpftrace(
                    "tracepoint:raw_syscalls:sys_enter /pid == cpid/ {} tracepoint:raw_syscalls:sys_exit /pid == cpid/ {}",
                ))
            }),
        ));
        variants.push((
            "bpftrace: count + latency",
            Box::new(|| {
                measure(bpftrace(
                    "tracepoint:raw_syscalls:sys_enter /pid == cpid/ { @s[tid] = nsecs; } \
                     tracepoint:raw_syscalls:sys_exit /pid == cpid && @s[tid]/ { @n = count(); @t = sum(nsecs - @s[tid]); delete(@s[tid]); }",
                ))
            }),
        ));
        variants.push((
            "bpftrace: count + latency + ustack",
            Box::new(|| {
                measure(bpftrace(
                    "tracepoint:raw_syscalls:sys_enter /pid == cpid/ { @s[tid] = nsecs; @u[ustack] = count(); } \
                     tracepoint:raw_syscalls:sys_exit /pid == cpid && @s[tid]/ { @n = count(); @t = sum(nsecs - @s[tid]); delete(@s[tid]); }",
                ))
            }),
        ));
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
    for _ in 0..rounds {
        for (i, (_, variant)) in variants.iter_mut().enumerate() {
            samples[i].push(variant());
        }
    }
    let b = median(samples[0].clone());
    println!("getppid loop, median of {rounds} alternating rounds ({LOOP_CALLS} calls each):");
    for ((label, _), s) in variants.iter().zip(samples) {
        let m = median(s);
        println!(
            "  {label:<36} {m:8.1} ns/call  ratio {:.2}x  (+{:.0} ns)",
            m / b,
            m - b
        );
    }

    // 2. validator-sim, default events, A/B alternating.
    let sim = rust_workload("validator-sim");
    let sim_args = [
        "--blocks",
        "40",
        "--threads",
        "2",
        "--burn-ms",
        "10",
        "--flushes",
        "200",
        "--sleep-ms",
        "2",
        "--clone-bytes",
        "65536",
    ];
    let (mut sb, mut sr) = (vec![], vec![]);
    for _ in 0..rounds {
        let t = truth_from(run(Command::new(&sim).args(sim_args)).as_bytes());
        sb.push(t["elapsed_ns"].as_f64().unwrap());
        let t = truth_from(
            run(Command::new(&pp)
                .args(["record", "-o", tmp, "--"])
                .arg(&sim)
                .args(sim_args))
            .as_bytes(),
        );
        sr.push(t["elapsed_ns"].as_f64().unwrap());
    }
    let (sb, sr) = (median(sb), median(sr));
    println!(
        "validator-sim {}: bare {:.1} ms, recorded {:.1} ms, ratio {:.4}x",
        sim_args.join(" "),
        sb / 1e6,
        sr / 1e6,
        sr / sb
    );

    // 3. Agent cost while recording a 16-thread target at 99 Hz: steady state (CPU time read
    //    from /proc between 3 s and 28 s) and in total (wait4, including load and first
    //    symbolization), with peak RSS.
    let mut target = Command::new(&sim)
        .args([
            "--blocks",
            "1500",
            "--threads",
            "16",
            "--burn-ms",
            "2",
            "--flushes",
            "8",
            "--sleep-ms",
            "20",
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let agent = Command::new(&pp)
        .args([
            "record",
            "--pid",
            &target.id().to_string(),
            "--duration",
            "30s",
            "-o",
            tmp,
        ])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let cpu_now = |pid: u32| -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, r)| r.split_whitespace().collect())
            .unwrap_or_default();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        (fields
            .get(11)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            + fields
                .get(12)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0))
            / hz
    };
    std::thread::sleep(std::time::Duration::from_secs(3));
    let (c0, t0) = (cpu_now(agent.id()), Instant::now());
    std::thread::sleep(std::time::Duration::from_secs(25));
    let (c1, steady_wall) = (cpu_now(agent.id()), t0.elapsed().as_secs_f64());
    let (cpu, rss_kib) = wait_rusage(agent);
    let wall = t.elapsed().as_secs_f64();
    let _ = target.kill();
    let _ = target.wait();
    println!(
        "agent recording a 16-thread validator-sim at 99 Hz: steady state {:.2}% of one core; \
         whole {wall:.1} s run incl. load and symbolization {:.2}%; peak RSS {:.1} MiB",
        100.0 * (c1 - c0) / steady_wall,
        100.0 * cpu / wall,
        rss_kib as f64 / 1024.0
    );
}
