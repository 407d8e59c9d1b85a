//! Syscalls whose stack was not sampled (`--syscall-stacks sampled`) are counted exactly, without
//! a stack. Shown by stack, their count goes to the stacks sampled for the same thread, phase
//! and syscall (sampling is one in N per thread), in proportion to those stacks' counts: every syscall had the same chance to be
//! sampled, so the sampled stacks' shares estimate all the syscalls' shares without bias, and the
//! totals stay exact.
use std::collections::HashMap;

use crate::kinds::SYSCALL_COUNT;
use crate::profile::Sample;

/// The count each sample stands for when shown by stack: a sampled stack's own count plus its
/// share of its group's unsampled ones, 0 for an unsampled entry whose group has a sampled stack
/// (its count went to them), its own count otherwise (a group with no sampled stack shows
/// without one). Shares are rounded by largest remainder, ties to the larger count, then to
/// the lesser `stack_key` (a stack's content): the result depends on what the samples hold,
/// not on their order, so windows merged in any order show the same numbers.
pub fn counts_by_stack<K: Ord>(samples: &[&Sample], stack_key: impl Fn(u32) -> K) -> Vec<u64> {
    type Group = (u32, u32, u32, u64, u32);
    let group = |s: &Sample| -> Group { (s.pid, s.tid, s.phase, s.phase_mask, s.nr) };
    // Per group: every syscall, and those with a sampled stack.
    let mut totals: HashMap<Group, (u64, u64)> = HashMap::new();
    for s in samples.iter().copied() {
        let t = totals.entry(group(s)).or_default();
        t.0 += s.value(SYSCALL_COUNT);
        if s.stack.is_some() {
            t.1 += s.value(SYSCALL_COUNT);
        }
    }
    // Rounded down, with each sampled entry's remainder.
    let mut rems: HashMap<Group, Vec<(u128, u64, usize)>> = HashMap::new();
    let mut out: Vec<u64> = (samples.iter().copied().enumerate())
        .map(|(i, s)| {
            let count = s.value(SYSCALL_COUNT);
            let g = group(s);
            let (all, sampled) = totals[&g];
            match (s.stack, sampled) {
                (_, 0) => count,
                (None, _) => 0,
                (Some(_), _) => {
                    let exact = count as u128 * all as u128;
                    let rem = exact % sampled as u128;
                    rems.entry(g).or_default().push((rem, count, i));
                    (exact / sampled as u128) as u64
                }
            }
        })
        .collect();
    // What rounding down lost (less than one per sampled entry) goes one by one to the
    // entries with the largest remainders.
    let mut given: HashMap<Group, u64> = HashMap::new();
    for (s, v) in samples.iter().copied().zip(&out) {
        *given.entry(group(s)).or_default() += v;
    }
    for (g, mut entries) in rems {
        let left = totals[&g].0.saturating_sub(given[&g]) as usize;
        let key = |i: usize| samples[i].stack.map(&stack_key);
        entries.sort_by(|a, b| {
            (b.0.cmp(&a.0))
                .then(b.1.cmp(&a.1))
                .then_with(|| key(a.2).cmp(&key(b.2)))
        });
        for &(_, _, i) in entries.iter().take(left) {
            out[i] += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(nr: u32, stack: Option<u32>, count: u64) -> Sample {
        let at = crate::PhaseAt::NONE;
        Sample::new(crate::SampleKind::Syscall, (1, 1), at, vec![count, 0])
            .on(stack)
            .syscall(nr)
    }

    fn spread(s: &[Sample]) -> Vec<u64> {
        counts_by_stack(&s.iter().collect::<Vec<_>>(), |st| st)
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
        let got = spread(&s);
        assert_eq!(got[1], 0);
        assert_eq!(got[4], 5);
        assert_eq!(got[0] + got[2] + got[3], 100);
        assert_eq!((got[0], got[2], got[3]), (60, 20, 20));
        // Whatever the order, the same numbers: 7 unsampled over three stacks of 1.
        let s = [
            sample(1, Some(8), 1),
            sample(1, None, 7),
            sample(1, Some(9), 1),
            sample(1, Some(7), 1),
        ];
        let got = spread(&s);
        assert_eq!((got[3], got[0], got[2]), (4, 3, 3));
        let reversed: Vec<Sample> = s.iter().rev().cloned().collect();
        let got = spread(&reversed);
        assert_eq!((got[0], got[3], got[1]), (4, 3, 3));
    }
}
