//! The end of a session: every probe detached, what is left drained, budgets' totals
//! extrapolated, and the profile of the whole recording.
use std::time::SystemTime;

use anyhow::Result;
use phaseprof_model::Profile;

use super::{unix_ns, Session};
use crate::engine::Drain;
use crate::phases::budget::PhaseProbes;
use crate::symbolize::Naming;

impl Session<'_> {
    /// Detaches every probe, drains what is left and returns the profile of `start..end`.
    pub fn finish(mut self, start: SystemTime, end: SystemTime) -> Result<Profile> {
        let pids: Vec<u32> = self.live.iter().copied().collect();
        if let Some(estimate) = self.phase_cost.tick(&self.engine, &pids, true)? {
            eprintln!("{estimate} (whole recording)");
            self.meta_mut().phase_probes = Some(estimate.cost);
        }
        let alloc = match &mut self.alloc {
            Some(a) => {
                let total = end.duration_since(start).unwrap_or_default();
                Some(a.finish(&self.engine, total)?)
            }
            None => None,
        };
        // A session cut in windows ends with its last window's phase totals, and their budget.
        let phase_budget = match &mut self.phase_budget {
            Some(b) if self.took_windows => {
                let probes = PhaseProbes(&self.phase_cost);
                Some((b.slices).window_info(&self.engine, &probes, &pids)?)
            }
            Some(b) => {
                let probes = PhaseProbes(&self.phase_cost);
                Some((b.slices).finish(&self.engine, &probes, &pids)?)
            }
            None => None,
        };
        let syscall_budget = self.syscall_budget_info()?;
        if let Some(ns) = self.targets_cpu_since_mark() {
            self.meta_mut().targets_cpu_ns = Some(ns);
        }
        let timed = self.engine.take_timed_ns()?;
        self.meta_mut().switch_probe_ns = timed.switch;
        self.meta_mut().sample_probe_ns = timed.sample;
        // Ages of live allocations are taken at the stop, not after the detach (which waits for
        // the kernel to retire the uprobes, up to a second).
        let stopped_ns = crate::engine::monotonic_ns();
        self.engine.detach();
        let w = self.drain(Drain::Final)?;
        self.fold(&w);
        let lost = self.engine.lost()?;
        let lost = self.lost_since_last_window(lost);
        // A session cut in windows ends with its last window's; `record`, with the whole.
        let mut phase_stats = if self.took_windows || self.phase_names.is_empty() {
            self.phase_stats_of_window()
        } else {
            (self.engine).phase_stats(self.phase_names.len() + 1, &self.cost_names)?
        };
        if let Some(info) = phase_budget {
            match &mut self.phase_budget {
                Some(b) if self.took_windows => b.estimate_window(&mut phase_stats, &info),
                _ => phaseprof_model::phase_budget::extrapolate(&mut phase_stats, &info),
            }
            self.meta_mut().phase_budget = Some(info);
        }
        if let Some((info, scale)) = alloc {
            if info.budget.is_none() {
                let live = self.engine.live_heap()?;
                let mut naming = Naming {
                    sym: &mut self.sym,
                    processes: &mut self.processes,
                    probe_resumes: &self.engine.probe_resumes,
                };
                self.agg.set_live(&live, stopped_ns, &mut naming);
            }
            for (&id, &(bytes, count)) in self.agg.go_phase_allocs() {
                if let Some(st) = phase_stats.get_mut(id as usize) {
                    st.alloc_bytes += bytes.round() as u64;
                    st.allocs += count.round() as u64;
                }
            }
            let b = self.agg.builder_mut();
            if scale != 1.0 {
                crate::alloc::costs::extrapolate(b.profile_mut(), &mut phase_stats, scale);
            }
            *b.phase_stats_mut() = phase_stats;
            crate::alloc::costs::compute(b, &self.alloc_costs);
            b.meta_mut().alloc = Some(info);
        } else {
            *self.agg.builder_mut().phase_stats_mut() = phase_stats;
        }
        let mut meta = std::mem::take(self.agg.builder_mut().meta_mut());
        self.unwind_since_last_window(&mut meta);
        *self.agg.builder_mut().meta_mut() = meta;
        let b = self.agg.builder_mut();
        *b.lost_mut() = lost;
        b.meta_mut().start_unix_ns = unix_ns(start);
        b.meta_mut().end_unix_ns = unix_ns(end);
        let (budget, windows) = (self.syscall_budget.take(), self.took_windows);
        let mut p = self.agg.finish();
        if let (Some(mut b), Some(info)) = (budget, syscall_budget) {
            b.estimate(&mut p, &info, windows);
        }
        Ok(p)
    }
}
