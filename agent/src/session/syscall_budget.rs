//! Syscalls under a budget, driven by the session: slices started and ended between turns, and
//! each window's (or the recording's) syscalls extrapolated from what its slices counted.
use anyhow::Result;
use phaseprof_model::{BudgetInfo, Profile};

use super::Session;
use crate::syscall_budget::{SyscallBudget, SyscallProbes};

impl Session<'_> {
    /// From now on syscalls are counted in slices that cost at most `budget` (0.01 = 1%) of the
    /// targets' CPU time. The engine must have been told first (`Engine::slice_syscalls`).
    pub fn budget_syscalls(&mut self, budget: f64) {
        self.syscall_budget = Some(SyscallBudget::new(budget));
    }

    /// Between turns: a slice ended or started when due.
    pub(super) fn syscall_budget_tick(&mut self) -> Result<()> {
        if let Some(b) = &mut self.syscall_budget {
            let pids: Vec<u32> = self.live.iter().copied().collect();
            (b.slices).tick(&mut self.engine, &SyscallProbes, &pids)?;
        }
        Ok(())
    }

    /// What the slices counted up to now: over the window that ends (a session cut in windows),
    /// or the whole recording.
    pub(super) fn syscall_budget_info(&mut self) -> Result<Option<BudgetInfo>> {
        let Some(b) = &mut self.syscall_budget else {
            return Ok(None);
        };
        let pids: Vec<u32> = self.live.iter().copied().collect();
        Ok(Some(if self.took_windows {
            (b.slices).window_info(&self.engine, &SyscallProbes, &pids)?
        } else {
            (b.slices).finish(&self.engine, &SyscallProbes, &pids)?
        }))
    }

    /// A window's syscalls, as counted in slices, extrapolated to all of it by `info`
    /// (`syscall_budget_info`, taken as the kernel's window flips: see `take_window`).
    pub(super) fn extrapolate_window_syscalls(
        &mut self,
        p: &mut Profile,
        info: Option<BudgetInfo>,
    ) {
        if let (Some(b), Some(info)) = (&mut self.syscall_budget, info) {
            b.estimate_window(p, &info);
        }
    }
}
