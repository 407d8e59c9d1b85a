//! `bench`: phaseprof's overhead, measured A/B alternating in one run, printed (never asserted).
//!
//! Run as root after `cargo build --release --workspace`:
//! `target/release/bench [--rounds N] [--only syscalls|sim|phases|alloc|web|fleet|agent|unwind]`.
//! Prints: ns per syscall of a getppid loop bare / with our probes attached but the loop not a
//! target (the floor) / under `record` (stacks on and off) / under bpftrace doing the same
//! counting; validator-sim's wall time bare vs recorded; the agent's CPU% and peak RSS while
//! recording a 16-thread validator-sim at 99 Hz; ns per malloc/free pair with allocator probes at
//! the function entry vs at the chosen (emulated) instruction; validator-sim's slowdown with
//! allocation probes, with and without `--alloc-budget 1%`; flamegraph render time and SVG size
//! for 50k unique stacks, and the profile page's load time from `phaseprof serve`; the
//! agent's CPU per 1,000 samples and the target's slowdown with frame-pointer vs dwarf unwinding.
use std::process::{Command, Stdio};
use std::time::Instant;

use phaseprof_e2e::{go_workload, phaseprof_bin, read_until, root, rust_workload, truth_from};

const LOOP_CALLS: u64 = 2_000_000;

fn syscall_loop(n: u64) {
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: getppid has no preconditions.
        unsafe { libc::getppid() };
    }
    println!("{}", t.elapsed().as_nanos() as f64 / n as f64);
}

/// malloc + free pairs of `size` bytes through libc; prints ns per pair.
fn alloc_loop(n: u64, size: usize) {
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: a plain malloc/free pair; the pointer is only passed back to free.
        unsafe {
            let p = libc::malloc(size);
            std::hint::black_box(p);
            libc::free(p);
        }
    }
    println!("{}", t.elapsed().as_nanos() as f64 / n as f64);
}

/// A profile with `n` unique cpu stacks: random walks (depth 8–40) down a call graph of 2,000
/// functions where each calls one of 4 others, so stacks share their upper frames as a real
/// service's do; values long-tailed.
fn synthetic_profile(n: usize) -> phaseprof_model::Profile {
    use phaseprof_model::*;
    let mut b = ProfileBuilder::new(
        Meta {
            pids: vec![1],
            comm: "synthetic".into(),
            events: vec![EventKind::Cpu],
            frequency_hz: 99,
            start_unix_ns: 0,
            end_unix_ns: 30_000_000_000,
            ..Meta::default()
        },
        vec![],
    );
    let frames: Vec<u32> = (0..2000)
        .map(|i| {
            b.intern_frame(Frame {
                function: format!("service::module_{}::function_{i}", i % 37),
                module: "synthetic".into(),
                kind: FrameKind::User,
                inlined: false,
            })
        })
        .collect();
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut seen = std::collections::HashSet::new();
    while seen.len() < n {
        let depth = 8 + (next() % 33) as usize;
        let mut f = 0usize;
        let mut root_first = vec![frames[0]];
        for _ in 1..depth {
            f = (f * 7 + (next() % 4) as usize * 13 + 1) % 2000;
            root_first.push(frames[f]);
        }
        let stack: Vec<u32> = root_first.into_iter().rev().collect();
        if seen.insert(stack.clone()) {
            let s = b.intern_stack(stack);
            let v = 1 + (1_000_000 / (1 + next() % 100_000)) % 500;
            b.add_cpu(1, 1, PhaseAt::NONE, s, v);
        }
    }
    b.finish()
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

/// CPU seconds a live process has used itself, all its threads (their scheduler runtime from
/// /proc/PID/task/*/schedstat, in ns: /proc/PID/stat counts in 10 ms ticks).
fn cpu_exact(pid: u32) -> f64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .sum::<f64>()
        / 1e9
}

