//! Off-CPU time of switch-outs whose stacks were not sampled (`--offcpu-stacks sampled`) goes
//! to the stacks sampled in the same window for the same thread and phase, at the drain: blocked
//! time over the sampled blocked time, time waiting for a CPU over the sampled waits, each
//! sampled switch-out weighed by its thread's one-in-N when it was taken (`ns_weighted`): N
//! changes over a recording (every stack while a thread switches out rarely, one in thousands
//! when it switches 70,000 times a second), so the plain sampled times would over-weigh the
//! moments N was small. Totals stay exact; the window says how much of its time had a stack of
//! its own (`Meta::offcpu_own_stack_ns`).
use phaseprof_bpf::types::{offcpu_key, offcpu_value};
use phaseprof_model::stack_spread::{spread, Entry};

use super::stacks::NOT_SAMPLED;

/// Each key's off-CPU time after the spread, as (ns, of them waiting for a CPU), with the keys
/// whose time went elsewhere left out; and the time that had its own stack.
pub fn spread_offcpu(
    counts: Vec<(offcpu_key, offcpu_value)>,
) -> (Vec<(offcpu_key, [u64; 2])>, u64) {
    let own: u64 = (counts.iter())
        .filter(|(k, _)| k.user_stack != NOT_SAMPLED)
        .map(|(_, v)| v.ns)
        .sum();
    let group = |k: &offcpu_key| (k.tgid, k.tid, k.phase, k.phase_mask);
    let entries = |part: fn(&offcpu_value) -> (u64, u64)| -> Vec<_> {
        (counts.iter())
            .map(|(k, v)| {
                let (value, weight) = part(v);
                Entry {
                    group: group(k),
                    sampled: k.user_stack != NOT_SAMPLED,
                    value,
                    weight,
                }
            })
            .collect()
    };
    let blocked = entries(|v| {
        (
            v.ns.saturating_sub(v.cpu_wait_ns),
            v.ns_weighted.saturating_sub(v.cpu_wait_weighted),
        )
    });
    let waiting = entries(|v| (v.cpu_wait_ns, v.cpu_wait_weighted));
    let tie = |i: usize| (counts[i].0.user_stack, counts[i].0.kernel_stack);
    let (blocked, waiting) = (spread(&blocked, tie), spread(&waiting, tie));
    let out = (counts.iter().zip(blocked.into_iter().zip(waiting)))
        .filter(|(_, (b, w))| b + w > 0)
        .map(|((k, _), (b, w))| (*k, [b + w, w]))
        .collect();
    (out, own)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tid: u32, user_stack: u64) -> offcpu_key {
        offcpu_key {
            tgid: 1,
            tid,
            user_stack,
            ..Default::default()
        }
    }

    fn value(ns: u64, wait: u64, every: u64) -> offcpu_value {
        offcpu_value {
            ns,
            cpu_wait_ns: wait,
            ns_weighted: ns * every,
            cpu_wait_weighted: wait * every,
        }
    }

    // Checks the weighting: stack A sampled at one in 1 (100 ns) and stack B at one in 10
    // (100 ns) stand for 100 and 1,000 ns; 1,100 ns unsampled go 1:10, blocked and waiting
    // apart; another thread's unsampled time, with no sampled stack, keeps its own key.
    #[test]
    fn unsampled_time_follows_the_weighted_samples() {
        let counts = vec![
            (key(5, 10), value(100, 0, 1)),
            (key(5, 20), value(100, 50, 10)),
            (key(5, NOT_SAMPLED), value(1100, 550, 0)),
            (key(6, NOT_SAMPLED), value(7, 0, 0)),
        ];
        let (out, own) = spread_offcpu(counts);
        assert_eq!(own, 200);
        let got: Vec<(u32, u64, [u64; 2])> =
            out.iter().map(|(k, v)| (k.tid, k.user_stack, *v)).collect();
        // Blocked: 550 unsampled over weights 100 (A) and 500 (B): 92 and 458 (largest
        // remainder). Waiting: all 550 to B, the only sampled wait.
        assert_eq!(
            got,
            vec![
                (5, 10, [100 + 92, 0]),
                (5, 20, [100 + 458 + 550, 50 + 550]),
                (6, NOT_SAMPLED, [7, 0]),
            ]
        );
        let total: u64 = out.iter().map(|(_, v)| v[0]).sum();
        assert_eq!(total, 100 + 100 + 1100 + 7);
    }
}
