//! The default events' cost (`--only defaults`): what each event costs in the kernel per stack
//! walk (frame pointers, unwind tables, stack copy), what the tables cost to build and hold, and
//! the slowdown of validator-sim and of `dd` under the defaults, each against bare and against
//! bpftrace doing the same recording, alternating in one run; and (`--only switches`) on a
//! program that does nothing but switch (`perf bench sched pipe`), the slowdown printed beside
//! the measured.
use std::process::{Command, Stdio};

use phaseprof_e2e::{rust_workload, rust_workload_without_frame_pointers, truth_from};

use super::measure::{median, run, sim_args};

/// bpftrace recording what phaseprof's defaults record: cpu stacks at 99 Hz, off-CPU time by
/// stack, syscall counts and latency with a user stack per syscall (bpftrace has no sampling).
pub(super) const BPFTRACE_DEFAULTS: &str =
    "profile:hz:99 /pid == cpid/ { @cpu[ustack, kstack] = count(); } \
     tracepoint:sched:sched_switch /pid == cpid/ { @off[tid] = nsecs; @offstack[tid] = ustack; } \
     tracepoint:sched:sched_switch /@off[args->next_pid]/ { @offcpu[@offstack[args->next_pid]] = \
     sum(nsecs - @off[args->next_pid]); delete(@off[args->next_pid]); } \
     tracepoint:raw_syscalls:sys_enter /pid == cpid/ { @s[tid] = nsecs; @u[ustack] = count(); } \
     tracepoint:raw_syscalls:sys_exit /pid == cpid && @s[tid]/ { @n[args->id] = count(); \
     @t[args->id] = sum(nsecs - @s[tid]); delete(@s[tid]); }";

/// Which way to run a program: bare, under `phaseprof record` with these flags, or bpftrace.
#[derive(Clone, Copy)]
enum Under<'a> {
    Bare,
    Phaseprof(&'a [&'a str]),
    Bpftrace,
}

fn command(pp: &std::path::Path, tmp: &str, how: Under, argv: &[String]) -> Command {
    match how {
        Under::Bare => {
            let mut c = Command::new(&argv[0]);
            c.args(&argv[1..]);
            c
        }
        Under::Phaseprof(flags) => {
            let mut c = Command::new(pp);
            c.arg("record")
                .args(flags)
                .args(["-o", tmp, "--"])
                .args(argv);
            c
        }
        Under::Bpftrace => {
            let mut c = Command::new("bpftrace");
            c.args(["-q", "-e", BPFTRACE_DEFAULTS, "-c", &argv.join(" ")]);
            c
        }
    }
}

/// The program's own elapsed time in seconds: validator-sim's truth line, or dd's summary.
fn elapsed(pp: &std::path::Path, tmp: &str, how: Under, argv: &[String]) -> f64 {
    let mut c = command(pp, tmp, how, argv);
    if argv[0].ends_with("dd") {
        let o = c.stdout(Stdio::null()).output().expect("run dd");
        let err = String::from_utf8_lossy(&o.stderr);
        // "1228800000 bytes (1.2 GB, 1.1 GiB) copied, 0.43 s, 2.9 GB/s"
        let secs = err.lines().find_map(|l| {
            l.split(", ")
                .nth(2)?
                .strip_suffix(" s")?
                .parse::<f64>()
                .ok()
        });
        return secs.unwrap_or_else(|| panic!("no dd summary in {err}"));
    }
    truth_from(run(&mut c).as_bytes())["elapsed_ns"]
        .as_f64()
        .unwrap()
        / 1e9
}

