//! Measuring: loops of syscalls and allocations, timing and CPU readings, medians.
use std::process::{Command, Stdio};
use std::time::Instant;

pub const LOOP_CALLS: u64 = 2_000_000;

/// validator-sim's syscall-heavy run (~32k syscalls/s: 200 flushes per block and thread, each
/// one write(2)) of `blocks` blocks, as the sim and defaults sections run it.
pub fn sim_args(blocks: &str) -> Vec<String> {
    [
        "--blocks",
        blocks,
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
    ]
    .iter()
    .map(|a| a.to_string())
    .collect()
}

pub fn syscall_loop(n: u64) {
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: getppid has no preconditions.
        unsafe { libc::getppid() };
    }
    println!("{}", t.elapsed().as_nanos() as f64 / n as f64);
}

/// malloc + free pairs of `size` bytes through libc; prints ns per pair.
pub fn alloc_loop(n: u64, size: usize) {
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
pub fn synthetic_profile(n: usize) -> phaseprof_model::Profile {
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
            b.add(Sample::new(SampleKind::Cpu, (1, 1), PhaseAt::NONE, vec![v]).on(s));
        }
    }
    b.finish()
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs `cmd`, returning its stdout.
pub fn run(cmd: &mut Command) -> String {
    let o = cmd.stderr(Stdio::null()).output().expect("run");
    assert!(o.status.success(), "{cmd:?} failed");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn ns_per_call(out: &str) -> f64 {
    out.lines()
        .filter_map(|l| l.trim().parse::<f64>().ok())
        .next_back()
        .expect("loop printed ns/call")
}

/// CPU seconds a live process has used itself, all its threads (their scheduler runtime from
/// /proc/PID/task/*/schedstat, in ns: /proc/PID/stat counts in 10 ms ticks).
pub fn cpu_exact(pid: u32) -> f64 {
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
pub fn steady_cpu(pid: u32, warmup: u64, span: u64) -> (f64, f64) {
    std::thread::sleep(std::time::Duration::from_secs(warmup));
    let (c0, t0) = (cpu_exact(pid), Instant::now());
    std::thread::sleep(std::time::Duration::from_secs(span));
    (cpu_exact(pid) - c0, t0.elapsed().as_secs_f64())
}

/// CPU seconds and peak RSS (KiB) of a child, via wait4.
pub fn wait_rusage(child: std::process::Child) -> (f64, i64) {
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

/// One pair of adjacent rounds: the target's CPU per request bare (or under the recording a
/// budget is set against, `budget_line`) and under the recording, and what the recording
/// printed.
pub struct Pair {
    pub bare: f64,
    pub with: f64,
    pub printed: Printed,
}

/// What a recording printed of its cost, per request: the probes' time (`probe_cost.ns`) and
/// the cost measured in the target against its work before the recording attached
/// (`probe_cost.in_targets`), NaN where it printed none.
#[derive(Clone, Copy)]
pub struct Printed {
    pub probes: f64,
    pub in_targets: f64,
}

impl Printed {
    pub const NONE: Printed = Printed {
        probes: f64::NAN,
        in_targets: f64::NAN,
    };

    /// From a recording's `report --json` of a round in which the target spent `cpu_per_req`
    /// ns of CPU time a request over `requests` requests.
    pub fn of(report: &serde_json::Value, requests: f64, cpu_per_req: f64) -> Printed {
        let cost = &report["probe_cost"];
        // The slowdown s measured in the target: of its CPU time a request, s/(1+s) was extra.
        let in_targets = cost["in_targets"]["slowdown"]
            .as_f64()
            .map_or(f64::NAN, |s| cpu_per_req * s / (1.0 + s));
        Printed {
            probes: cost["ns"].as_f64().map_or(f64::NAN, |ns| ns / requests),
            in_targets,
        }
    }
}

/// Runs `pairs` pairs of rounds, bare and recorded in turn (which goes first alternates, so a
/// drift over the run weighs on both sides alike); `round(true)` is a recorded round, returning
/// CPU per request and the printed cost per request.
pub fn paired_rounds(pairs: usize, mut round: impl FnMut(bool) -> (f64, Printed)) -> Vec<Pair> {
    (0..pairs)
        .map(|i| {
            let (first, second) = if i % 2 == 0 {
                (false, true)
            } else {
                (true, false)
            };
            let (a, b) = (round(first), round(second));
            let (bare, with) = if first { (b, a) } else { (a, b) };
            Pair {
                bare: bare.0,
                with: with.0,
                printed: with.1,
            }
        })
        .collect()
}

/// The measured cost of paired rounds (the median of the pairs' differences, with its
/// distribution-free interval: the order statistics a sign test puts around a median at 90% or
/// more) beside the median printed costs, and whether each is within 20% of the measured one
/// or, where the rounds' noise is wider than that, inside the interval.
pub fn paired_line(pairs: &[Pair], unit: &str) -> String {
    let n = pairs.len();
    let mut diffs: Vec<f64> = pairs.iter().map(|p| p.with - p.bare).collect();
    diffs.sort_by(f64::total_cmp);
    let measured = median(diffs.clone());
    let bare = median(pairs.iter().map(|p| p.bare).collect());
    let (k, coverage) = sign_interval(n);
    let (low, high) = (diffs[k], diffs[n - 1 - k]);
    let printed = |of: fn(&Printed) -> f64| {
        let v: Vec<f64> = pairs
            .iter()
            .map(|p| of(&p.printed))
            .filter(|v| !v.is_nan())
            .collect();
        (!v.is_empty()).then(|| median(v))
    };
    let mut out = format!(
        "measured {measured:+.0} ns a {unit} ({:+.1}% of bare {bare:.0} ns; {:.0}% interval \
         {low:+.0}..{high:+.0} ns over {n} alternating pairs)",
        100.0 * measured / bare,
        100.0 * coverage,
    );
    for (what, p) in [
        ("printed (probes' time)", printed(|p| p.probes)),
        ("measured in the target", printed(|p| p.in_targets)),
    ] {
        if let Some(p) = p {
            out += &format!("; {what} {p:.0} ns, {}", verdict(p, measured, (low, high)));
        }
    }
    out
}

/// Whether `printed` is within 20% of `measured` or, where the rounds' noise is wider than
/// that, inside `interval`.
fn verdict(printed: f64, measured: f64, (low, high): (f64, f64)) -> String {
    let off = printed / measured - 1.0;
    if off.abs() <= 0.2 {
        format!("{:+.0}% vs measured: within 20%", 100.0 * off)
    } else if (low..=high).contains(&printed) {
        format!(
            "{:+.0}% vs measured, inside its interval (the rounds' noise is wider than 20%)",
            100.0 * off
        )
    } else {
        format!("{:+.0}% vs measured, OUTSIDE its interval", 100.0 * off)
    }
}

/// What a budget added over paired rounds against the recording it is set against (`bare` of
/// each pair: the same events without the budgeted probes), in % of that recording's CPU per
/// request: the median of the pairs' differences and its interval (as `paired_line`), and
/// whether the budget held within `points` %: the whole interval under it, the median only
/// (the rounds' noise reaches past it), or not.
pub fn budget_line(pairs: &[Pair], points: f64) -> String {
    let n = pairs.len();
    let mut diffs: Vec<f64> = pairs
        .iter()
        .map(|p| 100.0 * (p.with / p.bare - 1.0))
        .collect();
    diffs.sort_by(f64::total_cmp);
    let measured = median(diffs.clone());
    let (k, coverage) = sign_interval(n);
    let (low, high) = (diffs[k], diffs[n - 1 - k]);
    let verdict = if high <= points {
        format!("held within {points} points")
    } else if measured <= points {
        format!("within {points} points at the median; the interval reaches past them")
    } else {
        format!("NOT held within {points} points")
    };
    format!(
        "{measured:+.1}% ({:.0}% interval {low:+.1}..{high:+.1}% over {n} alternating pairs): \
         {verdict}",
        100.0 * coverage
    )
}

/// For `n` pairs: the index `k` of the sorted differences such that [d_k, d_(n-1-k)] covers the
/// median with probability ≥ 90% (1 − 2·P(Binomial(n, ½) ≤ k)), the largest such `k`, and its
/// coverage.
fn sign_interval(n: usize) -> (usize, f64) {
    let tail = |k: usize| -> f64 {
        // P(Binomial(n, ½) ≤ k)
        let mut c = 1.0f64;
        let mut sum = 0.0;
        for i in 0..=k {
            if i > 0 {
                c = c * (n - i + 1) as f64 / i as f64;
            }
            sum += c;
        }
        sum / 2f64.powi(n as i32)
    };
    let coverage = |k: usize| 1.0 - 2.0 * tail(k);
    // Coverage falls as k grows; with too few pairs for 90%, the widest interval (k = 0).
    let k = (0..n / 2)
        .take_while(|&k| coverage(k) >= 0.9)
        .last()
        .unwrap_or(0);
    (k, coverage(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_interval_keeps_ninety_percent() {
        // 10 pairs: [d_1, d_8] covers 1 − 2·11/1024; [d_2, d_7] would cover only 89%.
        let (k, c) = sign_interval(10);
        assert_eq!(k, 1);
        assert!((c - (1.0 - 22.0 / 1024.0)).abs() < 1e-12);
        assert_eq!(sign_interval(6).0, 0);
        // Too few pairs for 90%: the widest interval, its coverage said as it is.
        let (k, c) = sign_interval(3);
        assert_eq!(k, 0);
        assert!((c - 0.75).abs() < 1e-12);
    }

    #[test]
    fn paired_line_judges_the_printed_cost() {
        // The probes' time printed; the same measured in the target, twice what was added.
        let pair = |bare, with: f64, probes| Pair {
            bare,
            with,
            printed: Printed {
                probes,
                in_targets: 2.0 * (with - bare),
            },
        };
        let close: Vec<Pair> = (0..10)
            .map(|i| pair(100.0, 110.0 + i as f64 % 3.0, 10.5))
            .collect();
        assert!(
            paired_line(&close, "op").contains("within 20%"),
            "{}",
            paired_line(&close, "op")
        );
        let noisy: Vec<Pair> = (0..10)
            .map(|i| pair(100.0, 100.0 + 4.0 * i as f64, 30.0))
            .collect();
        assert!(paired_line(&noisy, "op").contains("inside its interval"));
        let off: Vec<Pair> = (0..10)
            .map(|i| pair(100.0, 110.0 + i as f64 % 2.0, 50.0))
            .collect();
        let line = paired_line(&off, "op");
        assert!(
            line.contains("printed (probes' time) 50 ns, +355% vs measured, OUTSIDE"),
            "{line}"
        );
        assert!(
            line.contains("measured in the target 22 ns, +100% vs measured, OUTSIDE"),
            "{line}"
        );
    }

    // Checks the budget's verdict: all ten pairs +0.5..+1.4% hold 1.5 points; a median of +1%
    // with pairs up to +4% holds at the median only; a median of +3% does not hold.
    #[test]
    fn budget_line_judges_the_interval() {
        let pairs = |with: &dyn Fn(usize) -> f64| -> Vec<Pair> {
            (0..10)
                .map(|i| Pair {
                    bare: 100.0,
                    with: with(i),
                    printed: Printed::NONE,
                })
                .collect()
        };
        let held = pairs(&|i| 100.5 + 0.1 * i as f64);
        assert!(
            budget_line(&held, 1.5).contains(": held within 1.5 points"),
            "{}",
            budget_line(&held, 1.5)
        );
        let wide = pairs(&|i| {
            [
                97.0, 99.0, 100.0, 100.5, 101.0, 101.0, 101.5, 102.0, 104.0, 104.0,
            ][i]
        });
        assert!(
            budget_line(&wide, 1.5).contains("at the median"),
            "{}",
            budget_line(&wide, 1.5)
        );
        let over = pairs(&|i| 102.5 + 0.2 * i as f64);
        assert!(budget_line(&over, 1.5).contains("NOT held"));
    }
}
