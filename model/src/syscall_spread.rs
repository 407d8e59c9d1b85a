//! Syscalls whose stack was not sampled (`--syscall-stacks sampled`) are counted exactly, without
//! a stack. Shown by stack, their count goes to the stacks sampled for the same process, phase
//! and syscall, in proportion to those stacks' counts: every syscall had the same chance to be
//! sampled, so the sampled stacks' shares estimate all the syscalls' shares without bias, and the
//! totals stay exact.
use std::collections::HashMap;

use crate::profile::SyscallSample;

/// The count each sample stands for when shown by stack: a sampled stack's own count plus its
/// share of its group's unsampled ones, 0 for an unsampled entry whose group has a sampled stack
/// (its count went to them), its own count otherwise (a group with no sampled stack shows
/// without one).
pub fn counts_by_stack(samples: &[SyscallSample]) -> Vec<u64> {
    type Group = (u32, u32, u64, u32);
    let group = |s: &SyscallSample| -> Group { (s.pid, s.phase, s.phase_mask, s.nr) };
    // Per group: every syscall, and those with a sampled stack.
    let mut totals: HashMap<Group, (u64, u64)> = HashMap::new();
    for s in samples {
        let t = totals.entry(group(s)).or_default();
        t.0 += s.count;
        if s.stack.is_some() {
            t.1 += s.count;
        }
    }
    let mut out: Vec<u64> = samples
        .iter()
        .map(|s| {
            let (all, sampled) = totals[&group(s)];
            match (s.stack, sampled) {
                (_, 0) => s.count,
                (None, _) => 0,
                (Some(_), _) => (s.count as u128 * all as u128 / sampled as u128) as u64,
            }
        })
        .collect();
    // Rounding down lost at most one per sampled stack: the group's first sampled stack takes
    // what is left, so the group's total is exact.
    let mut given: HashMap<Group, u64> = HashMap::new();
    for (s, v) in samples.iter().zip(&out) {
        *given.entry(group(s)).or_default() += v;
    }
    for (s, v) in samples.iter().zip(out.iter_mut()) {
        let g = group(s);
        if s.stack.is_some() {
            if let Some(left) = given.get_mut(&g) {
                let (all, _) = totals[&g];
                *v += all - *left;
                *left = all;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(nr: u32, stack: Option<u32>, count: u64) -> SyscallSample {
        SyscallSample {
            pid: 1,
            phase: 0,
            phase_mask: 1,
            nr,
            name: String::new(),
            stack,
            count,
            total_ns: 0,
        }
    }

    // Checks the spread: 90 unsampled writes go to the two sampled write stacks 3:1 (exact
    // total 100), a read with no sampled stack keeps its count without one.
    #[test]
    fn unsampled_counts_follow_the_sampled_stacks() {
        let s = [
            sample(1, Some(7), 6),
            sample(1, None, 90),
            sample(1, Some(8), 2),
            sample(1, Some(9), 2),
            sample(0, None, 5),
        ];
        let got = counts_by_stack(&s);
        assert_eq!(got[1], 0);
        assert_eq!(got[4], 5);
        assert_eq!(got[0] + got[2] + got[3], 100);
        assert_eq!((got[0], got[2], got[3]), (60, 20, 20));
    }
}