/// A running agent's steady state: its CPU seconds over `span` after `warmup` (load and first
/// symbolization left out), and the span as measured.
fn steady_cpu(pid: u32, warmup: u64, span: u64) -> (f64, f64) {
    std::thread::sleep(std::time::Duration::from_secs(warmup));
    let (c0, t0) = (cpu_exact(pid), Instant::now());
    std::thread::sleep(std::time::Duration::from_secs(span));
    (cpu_exact(pid) - c0, t0.elapsed().as_secs_f64())
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
    if args.get(1).map(String::as_str) == Some("alloc-loop") {
        alloc_loop(args[2].parse().unwrap(), 64);
        return;
    }
    let rounds: usize = args
        .iter()
        .position(|a| a == "--rounds")
        .map(|i| args[i + 1].parse().unwrap())
        .unwrap_or(5);
    // `--only syscalls|sim|phases|agent` runs one section.
    let only = args
        .iter()
        .position(|a| a == "--only")
        .map(|i| args[i + 1].clone());
    let wanted = |section: &str| only.as_deref().is_none_or(|o| o == section);
    // `--baseline PATH`: another phaseprof build measured in the same rounds (phases section),
    // for before/after numbers.
    let baseline: Option<std::path::PathBuf> = args
        .iter()
        .position(|a| a == "--baseline")
        .map(|i| args[i + 1].clone().into());
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

    let sim = rust_workload("validator-sim");
    if wanted("syscalls") {
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
    }
    if wanted("sim") {
        // 2. validator-sim, default events, A/B alternating.
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
    }
    if wanted("phases") {
        phases_bench(&pp, baseline.as_deref(), &sim, tmp, rounds, has_bpftrace);
    }
    if wanted("alloc") {
        // 4. Allocator probes. (a) A malloc/free loop bare, with probes at each function's entry
        //    (as naive tools place them) and at the chosen instruction. malloc's entry (`push`)
        //    is emulated either way, so the difference between the two is free's probe.
        let pairs = 200_000u64.to_string();
        let loop_ns = |extra: &[&str]| {
            let mut c = Command::new(&pp);
            c.args(["record", "--events", "alloc"])
                .args(extra)
                .args(["-o", tmp, "--"])
                .arg(&me)
                .args(["alloc-loop", &pairs]);
            ns_per_call(&run(&mut c))
        };
        let (mut bare, mut entry, mut chosen) = (vec![], vec![], vec![]);
        for _ in 0..rounds {
            bare.push(ns_per_call(&run(
                Command::new(&me).args(["alloc-loop", &pairs])
            )));
            entry.push(loop_ns(&["--alloc-placement", "entry"]));
            chosen.push(loop_ns(&[]));
        }
        let (bare, entry, chosen) = (median(bare), median(entry), median(chosen));
        // Three probe hits per pair with the chosen placement: malloc entry, malloc return, free.
        let per_hit = (chosen - bare) / 3.0;
        let free_naive = entry - chosen + per_hit;
        println!("malloc(64)+free loop, median of {rounds} alternating rounds:");
        println!("  bare                                   {bare:8.1} ns/pair");
        println!(
            "  probes at function entry (naive)       {entry:8.1} ns/pair  (+{:.0} ns)",
            entry - bare
        );
        println!(
            "  probes at chosen instructions          {chosen:8.1} ns/pair  (+{:.0} ns)",
            chosen - bare
        );
        println!(
            "  free's probe: {free_naive:.0} ns at its entry (`test rdi,rdi`, single-stepped) vs {per_hit:.0} ns \
             past its NULL test (`push rbp`, emulated): {:.1}x; cost per probe hit {per_hit:.0} ns",
            free_naive / per_hit
        );
        // (b) validator-sim with an allocation-heavy replay (about a million allocations a
        //     second): bare vs allocation probes always attached (a short run: the ratio does not
        //     depend on length), and bare vs duty-cycled under a 1% budget over a run long enough
        //     for the budget to matter (~30 s), each pair alternating.
        let elapsed = |c: &mut Command| {
            truth_from(run(c).as_bytes())["elapsed_ns"]
                .as_f64()
                .unwrap()
        };
        let sim_run = |blocks: &'static str, extra: Option<&[&str]>| {
            let args = [
                "--blocks",
                blocks,
                "--burn-ms",
                "2",
                "--small-allocs",
                "2000",
            ];
            match extra {
                None => elapsed(Command::new(&sim).args(args)),
                Some(extra) => {
                    let mut c = Command::new(&pp);
                    c.args(["record", "--events", "alloc"])
                        .args(extra)
                        .args(["-o", tmp, "--"])
                        .arg(&sim)
                        .args(args);
                    elapsed(&mut c)
                }
            }
        };
        let (mut b1, mut on, mut b2, mut budget) = (vec![], vec![], vec![], vec![]);
        for _ in 0..rounds {
            b1.push(sim_run("1000", None));
            on.push(sim_run("1000", Some(&[])));
        }
        for _ in 0..rounds.min(3) {
            b2.push(sim_run("15000", None));
            budget.push(sim_run("15000", Some(&["--alloc-budget", "1%"])));
        }
        let (b1, on, b2, budget) = (median(b1), median(on), median(b2), median(budget));
        println!("validator-sim --burn-ms 2 --small-allocs 2000 (4,000 allocations per block):");
        println!(
            "  1000 blocks: bare {:.1} ms, --events alloc (always attached) {:.1} ms: slowdown {:+.2}%",
            b1 / 1e6,
            on / 1e6,
            100.0 * (on / b1 - 1.0)
        );
        println!(
            "  15000 blocks: bare {:.1} ms, --events alloc --alloc-budget 1% {:.1} ms: slowdown {:+.2}% (median of {})",
            b2 / 1e6,
            budget / 1e6,
            100.0 * (budget / b2 - 1.0),
            rounds.min(3)
        );
    }
    if wanted("web") {
        // 5. Rendering a 50k-unique-stack profile: folded + prune + inferno, in process; then the
        //    profile page and its graph over HTTP from `phaseprof serve`.
        use phaseprof_flamegraphs::{write_svg_with, GraphOptions, Selection};
        let p = synthetic_profile(50_000);
        let sel = Selection {
            kind: phaseprof_model::EventKind::Cpu,
            phase: None,
        };
        let render = |g: &GraphOptions| {
            let mut svg = Vec::new();
            let t = Instant::now();
            write_svg_with(&p, &sel, g, &mut svg).unwrap();
            (t.elapsed().as_secs_f64(), svg.len())
        };
        let (mut pruned, mut full) = (vec![], vec![]);
        let (mut pruned_size, mut full_size) = (0, 0);
        for _ in 0..rounds {
            let (t, n) = render(&GraphOptions::default());
            pruned.push(t);
            pruned_size = n;
            let (t, n) = render(&GraphOptions {
                prune_below: 0.0,
                min_width_px: 0.0,
                ..GraphOptions::default()
            });
            full.push(t);
            full_size = n;
        }
        println!("flamegraph of 50,000 unique stacks, median of {rounds}:");
        println!(
            "  pruned (default: stacks < 0.01% folded, frames < 0.1 px not drawn): {:.0} ms, SVG {:.1} MiB",
            median(pruned) * 1e3,
            pruned_size as f64 / (1 << 20) as f64
        );
        println!(
            "  unpruned:                                                        {:.0} ms, SVG {:.1} MiB",
            median(full) * 1e3,
            full_size as f64 / (1 << 20) as f64
        );
        let file = std::env::temp_dir().join("phaseprof-bench-50k.phaseprof");
        phaseprof_model::write_profile(&p, std::fs::File::create(&file).unwrap()).unwrap();
        let mut server = Command::new(&pp)
            .args(["serve", file.to_str().unwrap(), "--listen", "127.0.0.1:0"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stderr = std::io::BufReader::new(server.stderr.take().unwrap());
        let url = phaseprof_e2e::served_url(&mut stderr);
        let (mut page, mut graph) = (vec![], vec![]);
        for _ in 0..rounds {
            let t = Instant::now();
            let (status, _) = phaseprof_e2e::http_get(&format!("{url}/profile/0"));
            assert_eq!(status, 200);
            page.push(t.elapsed().as_secs_f64());
            let t = Instant::now();
            let (status, _) =
                phaseprof_e2e::http_get(&format!("{url}/profile/0/flamegraph/cpu.svg"));
            assert_eq!(status, 200);
            graph.push(t.elapsed().as_secs_f64());
        }
        let _ = server.kill();
        let _ = server.wait();
        println!(
            "profile page of that profile from `phaseprof serve`: HTML {:.0} ms, its flamegraph {:.0} ms (median of {rounds})",
            median(page) * 1e3,
            median(graph) * 1e3
        );
    }
    if wanted("fleet") {
        // 6. The collector: sustained ingest of typical windows (500 stacks, as a 10 s window
        //    of a busy service at 99 Hz) from 50 concurrent agents (a fleet of 2,000 hosts
        //    pushing every 10 s is 200 windows/s with ~50 requests in flight), then the latency
        //    of a merged query over 1 hour of 10 hosts (3,600 windows of 10 s); with the
        //    embedded SQLite store and with ClickHouse (Debian's clickhouse-server, started here).
        let dir =
            std::env::temp_dir().join(format!("phaseprof-bench-fleet-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let hour = FleetHour::new();
        fleet_bench(
            "SQLite",
            &["--data".into(), dir.join("data").display().to_string()],
            &dir,
            &hour,
            rounds,
        );
        match phaseprof_e2e::ClickHouse::start("bench-clickhouse") {
            Some(ch) => fleet_bench(
                "ClickHouse",
                &["--clickhouse".into(), ch.url.clone()],
                &dir,
                &hour,
                rounds,
            ),
            None => println!("collector (ClickHouse): skipped, clickhouse-server not installed"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    if wanted("agent") {
        // 7. Agent cost while recording a 16-thread target at 99 Hz: steady state (its threads'
        //    scheduler runtime between 3 s and 28 s) and in total (wait4, including load and
        //    first symbolization), with peak RSS.
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
        let (steady, steady_wall) = steady_cpu(agent.id(), 3, 25);
        let (cpu, rss_kib) = wait_rusage(agent);
        let wall = t.elapsed().as_secs_f64();
        let _ = target.kill();
        let _ = target.wait();
        println!(
            "agent recording a 16-thread validator-sim at 99 Hz: steady state {:.2}% of one core; \
         whole {wall:.1} s run incl. load and symbolization {:.2}%; peak RSS {:.1} MiB",
            100.0 * steady / steady_wall,
            100.0 * cpu / wall,
            rss_kib as f64 / 1024.0
        );
    }
    if wanted("unwind") {
        unwind_bench(&pp, tmp, rounds);
    }
}

/// 8. Unwinding without frame pointers, fp vs dwarf. (a) The agent's CPU per 1,000 samples:
///    `record --pid` of validator-sim (fp: its frame-pointer build, dwarf: its build without),
///    two threads burning (about 198 samples/s at 99 Hz on 2 CPUs), the agent's own CPU (its
///    threads' scheduler runtime) between 3 s and 18 s (its fixed work per second included: polls and drains) over
///    the samples of that span (the recording's rate × the span). (b) The extra slowdown of
///    a fixed-work target at 99 Hz (and at 999 Hz, where the cost per sample stands out):
///    zlib-sim's own elapsed time (compressing with Debian's zlib) bare, under fp and under
///    dwarf, alternating.
/// Phase probes: ns added per phase call (entry + exit probe) on a native target (with cpu
/// samples only, and with the default events, which see any syscall the probes make) and a Go
/// one, ns per goroutine switch-point hit, and bare bpftrace probes on the same functions as
/// the kernel's floor; with `baseline`, the same for that build, alternating in each round.
fn phases_bench(
    pp: &std::path::Path,
    baseline: Option<&std::path::Path>,
    sim: &std::path::Path,
    tmp: &str,
    rounds: usize,
    has_bpftrace: bool,
) {
    let blocks = 200_000u64;
    let phases_native = root().join("tests/workloads/validator-sim/phases.toml");
    let relay = go_workload("relay-sim").expect("Go is needed for the Go phase benchmark");
    let go_phases = std::env::temp_dir().join("phaseprof-bench-ingest.toml");
    std::fs::write(
        &go_phases,
        "[[phase]]\nname = \"ingest\"\nfunction = \"main.ingest\"\n",
    )
    .unwrap();
    let go_calls = 1_000_000u64.to_string();
    let switches = 200_000u64.to_string();
    let blocks_arg = blocks.to_string();
    let per_block =
        |out: &str| truth_from(out.as_bytes())["elapsed_ns"].as_f64().unwrap() / blocks as f64;
    // `phaseprof record [events] --phases cfg -- program args` with the build `bin`.
    let record = |bin: &std::path::Path, events: &str, cfg: &std::path::Path| {
        let mut c = Command::new(bin);
        c.args([
            "record",
            "--events",
            events,
            "--phases",
            cfg.to_str().unwrap(),
            "-o",
            tmp,
            "--",
        ]);
        c
    };
    let builds: Vec<(&str, &std::path::Path)> = std::iter::once(("after", pp))
        .chain(baseline.map(|b| ("before", b)))
        .collect();
    // Per build: native cpu-only, native default events, Go call, Go switch (ns per unit).
    let mut m: Vec<[Vec<f64>; 4]> = builds.iter().map(|_| Default::default()).collect();
    let (mut nb, mut gb, mut sb, mut floor_native, mut floor_go) =
        (vec![], vec![], vec![], vec![], vec![]);
    let native_raw: Vec<String> = {
        let syms = std::process::Command::new("nm").arg(sim).output().unwrap();
        String::from_utf8_lossy(&syms.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().nth(2))
            .filter(|n| n.contains("13validator_sim6phases") && !n.contains("block"))
            .map(str::to_string)
            .collect()
    };
    for _ in 0..rounds {
        nb.push(per_block(&run(
            Command::new(sim).args(["--blocks", &blocks_arg])
        )));
        gb.push(ns_per_call(&run(
            Command::new(&relay).args(["-bench-calls", &go_calls])
        )));
        sb.push(ns_per_call(&run(
            Command::new(&relay).args(["-bench-switches", &switches])
        )));
        for (i, (_, bin)) in builds.iter().enumerate() {
            for (j, events) in ["cpu", "cpu,offcpu,syscall"].into_iter().enumerate() {
                m[i][j].push(per_block(&run(record(bin, events, &phases_native)
                    .arg(sim)
                    .args(["--blocks", &blocks_arg]))));
            }
            m[i][2].push(ns_per_call(&run(record(bin, "cpu", &go_phases)
                .arg(&relay)
                .args(["-bench-calls", &go_calls]))));
            m[i][3].push(ns_per_call(&run(record(bin, "cpu", &go_phases)
                .arg(&relay)
                .args(["-bench-switches", &switches]))));
        }
        if has_bpftrace {
            let probes: Vec<String> = native_raw
                .iter()
                .map(|n| {
                    format!(
                        "uprobe:{}:{n} {{}} uretprobe:{}:{n} {{}}",
                        sim.display(),
                        sim.display()
                    )
                })
                .collect();
            let out = run(Command::new("bpftrace")
                .args(["-q", "-e", &probes.join(" "), "-c"])
                .arg(format!("{} --blocks {blocks}", sim.display())));
            floor_native.push(per_block(&out));
            let script = format!("uprobe:{}:main.ingest {{}}", relay.display());
            let out = run(Command::new("bpftrace")
                .args(["-q", "-e", &script, "-c"])
                .arg(format!("{} -bench-calls {go_calls}", relay.display())));
            floor_go.push(ns_per_call(&out));
        }
    }
    let (nb, gb, sb) = (median(nb), median(gb), median(sb));
    println!("phase probes, median of {rounds} alternating rounds:");
    for (i, (name, bin)) in builds.iter().enumerate() {
        let [cpu, default, go, sw] = m[i].clone().map(median);
        println!("  {name} ({}):", bin.display());
        println!(
            "    native (validator-sim, 3 phase calls per block, uprobe + uretprobe): {:.0} ns per phase entry+exit with --events cpu, {:.0} ns with the default events",
            (cpu - nb) / 3.0,
            (default - nb) / 3.0
        );
        println!(
            "    Go (relay-sim main.ingest, uprobe at entry + uprobe on the ret): {:.0} ns per phase entry+exit",
            go - gb
        );
        println!(
            "    Go scheduler (relay-sim -bench-switches, 2 goroutine switches per pass, a stop and a start each): {:.0} ns per pass ({:.0} bare), {:.0} ns per switch-point hit",
            sw,
            sb,
            (sw - sb) / 4.0
        );
    }
    if !floor_native.is_empty() {
        println!(
            "  floor, bare bpftrace probes: native uprobe + uretprobe {:.0} ns per call; Go uprobe on main.ingest's first instruction (single-stepped `cmp`) {:.0} ns",
            (median(floor_native) - nb) / 3.0,
            median(floor_go) - gb
        );
    }
    println!("  x86 uprobes emulate relative jumps, calls, conditional branches, `push reg` and `nop`; a `ret` is single-stepped, so every exact Go exit costs a single-step");
}

fn unwind_bench(pp: &std::path::Path, tmp: &str, rounds: usize) {
    let fp_build = rust_workload("validator-sim");
    let nofp_build = phaseprof_e2e::rust_workload_without_frame_pointers("validator-sim");
    let zlib = phaseprof_e2e::c_workload("zlib-sim", "", &["-lz"]);
    let report = |file: &str| -> serde_json::Value {
        serde_json::from_str(&run(Command::new(pp).args(["report", "--json", file]))).unwrap()
    };
    // Each mode on the build it is for: the frame-pointer walk of a build without frame pointers
    // yields garbage addresses that cost symbolization of their own.
    // The agent's CPU over the span (ms), the samples of the span, and the stack bytes copied per
    // sample; `sim` None: a sleeping target (the agent's fixed cost: polls, drains).
    let agent_cost = |unwind: &str, sim: Option<&std::path::Path>| -> (f64, f64, f64) {
        let mut target = match sim {
            Some(sim) => Command::new(sim)
                .args(["--blocks", "100000", "--threads", "2", "--burn-ms", "20"])
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
            None => Command::new("sleep").arg("60").spawn().unwrap(),
        };
        let pid = target.id().to_string();
        let agent = Command::new(pp)
            .args([
                "record", "--events", "cpu", "--unwind", unwind, "--pid", &pid,
            ])
            .args(["--duration", "20s", "-o", tmp])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let (cpu, span) = steady_cpu(agent.id(), 3, 15);
        wait_rusage(agent);
        let _ = target.kill();
        let _ = target.wait();
        let r = report(tmp);
        let samples = r["events"]["cpu"]["samples"].as_f64().unwrap();
        let rate = samples / (r["duration_ns"].as_f64().unwrap() / 1e9);
        let copied = r["events"]["cpu"]["unwind"]["copied_bytes"]
            .as_f64()
            .unwrap_or(0.0);
        (cpu * 1e3, rate * span, copied / samples.max(1.0))
    };
    let (mut fp, mut dwarf, mut fixed) = (vec![], vec![], vec![]);
    let mut copy_per_sample = 0.0;
    let mut rate = 0.0;
    for _ in 0..rounds {
        let (ms, n, _) = agent_cost("fp", Some(&fp_build));
        fp.push(ms / n * 1000.0);
        let (ms, n, copy) = agent_cost("dwarf", Some(&nofp_build));
        dwarf.push(ms / n * 1000.0);
        (rate, copy_per_sample) = (n / 15.0, copy);
        // The same span with nothing to sample, as if it had this many samples.
        fixed.push(agent_cost("dwarf", None).0 / n * 1000.0);
    }
    let (fp, dwarf, fixed) = (median(fp), median(dwarf), median(fixed));
    println!(
        "agent CPU per 1,000 cpu samples at ~{rate:.0} samples/s (validator-sim, two threads \
         burning; median of {rounds} alternating rounds): fp (frame-pointer build) {fp:.1} ms, dwarf \
         (build without frame pointers) {dwarf:.1} ms ({:.2}x); dwarf copies {:.1} KiB per \
         sample ({:.2} MiB/s through the ring buffer)",
        dwarf / fp,
        copy_per_sample / 1024.0,
        copy_per_sample * rate / (1 << 20) as f64
    );
    println!(
        "  of which the agent's fixed work (a sleeping target: polls every 20 ms, drains every \
         second): {fixed:.1} ms; per 1,000 samples beyond it: fp {:.1} ms, dwarf {:.1} ms",
        fp - fixed,
        dwarf - fixed
    );
    // (c) The sampling program's own cost per run, from the kernel's BPF statistics
    //     (kernel.bpf_stats_enabled): what each sample adds to the target's time, exactly.
    let prog_ns = |unwind: &str| -> Option<f64> {
        let mut rec = Command::new(pp)
            .args([
                "record", "--events", "cpu", "--unwind", unwind, "-o", tmp, "--",
            ])
            .arg(&zlib)
            .arg("6")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1000));
        let out = Command::new("bpftool")
            .args(["prog", "show", "--json"])
            .output();
        let _ = rec.wait();
        let out = out.ok()?;
        let progs: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        // The kernel cuts program names to 15 characters; bpftool shows the full one from BTF.
        let p = progs.as_array()?.iter().find(|p| {
            p["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("perf_event__sam"))
        })?;
        Some(p["run_time_ns"].as_f64()? / p["run_cnt"].as_f64()?.max(1.0))
    };
    let stats_before =
        std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled").unwrap_or_default();
    let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", "1");
    let (mut fp_ns, mut dwarf_ns) = (vec![], vec![]);
    for _ in 0..rounds {
        fp_ns.extend(prog_ns("fp"));
        dwarf_ns.extend(prog_ns("dwarf"));
    }
    let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", stats_before.trim());
    if !fp_ns.is_empty() && !dwarf_ns.is_empty() {
        let (fp_ns, dwarf_ns) = (median(fp_ns), median(dwarf_ns));
        println!(
            "cpu sampling program per sample (kernel BPF stats, zlib-sim, median of {rounds}): \
             fp walk {fp_ns:.0} ns, dwarf copy {dwarf_ns:.0} ns: at 99 Hz dwarf adds {:.4}% to a \
             busy thread's time ({:+.4} points over fp)",
            dwarf_ns * 99.0 / 1e7,
            (dwarf_ns - fp_ns) * 99.0 / 1e7
        );
    }
    let elapsed = |c: &mut Command| {
        truth_from(run(c).as_bytes())["elapsed_ns"]
            .as_f64()
            .unwrap()
    };
    let recorded = |unwind: &str, freq: &str| {
        elapsed(
            Command::new(pp)
                .args([
                    "record", "--events", "cpu", "--freq", freq, "--unwind", unwind,
                ])
                .args(["-o", tmp, "--"])
                .arg(&zlib)
                .arg("10"),
        )
    };
    // Also at 999 Hz, where the per-sample cost stands out of the machine's noise.
    let mut runs: [Vec<f64>; 5] = Default::default();
    for _ in 0..rounds {
        runs[0].push(elapsed(Command::new(&zlib).arg("10")));
        runs[1].push(recorded("fp", "99"));
        runs[2].push(recorded("dwarf", "99"));
        runs[3].push(recorded("fp", "999"));
        runs[4].push(recorded("dwarf", "999"));
    }
    let [bare, fp, dwarf, fp999, dwarf999] = runs.map(median);
    let pct = |x: f64| 100.0 * (x / bare - 1.0);
    // The copy's cost per sample, from the 999 Hz pair (ten times the samples of 99 Hz).
    let per_sample_us = (dwarf999 - fp999) / 1e3 / (999.0 * dwarf999 / 1e9);
    println!(
        "zlib-sim (10 rounds of deflate, Debian's zlib), median of {rounds} alternating rounds: \
         bare {:.1} ms; at 99 Hz fp {:+.2}%, dwarf {:+.2}%: dwarf's extra slowdown {:+.2} points; \
         at 999 Hz fp {:+.2}%, dwarf {:+.2}%: {per_sample_us:+.1} us per sample for the stack copy, \
         which at 99 Hz is {:+.3} points",
        bare / 1e6,
        pct(fp),
        pct(dwarf),
        pct(dwarf) - pct(fp),
        pct(fp999),
        pct(dwarf999),
        per_sample_us * 99.0 / 1e4
    );
}

/// An hour of 10 hosts' windows, ending now (older windows would fall to the collector's 7-day
/// retention); bodies differ only in labels and times.
struct FleetHour {
    from_ns: u64,
    to_ns: u64,
    bodies: Vec<Vec<u8>>,
}

impl FleetHour {
    fn new() -> Self {
        let to_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let from_ns = to_ns - 3_600_000_000_000;
        let n: usize = std::env::var("PHASEPROF_BENCH_WINDOWS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3600);
        let template = synthetic_profile(500);
        let bodies = (0..n)
            .map(|k| {
                let mut p = template.clone();
                p.meta.start_unix_ns = from_ns + (k / 10) as u64 * 10_000_000_000;
                p.meta.end_unix_ns = p.meta.start_unix_ns + 10_000_000_000;
                p.meta
                    .labels
                    .insert("host".into(), format!("host-{}", k % 10));
                p.meta.labels.insert("version".into(), "1.5".into());
                let mut b = Vec::new();
                phaseprof_model::write_profile(&p, &mut b).unwrap();
                b
            })
            .collect();
        FleetHour {
            from_ns,
            to_ns,
            bodies,
        }
    }
}

/// Ingest rate and merged-query latency of a collector storing with `store`.
fn fleet_bench(
    name: &str,
    store: &[String],
    dir: &std::path::Path,
    hour: &FleetHour,
    rounds: usize,
) {
    const AGENTS: usize = 50;
    // One token per agent, as a fleet has (the collector's rate limit is per agent).
    let tokens: Vec<String> = (0..AGENTS)
        .map(|i| format!("bench-agent-token-{i:012}"))
        .collect();
    let lines: String = (tokens.iter().enumerate())
        .map(|(i, t)| format!("bench-{i} {t}\n"))
        .collect();
    std::fs::write(dir.join("tokens"), lines).unwrap();
    let port = phaseprof_e2e::free_port();
    let mut coll = Command::new(root().join("target/release/phaseprof-collector"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--tokens"])
        .arg(dir.join("tokens"))
        .args(store)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(coll.stderr.take().unwrap());
    read_until(&mut err, "listening on");
    let bodies = &hour.bodies;
    let size = bodies.iter().map(Vec::len).sum::<usize>() / bodies.len();
    let url = format!("http://127.0.0.1:{port}/api/v1/windows");
    let t = Instant::now();
    std::thread::scope(|s| {
        for (chunk, token) in bodies.chunks(bodies.len().div_ceil(AGENTS)).zip(&tokens) {
            let url = &url;
            s.spawn(move || {
                for b in chunk {
                    let (status, body) = phaseprof_e2e::http_post(url, token, b);
                    assert_eq!(status, 201, "{body}");
                }
            });
        }
    });
    let secs = t.elapsed().as_secs_f64();
    println!(
        "collector ({name}) ingest: {} windows of {:.1} KiB from {AGENTS} agents in {secs:.1} s = {:.0} windows/s",
        bodies.len(),
        size as f64 / 1024.0,
        bodies.len() as f64 / secs
    );
    let mut q = vec![];
    for _ in 0..rounds.min(3) {
        let t = Instant::now();
        let (status, body) = phaseprof_e2e::http_get(&format!(
            "http://127.0.0.1:{port}/api/v1/merged?sel=version%3D1.5&from={}&to={}",
            hour.from_ns, hour.to_ns
        ));
        assert_eq!(status, 200, "{}", &body[..body.len().min(300)]);
        q.push(t.elapsed().as_secs_f64());
    }
    println!(
        "collector ({name}) merged query over 1 hour of 10 hosts ({} windows): {:.2} s (median of {})",
        bodies.len(),
        median(q),
        rounds.min(3)
    );
    let _ = coll.kill();
    let _ = coll.wait();
}
