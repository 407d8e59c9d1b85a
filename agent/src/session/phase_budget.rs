//! The phase probes under a budget, driven by the session: slices started and ended between
//! turns, and each window's named phase totals extrapolated from what its slices counted.
use anyhow::Result;
use phaseprof_model::{BudgetInfo, Profile};

use super::Session;
use crate::phases::budget::{PhaseBudget, PhaseProbes};

impl Session<'_> {
    /// From now on the phase probes are duty-cycled to cost at most `budget` (0.01 = 1%) of the
    /// targets' CPU time. Call before any phase probe is attached (see `Engine::slice_phases`).
    pub fn budget_phases(&mut self, budget: f64) {
        self.phase_budget = Some(PhaseBudget::new(budget));
    }

    /// Between turns: a slice ended or started when due.
    pub(super) fn phase_budget_tick(&mut self) -> Result<()> {
        if let Some(b) = &mut self.phase_budget {
            let pids: Vec<u32> = self.live.iter().copied().collect();
            (b.slices).tick(&mut self.engine, &PhaseProbes(&self.phase_cost), &pids)?;
        }
        Ok(())
    }

    /// What the phase slices counted in the window that ends (taken as the kernel's window
    /// flips: see `take_window`).
    pub(super) fn phase_window_info(&mut self) -> Result<Option<BudgetInfo>> {
        let Some(b) = &mut self.phase_budget else {
            return Ok(None);
        };
        let pids: Vec<u32> = self.live.iter().copied().collect();
        let probes = PhaseProbes(&self.phase_cost);
        Ok(Some((b.slices).window_info(
            &self.engine,
            &probes,
            &pids,
        )?))
    }

    /// A window of a budgeted session: its named phases' totals extrapolated to the whole
    /// window by `info` (`phase_window_info`), and how they were counted.
    pub(super) fn extrapolate_window_phases(&mut self, p: &mut Profile, info: Option<BudgetInfo>) {
        if let (Some(b), Some(info)) = (&mut self.phase_budget, info) {
            b.estimate_window(&mut p.phase_stats, &info);
            p.meta.phase_budget = Some(info);
        }
    }
}
