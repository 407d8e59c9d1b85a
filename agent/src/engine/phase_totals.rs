//! The kernel's exact per-phase totals, window by window. The kernel keeps two halves of
//! `phase_stats`, one per window parity, as the counter maps' keys carry the parity: each
//! window's drain takes the half that ended (and zeroes it), so a window's phase table holds the
//! same events as its samples, and a maximum is that window's own.
use anyhow::Result;
use libbpf_rs::{MapCore, MapFlags};
use phaseprof_bpf::{limits, types};
use phaseprof_model::PhaseStats;

use super::{pod, MAX_SYSCALL_COSTS, WALL_BUCKETS};

/// Phase ids per half of the kernel's map.
const HALF: u32 = limits::MAX_PHASES as u32;

/// Per-phase totals (index: phase id) as the kernel's struct holds them.
type Raw = Vec<types::phase_stats>;

/// What the drains took from the kernel's halves: the whole session so far, and the last window.
#[derive(Default)]
pub(super) struct PhaseTotals {
    drained: Raw,
    last_window: Raw,
}

impl PhaseTotals {
    /// Takes half `parity` of `map` (both halves when `None`: after detach), whose writers are
    /// done with it: its totals become the last window's and add to the session's, and its
    /// entries are zeroed for the window that will write them next.
    pub(super) fn take(&mut self, map: &dyn MapCore, parity: Option<u32>) -> Result<()> {
        let halves: &[u32] = match parity {
            Some(p) => &[p & 1][..],
            None => &[0, 1][..],
        };
        let mut window = vec![types::phase_stats::default(); HALF as usize];
        for &half in halves {
            for (id, total) in window.iter_mut().enumerate() {
                let key = id as u32 + half * HALF;
                let per_cpu = map.lookup_percpu(&key.to_ne_bytes(), MapFlags::ANY)?;
                let Some(per_cpu) = per_cpu else { continue };
                let mut touched = false;
                for bytes in &per_cpu {
                    touched |= bytes.iter().any(|&b| b != 0);
                    add(total, &pod(bytes));
                }
                if touched {
                    let zeros: Vec<Vec<u8>> = per_cpu.iter().map(|b| vec![0; b.len()]).collect();
                    map.update_percpu(&key.to_ne_bytes(), &zeros, MapFlags::ANY)?;
                }
            }
        }
        if self.drained.is_empty() {
            self.drained = vec![types::phase_stats::default(); HALF as usize];
        }
        for (into, st) in self.drained.iter_mut().zip(&window) {
            add(into, st);
        }
        self.last_window = window;
        Ok(())
    }

    /// The last window's totals, by phase id (0 = `(none)`), for `phases` ids.
    pub(super) fn last_window(&self, phases: usize, cost_names: &[String]) -> Vec<PhaseStats> {
        to_model(&self.last_window, phases, cost_names)
    }

    /// The session's totals: what the drains took plus what both halves of `map` hold now.
    pub(super) fn so_far(
        &self,
        map: &dyn MapCore,
        phases: usize,
        cost_names: &[String],
    ) -> Result<Vec<PhaseStats>> {
        let mut all = self.drained.clone();
        all.resize(phases.max(all.len()), types::phase_stats::default());
        for (id, total) in all.iter_mut().enumerate().take(phases) {
            for half in [0, 1] {
                let key = id as u32 + half * HALF;
                for bytes in map
                    .lookup_percpu(&key.to_ne_bytes(), MapFlags::ANY)?
                    .unwrap_or_default()
                {
                    add(total, &pod(&bytes));
                }
            }
        }
        Ok(to_model(&all, phases, cost_names))
    }
}

/// Adds `st` into `into`; a maximum stays a maximum.
fn add(into: &mut types::phase_stats, st: &types::phase_stats) {
    into.calls += st.calls;
    into.wall_ns += st.wall_ns;
    into.wall_max_ns = into.wall_max_ns.max(st.wall_max_ns);
    into.cpu_ns += st.cpu_ns;
    into.offcpu_ns += st.offcpu_ns;
    into.cpuwait_ns += st.cpuwait_ns;
    into.gowait_ns += st.gowait_ns;
    into.syscalls += st.syscalls;
    into.syscall_ns += st.syscall_ns;
    into.alloc_bytes += st.alloc_bytes;
    into.allocs += st.allocs;
    into.frees += st.frees;
    into.page_faults += st.page_faults;
    for (t, c) in into.costs.iter_mut().zip(st.costs) {
        *t += c;
    }
    for (h, c) in into.wall_hist.iter_mut().zip(st.wall_hist) {
        *h += c;
    }
}

/// The model's per-phase totals for ids `0..phases`; syscall cost rule i under `cost_names[i]`.
fn to_model(raw: &[types::phase_stats], phases: usize, cost_names: &[String]) -> Vec<PhaseStats> {
    let zero = types::phase_stats::default();
    (0..phases)
        .map(|id| {
            let st = raw.get(id).unwrap_or(&zero);
            let costs: [u64; MAX_SYSCALL_COSTS] = st.costs;
            let hist: [u64; WALL_BUCKETS] = st.wall_hist;
            PhaseStats {
                calls: st.calls,
                wall_ns: st.wall_ns,
                wall_max_ns: st.wall_max_ns,
                cpu_ns: st.cpu_ns,
                offcpu_ns: st.offcpu_ns,
                cpu_wait_ns: st.cpuwait_ns,
                gowait_ns: st.gowait_ns,
                syscalls: st.syscalls,
                syscall_ns: st.syscall_ns,
                alloc_bytes: st.alloc_bytes,
                allocs: st.allocs,
                frees: st.frees,
                page_faults: st.page_faults,
                wall_hist: (hist.into_iter().enumerate())
                    .filter(|(_, c)| *c > 0)
                    .map(|(i, c)| (i as u32, c))
                    .collect(),
                costs: cost_names.iter().cloned().zip(costs).collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks that totals add field by field while a maximum stays the larger one.
    #[test]
    fn totals_add_and_maxima_stay_maxima() {
        let mut a = types::phase_stats {
            calls: 2,
            wall_max_ns: 50,
            ..Default::default()
        };
        let b = types::phase_stats {
            calls: 3,
            wall_max_ns: 20,
            ..Default::default()
        };
        add(&mut a, &b);
        assert_eq!((a.calls, a.wall_max_ns), (5, 50));
        let m = to_model(&[a], 2, &[]);
        assert_eq!((m[0].calls, m[1].calls, m[0].wall_max_ns), (5, 0, 50));
    }
}
