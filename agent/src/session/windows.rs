//! A session cut in windows (the agent, `attach`): each window taken as a profile of its own,
//! the kernel's cumulative totals as their growth since the last one, and what is gone
//! forgotten so that a session that runs for weeks stays bounded.
use std::time::SystemTime;

use anyhow::Result;
use phaseprof_model::Profile;

use super::{unix_ns, Session};
use crate::aggregate::Aggregator;
use crate::engine::Drain;
use crate::targets;

/// How long a lookup of names waits for the naming thread in a session cut in windows: a small
/// file's names come well within it, a big file's first look (seconds) does not hold recording.
const NAMES_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

impl Session<'_> {
    /// A session cut in windows waits on no file and no debuginfod server: code is named by a
    /// thread of its own, a lookup waits for it at most `NAMES_WAIT`, and addresses whose names
    /// have not come are named `file+offset` in that window (counted in its `names_late`).
    pub fn name_in_background(&mut self) {
        self.sym.name_in_background(NAMES_WAIT);
    }

    /// The CPU time the targets used since their last mark (when added, or the last window),
    /// when every target is still there to be asked (an exited process's time is gone with
    /// it); each target's schedstat is read once, and becomes its new mark.
    pub(super) fn targets_cpu_since_mark(&mut self) -> Option<u64> {
        let mut total = Some(0u64);
        for (&pid, mark) in self.cpu_at_add.iter_mut() {
            let now = if targets::process_alive(pid) {
                crate::target_clocks::cpu_ns(std::iter::once(pid))
            } else if let Some(&ns) = self.cpu_at_exit.get(&pid) {
                ns
            } else {
                total = None;
                continue;
            };
            total = total.map(|t| t + now.saturating_sub(*mark));
            *mark = now;
        }
        total.filter(|_| !self.cpu_at_add.is_empty())
    }

    /// Drains the current window and returns it as a profile of its own (`attach` keeps a ring
    /// of them): its samples, and the kernel's cumulative phase totals and drops as the growth
    /// since the previous window.
    pub fn take_window(&mut self, start: SystemTime, end: SystemTime) -> Result<Profile> {
        // The budgets' marks (phases', syscalls', allocations') split their slices where the
        // kernel's window flips, at the drain's start: taken after the drain and the fold (symbolizing, which can take a second on a
        // loaded machine), a slice's syscalls fell in one window and its phase calls in the
        // next, whose totals were then extrapolated by the wrong coverage (the agent's phase
        // budget read 13.6x a phase's calls).
        self.took_windows = true;
        let phase_info = self.phase_window_info()?;
        let syscall_info = self.syscall_budget_info()?;
        let alloc_info = match &mut self.alloc {
            Some(alloc) => Some(alloc.window_info(&self.engine)?),
            None => None,
        };
        let w = self.drain(Drain::Window)?;
        self.fold(&w);
        let phases = self.agg.builder_mut().profile_mut().phases.clone();
        let mut meta = self.agg.builder_mut().meta_mut().clone();
        // Counted per window.
        meta.offcpu_own_stack_ns = 0;
        let done = std::mem::replace(&mut self.agg, Aggregator::new(meta, phases));
        self.uprobe_cost.aggregator_restarted();
        let mut p = done.finish();
        p.meta.start_unix_ns = unix_ns(start);
        p.meta.end_unix_ns = unix_ns(end);
        // The targets' CPU time in this window; the next one counts from here.
        p.meta.targets_cpu_ns = self.targets_cpu_since_mark();
        let timed = self.engine.take_timed_ns()?;
        p.meta.switch_probe_ns = timed.switch;
        p.meta.sample_probe_ns = timed.sample;
        self.unwind_since_last_window(&mut p.meta);
        p.meta.names_late = self.sym.take_late();
        p.phase_stats = self.phase_stats_of_window();
        p.lost = self.lost_since_last_window(self.engine.lost()?);
        self.extrapolate_window_phases(&mut p, phase_info);
        self.extrapolate_window_syscalls(&mut p, syscall_info);
        if let Some((info, scale)) = alloc_info {
            if scale != 1.0 {
                // Counted for part of the window (a budget): extrapolated to all of it.
                let mut stats = std::mem::take(&mut p.phase_stats);
                crate::alloc::costs::extrapolate(&mut p, &mut stats, scale);
                p.phase_stats = stats;
            }
            p.meta.alloc = Some(info);
        }
        self.forget_gone();
        Ok(p)
    }

    /// After a window: a session that runs for weeks (the agent) forgets the processes and
    /// threads that are gone, their samples named by now: their mappings, their names and pids
    /// in the next windows' metadata, their CPU marks (a window in which a target died has no
    /// CPU total; the next ones have again).
    fn forget_gone(&mut self) {
        let live = &self.live;
        self.sym.trim(|pid| live.contains(&pid));
        self.processes.retain(|pid| live.contains(&pid));
        self.cpu_at_add.retain(|pid, _| live.contains(pid));
        self.cpu_at_exit.clear(); // taken by this window's CPU total

        let exited = std::mem::take(&mut self.exited_tids);
        let meta = self.agg.builder_mut().meta_mut();
        meta.pids.retain(|pid| live.contains(pid));
        for tid in exited {
            self.seen_tids.remove(&tid);
            meta.threads.remove(&tid);
        }
    }

    /// The per-phase totals of the window the last drain took: the kernel keeps them per window,
    /// as it does the samples, so the two hold the same events.
    pub(super) fn phase_stats_of_window(&self) -> Vec<phaseprof_model::PhaseStats> {
        if self.phase_names.is_empty() {
            return vec![];
        }
        (self.engine).window_phase_stats(self.phase_names.len() + 1, &self.cost_names)
    }

    /// The drop counters as their growth since the last `take_window`.
    /// The same for the drop counters.
    pub(super) fn lost_since_last_window(
        &mut self,
        lost: phaseprof_model::Lost,
    ) -> phaseprof_model::Lost {
        let mut delta = lost.clone();
        delta.events = lost.events.saturating_sub(self.window_lost.events);
        delta.stacks = lost.stacks.saturating_sub(self.window_lost.stacks);
        for (k, v) in delta.by_reason.iter_mut() {
            *v = v.saturating_sub(self.window_lost.by_reason.get(k).copied().unwrap_or(0));
        }
        self.window_lost = lost;
        delta
    }
}
