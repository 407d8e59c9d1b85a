//! What one drain of the kernel maps yields: raw keys with stack addresses, not yet symbolized.
//!
//! This is the seam between recording and processing: the BPF engine produces [`RawWindow`]s,
//! the aggregator consumes them, and tests can build them by hand without root.

use phaseprof_model::SampleKind;

/// User or kernel return addresses, leaf first (index 0 is the sampled instruction pointer).
pub type Addrs = Vec<u64>;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawWindow {
    /// Every kind's samples, their values as the kind lists them (`phaseprof_model::kinds`).
    pub samples: Vec<RawSample>,
    /// Go's own heap-profile samples, each to be weighed by its sampling rate.
    pub go_allocs: Vec<RawGoAlloc>,
    /// Of the off-CPU time, what had a stack of its own (`Meta::offcpu_own_stack_ns`).
    pub offcpu_own_stack_ns: u64,
}

/// Folds samples with the same key and stacks into one, values summed (samples unwound in
/// user space arrive one by one; the kernel folds the others in its maps already).
pub fn fold_identical(samples: Vec<RawSample>) -> Vec<RawSample> {
    // Keyed by the sample without its values.
    let mut folded: std::collections::HashMap<RawSample, Vec<u64>> = Default::default();
    for mut s in samples {
        let values = std::mem::take(&mut s.values);
        let kind = s.kind;
        kind.absorb(folded.entry(s).or_default(), &values);
    }
    (folded.into_iter())
        .map(|(s, values)| RawSample { values, ..s })
        .collect()
}

/// An allocation stack's values from the kernel's counts: its estimated bytes, the
/// allocations sampled, and the allocations estimated (in thousandths) as a ratio: the samples
/// scaled as their bytes were.
pub fn alloc_values(est_bytes: u64, samples: u64, sampled_bytes: u64) -> Vec<u64> {
    let count = match sampled_bytes {
        0 => samples as f64,
        sampled => samples as f64 * est_bytes as f64 / sampled as f64,
    };
    vec![est_bytes, samples, phaseprof_model::milli(count)]
}

/// Events of one key as the kernel's maps count them, with their stacks' addresses.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RawSample {
    pub kind: SampleKind,
    pub pid: u32,
    /// 0 for kinds counted per process.
    pub tid: u32,
    pub phase: u32,
    /// Every phase on the thread's stack (bit i: phase i; 1: none).
    pub phase_mask: u64,
    /// The syscall number (syscall samples).
    pub nr: u32,
    pub user: Option<Addrs>,
    pub kernel: Option<Addrs>,
    pub values: Vec<u64>,
}

impl RawSample {
    /// A sample of `kind` without stacks or syscall number.
    pub fn new(kind: SampleKind, (pid, tid): (u32, u32), (phase, phase_mask): (u32, u64)) -> Self {
        RawSample {
            kind,
            pid,
            tid,
            phase,
            phase_mask,
            nr: 0,
            user: None,
            kernel: None,
            values: Vec::new(),
        }
    }
}

/// A cpu sample or page fault of a target whose user stack is unwound in user space
/// (`--unwind copy`): its user registers and a copy of its stack, to become a [`RawSample`]
/// once unwound.
#[derive(Clone, Debug, PartialEq)]
pub struct RawStackSample {
    /// Cpu or page fault.
    pub kind: SampleKind,
    pub pid: u32,
    pub tid: u32,
    pub phase: u32,
    pub phase_mask: u64,
    pub kernel: Option<Addrs>,
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Memory from `sp` up (shorter than asked when the copy met an unreadable page).
    pub stack: Vec<u8>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RawGoAlloc {
    pub pid: u32,
    pub phase: u32,
    pub phase_mask: u64,
    pub user: Option<Addrs>,
    pub size: u64,
    /// runtime.MemProfileRate when sampled (0: unknown).
    pub rate: i64,
}

/// A sampled allocation not freed when the heap was read.
#[derive(Clone, Debug, PartialEq)]
pub struct RawLive {
    pub pid: u32,
    pub phase: u32,
    pub phase_mask: u64,
    pub user: Option<Addrs>,
    pub est_bytes: u64,
    pub size: u64,
    /// CLOCK_MONOTONIC ns of the allocation.
    pub allocated_at_ns: u64,
}

impl RawWindow {
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty() && self.go_allocs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that samples differing only in count fold into one, and any other difference
    // (thread, phase, user or kernel stack) keeps them apart.
    #[test]
    fn folds_identical_samples() {
        let s = |tid, user: Vec<u64>, count| RawSample {
            user: Some(user),
            values: vec![count],
            ..RawSample::new(SampleKind::Cpu, (7, tid), (1, 0b11))
        };
        let mut got = fold_identical(vec![
            s(1, vec![10, 20], 1),
            s(1, vec![10, 20], 2),
            s(2, vec![10, 20], 1),
            s(1, vec![10, 21], 1),
        ]);
        got.sort_by_key(|c| (c.tid, c.user.clone()));
        assert_eq!(
            got,
            vec![
                s(1, vec![10, 20], 3),
                s(1, vec![10, 21], 1),
                s(2, vec![10, 20], 1)
            ]
        );
    }
}
