//! CPU work with a name of its own, so profiles can be checked against it.
use std::hint::black_box;
use std::time::{Duration, Instant};

#[repr(C)]
struct Timespec {
    sec: i64,
    nsec: i64,
}

extern "C" {
    fn clock_gettime(clock: i32, ts: *mut Timespec) -> i32;
}

const CLOCK_THREAD_CPUTIME_ID: i32 = 3;

fn thread_cpu_ns() -> u64 {
    let mut ts = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.sec as u64 * 1_000_000_000 + ts.nsec as u64
}

/// Spins for `wall` of wall-clock time (checked through the vDSO clock, so no syscalls while
/// spinning) and returns the CPU time this thread actually got meanwhile.
#[inline(never)]
pub fn burn_cpu(wall: Duration, seed: u64) -> u64 {
    let cpu_start = thread_cpu_ns();
    let start = Instant::now();
    let mut x = seed | 1;
    while start.elapsed() < wall {
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        black_box(x);
    }
    thread_cpu_ns() - cpu_start
}

/// Allocates `bytes`, touches every page (so the memory is resident) and never frees it.
#[inline(never)]
pub fn leak(bytes: usize) {
    let v = black_box(vec![1u8; bytes]);
    std::mem::forget(v);
}

/// One small heap allocation, filled and freed (a message header, a map node ...).
#[inline(never)]
pub fn small_alloc(i: u64) {
    let b = black_box(Box::new([i as u8; 64]));
    drop(b);
}
