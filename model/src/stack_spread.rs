//! Events counted without their stack (`--syscall-stacks sampled`, `--offcpu-stacks sampled`)
//! keep their exact value. Shown by stack, it goes to the stacks sampled in the same group (for
//! syscalls: thread, phase and syscall; for off-CPU time: thread, phase and whether blocked or
//! waiting for a CPU), in proportion to those stacks' values: which events carry a stack is
//! drawn at random per thread, independently of where they are, so the sampled stacks' shares
//! estimate all the events' shares without bias, and the totals stay exact.
use std::collections::HashMap;
use std::hash::Hash;

use crate::kinds::SYSCALL_COUNT;
use crate::profile::Sample;

/// One value to spread: its group, whether it carries a sampled stack, the value, and (sampled)
/// its weight in the group's share of the unsampled values.
pub struct Entry<G> {
    pub group: G,
    pub sampled: bool,
    pub value: u64,
    pub weight: u64,
}

/// The value each entry stands for when shown by stack: a sampled entry's own value plus its
/// share (by weight) of its group's unsampled ones, 0 for an unsampled entry whose group has a
/// sampled weight (its value went to them), its own value otherwise (a group with none shows
/// without a stack). Shares are rounded by largest remainder, ties to the larger weight, then
/// to the lesser `key(i)` (entry i's stack content): the result depends on what the entries
/// hold, not on their order, so windows merged in any order show the same numbers.
pub fn spread<G: Hash + Eq + Clone, K: Ord>(
    entries: &[Entry<G>],
    key: impl Fn(usize) -> K,
) -> Vec<u64> {
    // Per group: the unsampled values, and the sampled weights.
    let mut totals: HashMap<G, (u64, u64)> = HashMap::new();
    for e in entries {
        let t = totals.entry(e.group.clone()).or_default();
        if e.sampled {
            t.1 += e.weight;
        } else {
            t.0 += e.value;
        }
    }
    // Shares rounded down, with each sampled entry's remainder.
    let mut rems: HashMap<G, Vec<(u128, u64, usize)>> = HashMap::new();
    let mut out: Vec<u64> = (entries.iter().enumerate())
        .map(|(i, e)| {
            let (unsampled, weights) = totals[&e.group];
            match (e.sampled, weights) {
                (_, 0) => e.value,
                (false, _) => 0,
                (true, _) => {
                    let exact = e.weight as u128 * unsampled as u128;
                    let rem = exact % weights as u128;
                    rems.entry(e.group.clone())
                        .or_default()
                        .push((rem, e.weight, i));
                    e.value + (exact / weights as u128) as u64
                }
            }
        })
        .collect();
    // What rounding down lost (less than one per sampled entry) goes one by one to the
    // entries with the largest remainders.
    let mut given: HashMap<G, u64> = HashMap::new();
    for (e, v) in entries.iter().zip(&out) {
        if e.sampled {
            *given.entry(e.group.clone()).or_default() += v - e.value;
        }
    }
    for (g, mut list) in rems {
        let left = totals[&g].0.saturating_sub(given[&g]) as usize;
        list.sort_by(|a, b| {
            (b.0.cmp(&a.0))
                .then(b.1.cmp(&a.1))
                .then_with(|| key(a.2).cmp(&key(b.2)))
        });
        for &(_, _, i) in list.iter().take(left) {
            out[i] += 1;
        }
    }
    out
}

/// A syscall's group: process, thread, phase, phase set and syscall number.
type SyscallGroup = (u32, u32, u32, u64, u32);

/// Syscall counts by stack (see [`spread`]): grouped by process, thread, phase and syscall;
/// `stack_key` gives a stack's content for the ties.
pub fn counts_by_stack<K: Ord>(samples: &[&Sample], stack_key: impl Fn(u32) -> K) -> Vec<u64> {
    let entries: Vec<Entry<SyscallGroup>> = (samples.iter())
        .map(|s| Entry {
            group: (s.pid, s.tid, s.phase, s.phase_mask, s.nr),
            sampled: s.stack.is_some(),
            value: s.value(SYSCALL_COUNT),
            weight: s.value(SYSCALL_COUNT),
        })
        .collect();
    spread(&entries, |i| samples[i].stack.map(&stack_key))
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
