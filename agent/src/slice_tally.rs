//! What a budget's slices count (`slice_budget`): the targets' and the probes' counters at a
//! mark, and what was counted between marks, over the whole recording or a window.
use std::time::Duration;

use crate::slice_align::SliceAlignment;

/// The targets' CPU time, the probes' estimated time and the targets' read and write syscalls,
/// as counters.
#[derive(Clone, Default)]
pub struct Marks {
    pub cpu_ns: u64,
    pub probe_ns: f64,
    pub syscalls: u64,
    /// The reads among them, and the bytes they returned.
    pub reads: u64,
    pub read_bytes: u64,
    /// Calls a slice's start or end cut, never counted.
    pub voided: u64,
    /// When taken (CLOCK_MONOTONIC).
    pub mono_ns: u64,
}

impl Marks {
    /// The counters halfway between two readings.
    pub fn halfway(&self, after: &Marks) -> Marks {
        let mid = |a: u64, b: u64| a + (b.saturating_sub(a)) / 2;
        Marks {
            cpu_ns: mid(self.cpu_ns, after.cpu_ns),
            probe_ns: (self.probe_ns + after.probe_ns) / 2.0,
            syscalls: mid(self.syscalls, after.syscalls),
            reads: mid(self.reads, after.reads),
            read_bytes: mid(self.read_bytes, after.read_bytes),
            voided: mid(self.voided, after.voided),
            mono_ns: mid(self.mono_ns, after.mono_ns),
        }
    }

    /// The targets' own CPU time from `self` to `now` (the probes' time left out).
    pub fn own_until(&self, now: &Marks) -> u64 {
        let probe = (now.probe_ns - self.probe_ns).max(0.0) as u64;
        now.cpu_ns.saturating_sub(self.cpu_ns).saturating_sub(probe)
    }
}

/// What has been counted since a mark: the whole recording's, or a window's.
#[derive(Clone, Copy, Default)]
pub struct Tally {
    pub counted_own_ns: u64,
    /// Wall time the probes were counting.
    pub counted_ns: u64,
    pub slices: u64,
    pub shortest: Option<Duration>,
    /// The probes were detached at least once.
    pub detached: bool,
    /// The targets' CPU time (probes included) and syscalls while counted.
    pub cpu_in_ns: u64,
    pub sys_in: u64,
    pub reads_in: u64,
    pub read_bytes_in: u64,
    pub spread: phaseprof_model::slice_spread::SliceSpread,
    pub align: SliceAlignment,
}

impl Tally {
    pub fn slice(&mut self, length: Duration) {
        self.slices += 1;
        self.shortest = Some(self.shortest.map_or(length, |s| s.min(length)));
    }
}
