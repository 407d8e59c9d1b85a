//! Unwinding from stack copies: the agent's CPU per sample and the target's slowdown, fp vs
//! copy (the unwind tables walked in the kernel are measured in `defaults`).
use phaseprof_e2e::{rust_workload, truth_from};
use std::process::{Command, Stdio};

use super::*;

/// Unwinding without frame pointers, fp vs copy. (a) The agent's CPU per 1,000 samples:
/// `record --pid` of validator-sim (fp: its frame-pointer build, copy: its build without),
/// two threads burning (about 198 samples/s at 99 Hz on 2 CPUs), the agent's own CPU (its
/// threads' scheduler runtime) between 3 s and 18 s (its fixed work per second included: polls and drains) over
/// the samples of that span (the recording's rate × the span). (b) The extra slowdown of
/// a fixed-work target at 99 Hz (and at 999 Hz, where the cost per sample stands out):
/// zlib-sim's own elapsed time (compressing with Debian's zlib) bare, under fp and under
/// copy, alternating.
pub fn unwind_bench(pp: &std::path::Path, tmp: &str, rounds: usize) {
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
    let (mut fp, mut copy, mut fixed) = (vec![], vec![], vec![]);
    let mut copy_per_sample = 0.0;
    let mut rate = 0.0;
    for _ in 0..rounds {
        let (ms, n, _) = agent_cost("fp", Some(&fp_build));
        fp.push(ms / n * 1000.0);
        let (ms, n, bytes) = agent_cost("copy", Some(&nofp_build));
        copy.push(ms / n * 1000.0);
        (rate, copy_per_sample) = (n / 15.0, bytes);
        // The same span with nothing to sample, as if it had this many samples.
        fixed.push(agent_cost("copy", None).0 / n * 1000.0);
    }
    let (fp, copy, fixed) = (median(fp), median(copy), median(fixed));
    println!(
        "agent CPU per 1,000 cpu samples at ~{rate:.0} samples/s (validator-sim, two threads \
         burning; median of {rounds} alternating rounds): fp (frame-pointer build) {fp:.1} ms, copy \
         (build without frame pointers) {copy:.1} ms ({:.2}x); copy copies {:.1} KiB per \
         sample ({:.2} MiB/s through the ring buffer)",
        copy / fp,
        copy_per_sample / 1024.0,
        copy_per_sample * rate / (1 << 20) as f64
    );
    println!(
        "  of which the agent's fixed work (a sleeping target: polls every 20 ms, drains every \
         second): {fixed:.1} ms; per 1,000 samples beyond it: fp {:.1} ms, copy {:.1} ms",
        fp - fixed,
        copy - fixed
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
    let (mut fp_ns, mut copy_ns) = (vec![], vec![]);
    for _ in 0..rounds {
        fp_ns.extend(prog_ns("fp"));
        copy_ns.extend(prog_ns("copy"));
    }
    let _ = std::fs::write("/proc/sys/kernel/bpf_stats_enabled", stats_before.trim());
    if !fp_ns.is_empty() && !copy_ns.is_empty() {
        let (fp_ns, copy_ns) = (median(fp_ns), median(copy_ns));
        println!(
            "cpu sampling program per sample (kernel BPF stats, zlib-sim, median of {rounds}): \
             fp walk {fp_ns:.0} ns, copy copy {copy_ns:.0} ns: at 99 Hz copy adds {:.4}% to a \
             busy thread's time ({:+.4} points over fp)",
            copy_ns * 99.0 / 1e7,
            (copy_ns - fp_ns) * 99.0 / 1e7
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
        runs[2].push(recorded("copy", "99"));
        runs[3].push(recorded("fp", "999"));
        runs[4].push(recorded("copy", "999"));
    }
    let [bare, fp, copy, fp999, copy999] = runs.map(median);
    let pct = |x: f64| 100.0 * (x / bare - 1.0);
    // The copy's cost per sample, from the 999 Hz pair (ten times the samples of 99 Hz).
    let per_sample_us = (copy999 - fp999) / 1e3 / (999.0 * copy999 / 1e9);
    println!(
        "zlib-sim (10 rounds of deflate, Debian's zlib), median of {rounds} alternating rounds: \
         bare {:.1} ms; at 99 Hz fp {:+.2}%, copy {:+.2}%: copy's extra slowdown {:+.2} points; \
         at 999 Hz fp {:+.2}%, copy {:+.2}%: {per_sample_us:+.1} us per sample for the stack copy, \
         which at 99 Hz is {:+.3} points",
        bare / 1e6,
        pct(fp),
        pct(copy),
        pct(copy) - pct(fp),
        pct(fp999),
        pct(copy999),
        per_sample_us * 99.0 / 1e4
    );
}
