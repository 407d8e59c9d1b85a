//! `bench`: phaseprof's overhead, measured A/B alternating in one run, printed (never asserted).
//!
//! Run as root after `cargo build --release --workspace`:
//! `target/release/bench [--rounds N] [--only syscalls|sim|phases|alloc|web|fleet|fleet-day|agent|unwind|defaults|redis|go-server|switches]`.
//! Prints: ns per syscall of a getppid loop bare / with our probes attached but the loop not a
//! target (the floor) / under `record` (stacks on and off) / under bpftrace doing the same
//! counting; validator-sim's wall time bare vs recorded; the agent's CPU% and peak RSS while
//! recording a 16-thread validator-sim at 99 Hz; ns per malloc/free pair with allocator probes at
//! the function entry vs at the chosen (emulated) instruction; validator-sim's slowdown with
//! allocation probes, with and without `--alloc-budget 1%`; flamegraph render time and SVG size
//! for 50k unique stacks, and the profile page's load time from `phaseprof serve`; the
//! agent's CPU per 1,000 samples and the target's slowdown with frame-pointer vs stack-copy
//! unwinding; the default events' per-event kernel cost by way of walking stacks, the unwind
//! tables' size and build time, and validator-sim's and dd's slowdown vs bare and bpftrace; a
//! switch-bound program's slowdown (`perf bench sched pipe`) measured and as printed.
// Each section is a measurement script read top to bottom; the length limit on functions is for
// the product's code (like the end-to-end tests).
#![allow(clippy::too_many_lines)]
use std::process::{Command, Stdio};
use std::time::Instant;

use phaseprof_e2e::{phaseprof_bin, read_until, rust_workload, truth_from};

mod defaults;
mod execs;
mod fleet;
mod go_server;
mod measure;
mod phases;
mod redis;
mod unwind;

use defaults::{defaults_bench, switch_bound_bench};
use fleet::{fleet_bench, fleet_day_bench, FleetHour};
use go_server::go_server_bench;
use phases::phases_bench;
use redis::redis_bench;
use unwind::unwind_bench;

use measure::*;

/// A way of running the syscall loop, by name, returning ns per call.
type Variant<'a> = (&'a str, Box<dyn Fn() -> f64 + 'a>);

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
        let mut variants: Vec<Variant<'_>> = vec![
            ("bare", Box::new(|| measure(bare()))),
            (
                "phaseprof attached, loop not a target",
                Box::new(attached_not_target),
            ),
            (
                "record --syscall-stacks none",
                Box::new(|| measure(record(&["--syscall-stacks", "none"]))),
            ),
            (
                "record (defaults: sampled stacks)",
                Box::new(|| measure(record(&[]))),
            ),
            (
                "record --syscall-stacks all",
                Box::new(|| measure(record(&["--syscall-stacks", "all"]))),
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
        let sim_args = sim_args("40");
        let (mut sb, mut sr) = (vec![], vec![]);
        for _ in 0..rounds {
            let t = truth_from(run(Command::new(&sim).args(&sim_args)).as_bytes());
            sb.push(t["elapsed_ns"].as_f64().unwrap());
            let t = truth_from(
                run(Command::new(&pp)
                    .args(["record", "-o", tmp, "--"])
                    .arg(&sim)
                    .args(&sim_args))
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
            group: None,
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
        //    of a busy service at 99 Hz, over three phases) from 50 concurrent agents, then
        //    the merged view of the last hour of 10 hosts at 1 s windows (36,000), as a user
        //    opens it (page with phase table and top functions, cpu flamegraph) and as JSON,
        //    and what is stored per window; with the embedded SQLite store and with
        //    ClickHouse (Debian's clickhouse-server, started here). Then a day of 20 hosts at
        //    10 s windows (172,800) on ClickHouse.
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
    if wanted("fleet-day") {
        // 7. A day of 20 hosts at 10 s windows (172,800) on ClickHouse: its merged view, rows
        //    and bytes on disk.
        let dir = std::env::temp_dir().join(format!("phaseprof-bench-day-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        match phaseprof_e2e::ClickHouse::start("bench-clickhouse-day") {
            Some(ch) => fleet_day_bench(&["--clickhouse".into(), ch.url.clone()], &dir, rounds),
            None => println!("collector (ClickHouse): skipped, clickhouse-server not installed"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    if wanted("agent") {
        // 7. Agent cost while recording a 16-thread target at 99 Hz: steady state (its threads'
        //    scheduler runtime between 3 s and 28 s) and in total (wait4, including load and
        //    first symbolization), with peak RSS.
        for (build, sim) in [
            ("frame-pointer build", sim.clone()),
            (
                "no frame pointers, unwind tables",
                phaseprof_e2e::rust_workload_without_frame_pointers("validator-sim"),
            ),
        ] {
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
            "agent recording a 16-thread validator-sim ({build}) at 99 Hz, default events: steady \
             state {:.2}% of one core; whole {wall:.1} s run incl. load and symbolization {:.2}%; \
             peak RSS {:.1} MiB",
            100.0 * steady / steady_wall,
            100.0 * cpu / wall,
            rss_kib as f64 / 1024.0
        );
        }
    }
    if wanted("execs") {
        execs::execs_bench(&pp, tmp, rounds);
    }
    if wanted("unwind") {
        unwind_bench(&pp, tmp, rounds);
    }
    if wanted("redis") {
        redis_bench(&pp, tmp, rounds, has_bpftrace);
    }
    if wanted("go-server") {
        go_server_bench(&pp, tmp, rounds, has_bpftrace);
    }
    if wanted("defaults") {
        defaults_bench(&pp, tmp, rounds, has_bpftrace);
    }
    if wanted("switches") {
        switch_bound_bench(&pp, tmp, rounds);
    }
}
