//! validator-sim: blocks of `propose` / `replay` / `finalize` with known costs.
//!
//! Every cost is set by a flag and the truth is printed as one JSON line on stdout at the end
//! (that print is itself exactly one `write(2)`, counted in `write_syscalls`).
//!
//! ```text
//! validator-sim [--blocks N] [--threads N] [--burn-ms MS] [--clone-bytes B]
//!               [--flushes N] [--sleep-ms MS] [--wait-stdin] [--flush-to PATH]
//! ```
//! Per block: `propose` burns `--burn-ms` of CPU in `validator_sim::work::burn_cpu`;
//! `replay` clones a `Vec<u8>` of `--clone-bytes`; `finalize` does `--flushes` BufWriter flushes
//! (each exactly one `write(2)`) and sleeps `--sleep-ms`. With `--threads 1` (the default) the main
//! thread does the work itself, so no thread waits in `join` and off-CPU time is the sleep alone.
//! `--leak-bytes B` makes `replay` leak B bytes per block (touched, so resident) through
//! `validator_sim::work::leak`. `--small-allocs N` makes `replay` allocate and free N small
//! buffers (an allocation-heavy phase, for allocation-probe overhead). A counting global allocator gives `alloc_bytes`, `allocs` and
//! `frees` up to the truth line itself.

mod counting;
mod phases;
mod work;

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Clone, Debug)]
pub struct Config {
    pub blocks: u64,
    pub threads: u64,
    pub burn_ms: u64,
    pub clone_bytes: u64,
    pub flushes: u64,
    pub sleep_ms: u64,
    pub wait_stdin: bool,
    pub flush_to: String,
    pub leak_bytes: u64,
    pub small_allocs: u64,
}

/// What actually happened, summed over threads.
#[derive(Default)]
pub struct Truth {
    pub block_calls: AtomicU64,
    pub propose_calls: AtomicU64,
    pub replay_calls: AtomicU64,
    pub finalize_calls: AtomicU64,
    pub flushes: AtomicU64,
    pub clone_bytes: AtomicU64,
    pub burn_cpu_ns: AtomicU64,
    pub slept_ns: AtomicU64,
    pub leaked_bytes: AtomicU64,
    /// Time the worker threads waited for a CPU while runnable (the kernel's schedstat): off-CPU
    /// time beyond the sleeps, which CPU contention adds.
    pub run_delay_ns: AtomicU64,
    /// Time the block loops' threads were off the CPU, by the kernel's accounting: their wall
    /// time less their CPU time (schedstat), blocked and waiting alike.
    pub off_cpu_ns: AtomicU64,
}

/// The host's steal time so far (all CPUs, ns): time a hypervisor ran something else while a
/// task was on the CPU. The kernel leaves it out of the task's CPU time (with paravirt steal
/// accounting), so `off_cpu_ns` (wall less CPU time) holds it though the task was switched in.
/// /proc/stat counts it in USER_HZ ticks (100 a second on x86).
fn host_steal_ns() -> u64 {
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| s.lines().next()?.split_whitespace().nth(8)?.parse().ok())
        .map_or(0, |ticks: u64| ticks * 10_000_000)
}

/// Field `n` of /proc/thread-self/schedstat: 0 this thread's CPU time, 1 its time spent
/// runnable on a run queue (0 when the kernel keeps no schedstats).
fn schedstat(n: usize) -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().nth(n)?.parse().ok())
        .unwrap_or(0)
}

fn parse_args() -> Result<Config, String> {
    let mut c = Config {
        blocks: 20,
        threads: 1,
        burn_ms: 0,
        clone_bytes: 0,
        flushes: 0,
        sleep_ms: 0,
        wait_stdin: false,
        flush_to: "/dev/null".into(),
        leak_bytes: 0,
        small_allocs: 0,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |name: &str| -> Result<u64, String> {
            let v = args.next().ok_or(format!("{name} needs a value"))?;
            v.parse().map_err(|_| format!("{name}: `{v}` is not a number"))
        };
        match a.as_str() {
            "--blocks" => c.blocks = num("--blocks")?,
            "--threads" => c.threads = num("--threads")?.max(1),
            "--burn-ms" => c.burn_ms = num("--burn-ms")?,
            "--clone-bytes" => c.clone_bytes = num("--clone-bytes")?,
            "--flushes" => c.flushes = num("--flushes")?,
            "--sleep-ms" => c.sleep_ms = num("--sleep-ms")?,
            "--wait-stdin" => c.wait_stdin = true,
            "--leak-bytes" => c.leak_bytes = num("--leak-bytes")?,
            "--small-allocs" => c.small_allocs = num("--small-allocs")?,
            "--flush-to" => c.flush_to = args.next().ok_or("--flush-to needs a path")?,
            "-h" | "--help" => {
                return Err("usage: validator-sim [--blocks N] [--threads N] [--burn-ms MS] \
                     [--clone-bytes B] [--flushes N] [--sleep-ms MS] [--leak-bytes B] [--small-allocs N] [--wait-stdin] [--flush-to PATH]"
                    .into())
            }
            other => return Err(format!("unknown flag `{other}`")),
        }
    }
    Ok(c)
}

