//! What one drain of the kernel maps yields: raw keys with stack addresses, not yet symbolized.
//!
//! This is the seam between recording and processing: the BPF engine produces [`RawWindow`]s,
//! the aggregator consumes them, and tests can build them by hand without root.

/// User or kernel return addresses, leaf first (index 0 is the sampled instruction pointer).
pub type Addrs = Vec<u64>;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct RawWindow {
    pub cpu: Vec<RawCpu>,
    pub offcpu: Vec<RawOffCpu>,
    pub syscalls: Vec<RawSyscall>,
    /// Exact allocation totals per (process, phase).
    pub alloc_totals: Vec<RawAllocTotal>,
    /// Byte-sampled allocation stacks (native allocators).
    pub allocs: Vec<RawAlloc>,
    /// Go's own heap-profile samples, each to be weighed by its sampling rate.
    pub go_allocs: Vec<RawGoAlloc>,
    /// Page faults per (thread, phase, user stack); `kernel` is always None.
    pub page_faults: Vec<RawCpu>,
}

/// Folds samples with the same key and stacks into one, counts summed (samples unwound in user
/// space arrive one by one; the kernel folds the others in its maps already).
pub fn fold_identical(samples: Vec<RawCpu>) -> Vec<RawCpu> {
    type Key = (u32, u32, u32, u64, Option<Addrs>, Option<Addrs>);
    let mut folded: std::collections::HashMap<Key, u64> = std::collections::HashMap::new();
    for s in samples {
        *folded
            .entry((s.pid, s.tid, s.phase, s.phase_mask, s.user, s.kernel))
            .or_default() += s.count;
    }
    folded
        .into_iter()
        .map(
            |((pid, tid, phase, phase_mask, user, kernel), count)| RawCpu {
                pid,
                tid,
                phase,
                phase_mask,
                user,
                kernel,
                count,
            },
        )
        .collect()
}

#[derive(Clone, Debug, PartialEq)]
pub struct RawCpu {
    pub pid: u32,
    pub tid: u32,
    pub phase: u32,
    /// Every phase on the thread's stack (bit i: phase i; 1: none).
    pub phase_mask: u64,
    pub user: Option<Addrs>,
    pub kernel: Option<Addrs>,
    pub count: u64,
}

/// A cpu sample or page fault of a target whose user stack is unwound in user space
/// (`--unwind copy`): its user registers and a copy of its stack, to become a [`RawCpu`] (of
/// `RawWindow::cpu` or `page_faults`) once unwound.
#[derive(Clone, Debug, PartialEq)]
pub struct RawStackSample {
    pub page_fault: bool,
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
pub struct RawOffCpu {
    pub pid: u32,
    pub tid: u32,
    pub phase: u32,
    /// Every phase on the thread's stack (bit i: phase i; 1: none).
    pub phase_mask: u64,
    pub user: Option<Addrs>,
    pub kernel: Option<Addrs>,
    pub ns: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RawSyscall {
    pub pid: u32,
    pub tid: u32,
    pub phase: u32,
    /// Every phase on the thread's stack (bit i: phase i; 1: none).
    pub phase_mask: u64,
    pub nr: u32,
    pub user: Option<Addrs>,
    pub count: u64,
    pub total_ns: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RawAllocTotal {
    pub pid: u32,
    pub phase: u32,
    pub phase_mask: u64,
    pub bytes: u64,
    pub count: u64,
    pub frees: u64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct RawAlloc {
    pub pid: u32,
    pub phase: u32,
    pub phase_mask: u64,
    pub user: Option<Addrs>,
    /// Unbiased estimate of the bytes these samples stand for.
    pub est_bytes: u64,
    pub samples: u64,
    /// The sampled allocations' own sizes.
    pub sampled_bytes: u64,
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
        self.cpu.is_empty()
            && self.offcpu.is_empty()
            && self.syscalls.is_empty()
            && self.alloc_totals.is_empty()
            && self.allocs.is_empty()
            && self.go_allocs.is_empty()
            && self.page_faults.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that samples differing only in count fold into one, and any other difference
    // (thread, phase, user or kernel stack) keeps them apart.
    #[test]
    fn folds_identical_samples() {
        let s = |tid, user: Vec<u64>, count| RawCpu {
            pid: 7,
            tid,
            phase: 1,
            phase_mask: 0b11,
            user: Some(user),
            kernel: None,
            count,
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