/// Slowdowns of each program under the defaults and under bpftrace, alternating.
fn slowdowns(pp: &std::path::Path, tmp: &str, rounds: usize, has_bpftrace: bool) {
    let sim_args = sim_args("40");
    let argv = |bin: &std::path::Path, args: &[String]| -> Vec<String> {
        std::iter::once(bin.display().to_string())
            .chain(args.iter().cloned())
            .collect()
    };
    let dd: Vec<String> = ["if=/dev/zero", "of=/dev/null", "bs=4k", "count=300000"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    let programs = [
        (
            "validator-sim, frame-pointer build",
            argv(&rust_workload("validator-sim"), &sim_args),
        ),
        (
            "validator-sim, no frame pointers (tables)",
            argv(
                &rust_workload_without_frame_pointers("validator-sim"),
                &sim_args,
            ),
        ),
        (
            "dd bs=4k count=300000 (tables)",
            argv(std::path::Path::new("/usr/bin/dd"), &dd),
        ),
    ];
    let mut ways: Vec<(&str, Under)> = vec![
        ("bare", Under::Bare),
        ("phaseprof defaults", Under::Phaseprof(&[])),
        (
            "phaseprof --syscall-stacks all",
            Under::Phaseprof(&["--syscall-stacks", "all"]),
        ),
    ];
    if has_bpftrace {
        ways.push(("bpftrace, same events", Under::Bpftrace));
    }
    for (name, argv) in &programs {
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
        for _ in 0..rounds {
            for (i, (_, how)) in ways.iter().enumerate() {
                times[i].push(elapsed(pp, tmp, *how, argv));
            }
        }
        let bare = median(times[0].clone());
        println!("{name}, its own elapsed time, median of {rounds} alternating rounds:");
        for ((label, _), t) in ways.iter().zip(times) {
            let t = median(t);
            println!(
                "  {label:<32} {:9.1} ms  ratio {:.3}x ({:+.2}%)",
                t * 1e3,
                t / bare,
                100.0 * (t / bare - 1.0)
            );
        }
    }
}

/// A program that does nothing but switch: Debian's `perf bench sched pipe -T` (two threads
/// handing a byte over pipes, ~600,000 switches a second), pinned to CPU 0, its own µs per
/// operation bare, under the defaults (syscalls at the 1% budget, as on a running process) and
/// under the defaults with every switch-out's stack (`--offcpu-stacks all`, the default before
/// sampled off-CPU stacks), alternating; beside each the slowdown phaseprof printed
/// (`probe_cost.slowdown`). The
/// scheduler's programs are most of the cost here: the printed figure counts their own time,
/// not what they cost the target outside it (caches, the tracepoint's entry).
pub fn switch_bound_bench(pp: &std::path::Path, tmp: &str, rounds: usize) {
    let argv: Vec<String> = ["taskset", "-c", "0", "perf", "bench", "sched", "pipe", "-T"]
        .iter()
        .chain(&["-l", "200000"])
        .map(|a| a.to_string())
        .collect();
    let usecs = |out: &str| -> f64 {
        (out.lines())
            .find_map(|l| l.trim().strip_suffix("usecs/op")?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no usecs/op from perf bench: {out}"))
    };
    let configs: [(&str, &[&str]); 2] = [
        ("phaseprof defaults", &["--syscall-budget", "1%"]),
        (
            "defaults, every switch-out's stack (--offcpu-stacks all)",
            &["--syscall-budget", "1%", "--offcpu-stacks", "all"],
        ),
    ];
    let mut bare = Vec::new();
    let mut under = vec![(Vec::new(), Vec::new()); configs.len()];
    for _ in 0..rounds {
        bare.push(usecs(&run(&mut command(pp, tmp, Under::Bare, &argv))));
        for ((_, flags), (us, printed)) in configs.iter().zip(&mut under) {
            us.push(usecs(&run(&mut command(
                pp,
                tmp,
                Under::Phaseprof(flags),
                &argv,
            ))));
            let report: serde_json::Value =
                serde_json::from_str(&run(Command::new(pp).args(["report", "--json", tmp])))
                    .unwrap();
            printed.push(
                report["probe_cost"]["slowdown"]
                    .as_f64()
                    .unwrap_or(f64::NAN),
            );
        }
    }
    let bare = median(bare);
    println!(
        "perf bench sched pipe -T (pinned to one CPU), its own µs per operation, median of \
         {rounds} alternating rounds:\n  bare {bare:.2} µs"
    );
    for ((name, _), (us, printed)) in configs.iter().zip(under) {
        let (us, printed) = (median(us), median(printed));
        println!(
            "  {name} {us:.2} µs: {:+.1}% measured, {:+.1}% printed ({:+.0}% vs measured)",
            100.0 * (us / bare - 1.0),
            100.0 * printed,
            100.0 * (printed / (us / bare - 1.0) - 1.0)
        );
    }
}

/// Mean ns per run of each of our programs whose name starts with one of `names`, from the
/// kernel's BPF statistics, read while `phaseprof record` runs `argv` with `flags`.
fn program_costs(pp: &std::path::Path, tmp: &str, flags: &[&str], argv: &[String]) -> Vec<f64> {
    let mut rec = command(pp, tmp, Under::Phaseprof(flags), argv)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let out = Command::new("bpftool")
        .args(["prog", "show", "--json"])
        .output();
    let _ = rec.wait();
    let progs: serde_json::Value = out
        .ok()
        .and_then(|o| serde_json::from_slice(&o.stdout).ok())
        .unwrap_or_default();
    PROGRAMS
        .iter()
        .map(|(prefix, _)| {
            progs
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
                .and_then(|p| Some(p["run_time_ns"].as_f64()? / p["run_cnt"].as_f64()?.max(1.0)))
                .unwrap_or(f64::NAN)
        })
        .collect()
}

/// Our programs that take user stacks (the kernel cuts names to 15 characters).
const PROGRAMS: [(&str, &str); 4] = [
    ("perf_event__sam", "cpu sample"),
    ("raw_tp__sys_ent", "syscall entry"),
    ("raw_tp__sys_exi", "syscall exit"),
    ("tp_btf__sched_s", "sched_switch"),
];

/// Per-event cost of each way to walk a user stack, from the kernel's BPF statistics.
fn per_event_costs(pp: &std::path::Path, tmp: &str, rounds: usize) {
    // ~5 s: still running when the statistics are read, 2.5 s in.
    let args = sim_args("400");
    let fp = std::iter::once(rust_workload("validator-sim").display().to_string())
        .chain(args)
        .collect::<Vec<_>>();
    let mut nofp = fp.clone();
    nofp[0] = rust_workload_without_frame_pointers("validator-sim")
        .display()
        .to_string();
    let ways: [(&str, &[&str], &Vec<String>); 4] = [
        (
            "no syscall stacks (baseline)",
            &["--unwind", "fp", "--syscall-stacks", "none"],
            &fp,
        ),
        (
            "frame-pointer walk",
            &["--unwind", "fp", "--syscall-stacks", "all"],
            &fp,
        ),
        (
            "unwind tables (BPF)",
            &["--unwind", "dwarf", "--syscall-stacks", "all"],
            &nofp,
        ),
        (
            "16 KiB stack copy",
            &["--unwind", "copy", "--syscall-stacks", "none"],
            &nofp,
        ),
    ];
    let stats_before =
        std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").unwrap_or_default();
    let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1");
    let mut costs: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); PROGRAMS.len()]; ways.len()];
    for _ in 0..rounds {
        for (i, (_, flags, argv)) in ways.iter().enumerate() {
            for (j, ns) in program_costs(pp, tmp, flags, argv).into_iter().enumerate() {
                costs[i][j].push(ns);
            }
        }
    }
    let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", stats_before.trim());
    // Frames per table walk, from the last recording under tables.
    let frames = Command::new(pp)
        .args([
            "record",
            "--unwind",
            "dwarf",
            "--syscall-stacks",
            "all",
            "-o",
            tmp,
            "--",
        ])
        .args(&nofp)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .ok()
        .and_then(|_| {
            let r: serde_json::Value =
                serde_json::from_str(&run(Command::new(pp).args(["report", "--json", tmp])))
                    .ok()?;
            let w = &r["events"]["cpu"]["unwind"]["walks"];
            Some(w["frames"].as_f64()? / w["stacks"].as_f64()?.max(1.0))
        })
        .unwrap_or(f64::NAN);
    println!(
        "ns per program run (kernel BPF statistics, validator-sim, median of {rounds}; \
         ~{frames:.1} frames per table walk):"
    );
    print!("  {:<30}", "user stacks by");
    for (_, name) in PROGRAMS {
        print!(" {name:>14}");
    }
    println!();
    for ((label, _, _), c) in ways.iter().zip(costs) {
        print!("  {label:<30}");
        for ns in c.into_iter().map(median) {
            print!(" {ns:>11.0} ns");
        }
        println!();
    }
}

/// The tables for a big binary (rustc's driver library, ~150 MB) and for libc: rows, kernel
/// memory, build time, via `phaseprof unwind-table`.
fn table_costs(pp: &std::path::Path) {
    let sysroot = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let driver = std::fs::read_dir(format!("{sysroot}/lib"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("librustc_driver"))
        });
    let files = driver
        .into_iter()
        .chain(std::iter::once("/lib/x86_64-linux-gnu/libc.so.6".into()));
    println!("unwind tables (`phaseprof unwind-table`):");
    for f in files {
        let out = run(Command::new(pp).arg("unwind-table").arg(&f));
        println!("  {}", out.trim());
    }
}

pub fn defaults_bench(pp: &std::path::Path, tmp: &str, rounds: usize, has_bpftrace: bool) {
    table_costs(pp);
    per_event_costs(pp, tmp, rounds);
    slowdowns(pp, tmp, rounds, has_bpftrace);
}
