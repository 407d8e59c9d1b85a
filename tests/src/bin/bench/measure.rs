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
