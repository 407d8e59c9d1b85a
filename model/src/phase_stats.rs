//! Exact per-phase totals, counted in the kernel: calls, wall time (with its histogram, laid
//! out as the kernel's), CPU, off-CPU, syscalls, named costs, allocations, page faults.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Exact totals of one phase, kept in the kernel. Values include nested phases.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct PhaseStats {
    /// Completed calls (a direct recursion counts once).
    pub calls: u64,
    pub wall_ns: u64,
    pub wall_max_ns: u64,
    /// Wall-time histogram as (bucket index, calls) pairs; see [`wall_bucket_bounds`].
    pub wall_hist: Vec<(u32, u64)>,
    pub cpu_ns: u64,
    pub offcpu_ns: u64,
    /// Of `offcpu_ns`: runnable and waiting for a CPU (preempted, or woken and not yet
    /// running); the rest was blocked.
    #[serde(default)]
    pub cpu_wait_ns: u64,
    /// Go: time the phase's goroutines spent descheduled inside it (blocked on a channel, a
    /// lock or the network poller, or waiting for a thread), apart from thread off-CPU time.
    #[serde(default)]
    pub gowait_ns: u64,
    pub syscalls: u64,
    pub syscall_ns: u64,
    /// Named costs of this phase (syscall rules counted in the kernel, alloc rules from stacks).
    pub costs: BTreeMap<String, u64>,
    /// Allocated bytes and allocations (exact for native allocators), frees.
    #[serde(default)]
    pub alloc_bytes: u64,
    #[serde(default)]
    pub allocs: u64,
    #[serde(default)]
    pub frees: u64,
    #[serde(default)]
    pub page_faults: u64,
}

impl PhaseStats {
    /// Adds `s` (another window's totals of the same phase): sums saturate, the maximum is
    /// the larger.
    pub fn absorb(&mut self, s: &PhaseStats) {
        let into = self;
        let mut hist: std::collections::BTreeMap<u32, u64> =
            into.wall_hist.iter().copied().collect();
        for &(i, n) in &s.wall_hist {
            let e = hist.entry(i).or_default();
            *e = e.saturating_add(n);
        }
        into.wall_hist = hist.into_iter().collect();
        into.calls = into.calls.saturating_add(s.calls);
        into.wall_ns = into.wall_ns.saturating_add(s.wall_ns);
        into.wall_max_ns = into.wall_max_ns.max(s.wall_max_ns);
        into.cpu_ns = into.cpu_ns.saturating_add(s.cpu_ns);
        into.offcpu_ns = into.offcpu_ns.saturating_add(s.offcpu_ns);
        into.cpu_wait_ns = into.cpu_wait_ns.saturating_add(s.cpu_wait_ns);
        into.gowait_ns = into.gowait_ns.saturating_add(s.gowait_ns);
        into.syscalls = into.syscalls.saturating_add(s.syscalls);
        into.syscall_ns = into.syscall_ns.saturating_add(s.syscall_ns);
        for (k, v) in &s.costs {
            let e = into.costs.entry(k.clone()).or_default();
            *e = e.saturating_add(*v);
        }
        into.alloc_bytes = into.alloc_bytes.saturating_add(s.alloc_bytes);
        into.allocs = into.allocs.saturating_add(s.allocs);
        into.frees = into.frees.saturating_add(s.frees);
        into.page_faults = into.page_faults.saturating_add(s.page_faults);
    }
}

/// Buckets below this are one nanosecond wide; above, 16 per power of two (as in the kernel).
pub const WALL_SUB_BUCKETS: u64 = 16;

/// The half-open range of durations (ns) that wall-time bucket `idx` holds.
pub fn wall_bucket_bounds(idx: u32) -> (u64, u64) {
    let idx = idx as u64;
    if idx < WALL_SUB_BUCKETS {
        return (idx, idx + 1);
    }
    let msb = idx / WALL_SUB_BUCKETS + 3;
    let sub = idx % WALL_SUB_BUCKETS;
    let shift = msb - 4;
    (
        (WALL_SUB_BUCKETS + sub) << shift,
        (WALL_SUB_BUCKETS + sub + 1) << shift,
    )
}

impl PhaseStats {
    /// The `q` quantile (0..=1) of wall time: the midpoint of the bucket holding it, capped by
    /// the exact maximum.
    pub fn wall_quantile(&self, q: f64) -> u64 {
        let total: u64 = crate::saturating_sum(self.wall_hist.iter().map(|(_, n)| *n));
        if total == 0 {
            return 0;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        let mut hist = self.wall_hist.clone();
        hist.sort();
        for (idx, n) in hist {
            seen += n;
            if seen >= rank {
                let (lo, hi) = wall_bucket_bounds(idx);
                return ((lo + hi - 1) / 2).min(self.wall_max_ns.max(lo));
            }
        }
        self.wall_max_ns
    }
}