fn run_thread(config: &Config, truth: &Truth) {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&config.flush_to)
        .unwrap_or_else(|e| panic!("open {}: {e}", config.flush_to));
    let mut out = std::io::BufWriter::with_capacity(1 << 16, file);
    let source = vec![7u8; config.clone_bytes as usize];
    let (start, ran_before) = (std::time::Instant::now(), schedstat(0));
    for block in 0..config.blocks {
        phases::block(config, truth, &source, &mut out, block);
    }
    // Without schedstats (a running thread's CPU time is never 0) there is no truth to give.
    if ran_before > 0 {
        let ran = schedstat(0) - ran_before;
        let wall = start.elapsed().as_nanos() as u64;
        truth.off_cpu_ns.fetch_add(wall.saturating_sub(ran), Ordering::SeqCst);
    }
    // The run delay is read last, after the final flush, so that as little as can be of what
    // a profiler sees this thread wait comes after it (only its way out).
    drop(out);
    truth.run_delay_ns.fetch_add(schedstat(1), Ordering::SeqCst);
}

fn main() {
    let config = match parse_args() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("validator-sim: {e}");
            std::process::exit(2);
        }
    };
    if config.wait_stdin {
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line).expect("read stdin");
    }
    let truth = Arc::new(Truth::default());
    let steal_before = host_steal_ns();
    let start = std::time::Instant::now();
    if config.threads == 1 {
        run_thread(&config, &truth);
    } else {
        let handles: Vec<_> = (0..config.threads)
            .map(|i| {
                let (c, t) = (config.clone(), truth.clone());
                std::thread::Builder::new()
                    .name(format!("validator-{i}"))
                    .spawn(move || run_thread(&c, &t))
                    .expect("spawn")
            })
            .collect();
        for h in handles {
            h.join().expect("worker panicked");
        }
    }
    let elapsed = start.elapsed().as_nanos();
    let steal = host_steal_ns().saturating_sub(steal_before);
    let g = |a: &AtomicU64| a.load(Ordering::SeqCst);
    // Read before the truth line is formatted: its own allocations come after.
    let (alloc_bytes, allocs, frees) = (
        g(&counting::BYTES),
        g(&counting::ALLOCS),
        g(&counting::FREES),
    );
    let flushes = g(&truth.flushes);
    let json = format!(
        concat!(
            "{{\"pid\":{},\"blocks\":{},\"threads\":{},",
            "\"calls\":{{\"block\":{},\"propose\":{},\"replay\":{},\"finalize\":{}}},",
            "\"flushes\":{},\"write_syscalls\":{},\"clone_bytes\":{},",
            "\"burn_fn\":\"validator_sim::work::burn_cpu\",\"burn_cpu_ns\":{},",
            "\"sleep_requested_ns\":{},\"slept_ns\":{},\"leaked_bytes\":{},",
            "\"alloc_bytes\":{},\"allocs\":{},\"frees\":{},\"elapsed_ns\":{},",
            "\"run_delay_ns\":{},\"off_cpu_ns\":{},\"host_steal_ns\":{}}}\n"
        ),
        std::process::id(),
        config.blocks,
        config.threads,
        g(&truth.block_calls),
        g(&truth.propose_calls),
        g(&truth.replay_calls),
        g(&truth.finalize_calls),
        flushes,
        flushes + 1, // + this very print
        g(&truth.clone_bytes),
        g(&truth.burn_cpu_ns),
        config.sleep_ms * 1_000_000 * config.blocks * config.threads,
        g(&truth.slept_ns),
        g(&truth.leaked_bytes),
        alloc_bytes,
        allocs,
        frees,
        elapsed,
        g(&truth.run_delay_ns),
        g(&truth.off_cpu_ns),
        steal,
    );
    // One write(2): the whole line goes out in a single call.
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(json.as_bytes()).expect("write truth");
    stdout.flush().expect("flush truth");
}
