//! Off-CPU time a window counted without a stack for a thread and phase of which it sampled no
//! switch-out (`--offcpu-stacks sampled`) goes to the stacks the last window that did sample
//! them showed, by their blocked and waiting times: a thread's one-in-N is set for its pace
//! over the last 100 ms, so a short window (the recording's last), or one in which the thread
//! slowed down, can draw none of its switch-outs, and its time would show as `[no stack]` (80
//! of `perf bench sched pipe`'s workers' 1,864 ms under 5.10's emulation). The window's own
//! stacks stand where it has any; totals stay exact, and the time that had a stack of its own
//! (`Meta::offcpu_own_stack_ns`) is unchanged.
use std::collections::HashMap;

use phaseprof_model::stack_spread::{spread, Entry};

use crate::window::{Addrs, RawSample};

/// A thread and phase: (pid, tid, phase, phase mask).
type Group = (u32, u32, u32, u64);

/// A stack a window showed for a group, with its blocked and waiting time there.
#[derive(Clone)]
struct Shown {
    user: Option<Addrs>,
    kernel: Option<Addrs>,
    blocked: u64,
    waiting: u64,
}

/// The stacks the last window that sampled each group showed for it.
#[derive(Default)]
pub struct OffcpuCarry {
    last: HashMap<Group, Vec<Shown>>,
}

fn group_of(s: &RawSample) -> Group {
    (s.pid, s.tid, s.phase, s.phase_mask)
}

fn stackless(s: &RawSample) -> bool {
    s.user.is_none() && s.kernel.is_none()
}

impl OffcpuCarry {
    /// A window's off-CPU samples after the spread (values: ns, of them waiting for a CPU):
    /// a stackless one of a group the window sampled nothing of goes to the stacks the last
    /// window showed for that group. Remembers the groups shown by stack here; forgets those
    /// this window saw nothing of (threads gone or idle), so what is kept stays bounded by
    /// the threads that run.
    pub fn apply(&mut self, samples: Vec<RawSample>) -> Vec<RawSample> {
        let mut out = Vec::with_capacity(samples.len());
        let mut shown: HashMap<Group, Vec<Shown>> = HashMap::new();
        let mut seen = std::collections::HashSet::new();
        for s in samples {
            let g = group_of(&s);
            seen.insert(g);
            if !stackless(&s) {
                shown.entry(g).or_default().push(Shown {
                    user: s.user.clone(),
                    kernel: s.kernel.clone(),
                    blocked: s.values[0].saturating_sub(s.values[1]),
                    waiting: s.values[1],
                });
                out.push(s);
                continue;
            }
            match self.last.get(&g) {
                Some(stacks) => out.extend(carried(s, stacks)),
                None => out.push(s),
            }
        }
        self.last.retain(|g, _| seen.contains(g));
        self.last.extend(shown);
        out
    }
}

/// The stackless sample `s` spread over `stacks` by their blocked and waiting times, as
/// samples of its group; what has no weight to go to (blocked time where the stacks had none
/// blocked) stays stackless.
fn carried(s: RawSample, stacks: &[Shown]) -> Vec<RawSample> {
    let g = group_of(&s);
    let split = |value: u64, weight: fn(&Shown) -> u64| {
        let mut entries = vec![Entry {
            group: g,
            sampled: false,
            value,
            weight: 0,
        }];
        entries.extend(stacks.iter().map(|st| Entry {
            group: g,
            sampled: true,
            value: 0,
            weight: weight(st),
        }));
        // Ties go to the lesser index: the stacks' order is the window's, fixed at its drain.
        spread(&entries, |i| i)
    };
    let blocked = split(s.values[0].saturating_sub(s.values[1]), |st| st.blocked);
    let waiting = split(s.values[1], |st| st.waiting);
    let mut out = Vec::new();
    let own = [blocked[0], waiting[0]];
    if own[0] + own[1] > 0 {
        out.push(RawSample {
            values: vec![own[0] + own[1], own[1]],
            ..s.clone()
        });
    }
    for (i, st) in stacks.iter().enumerate() {
        let (b, w) = (blocked[i + 1], waiting[i + 1]);
        if b + w > 0 {
            out.push(RawSample {
                user: st.user.clone(),
                kernel: st.kernel.clone(),
                values: vec![b + w, w],
                ..s.clone()
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use phaseprof_model::SampleKind;

    fn sample(tid: u32, user: Option<u64>, ns: u64, wait: u64) -> RawSample {
        RawSample {
            user: user.map(|a| vec![a]),
            values: vec![ns, wait],
            ..RawSample::new(SampleKind::Offcpu, (1, tid), (0, 1))
        }
    }

    // Checks the carry: a window with thread 2's stacks A (300 ns blocked) and B (100 ns
    // blocked, 100 waiting); the next has only 400 ns without a stack for it (200 waiting):
    // blocked 3:1 over A and B, waiting all to B; thread 3, never sampled, stays stackless;
    // a window without thread 2 forgets it.
    #[test]
    fn a_window_without_samples_takes_the_last_ones_stacks() {
        let mut c = OffcpuCarry::default();
        let first = vec![sample(2, Some(0xa), 300, 0), sample(2, Some(0xb), 200, 100)];
        assert_eq!(c.apply(first.clone()), first);
        let next = c.apply(vec![sample(2, None, 400, 200), sample(3, None, 50, 0)]);
        assert_eq!(
            next,
            vec![
                sample(2, Some(0xa), 150, 0),
                sample(2, Some(0xb), 250, 200),
                sample(3, None, 50, 0),
            ]
        );
        // Totals kept.
        let sum = |v: &[RawSample]| v.iter().map(|s| s.values[0]).sum::<u64>();
        assert_eq!(sum(&next), 450);
        // A window that carried keeps the last sampled window's stacks for the next; one that
        // saw nothing of thread 2 forgets them.
        c.apply(vec![sample(3, None, 10, 0)]);
        assert_eq!(
            c.apply(vec![sample(2, None, 40, 0)]),
            vec![sample(2, None, 40, 0)]
        );
    }
}
