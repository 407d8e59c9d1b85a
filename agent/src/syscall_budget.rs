//! Syscalls counted under a budget (`--syscall-budget 1%`): raw_tp sys_enter/sys_exit attached
//! for slices (`SliceBudget`) as much of the time as the budget allows. Counting a syscall costs
//! a target ~400 ns here (the kernel's slow path with any program on the syscall tracepoints
//! alone is ~150), several percent of a server that makes a few syscalls per request: no
//! trimming of the programs reaches 5%, slicing does. A window's syscalls are extrapolated from
//! its slices, or carried from the last window that had some.
use anyhow::Result;
use phaseprof_model::syscall_budget::{add_syscall_samples, scale, window_scale};
use phaseprof_model::{BudgetInfo, Meta, PhaseStats, Profile};

use crate::engine::Engine;
use crate::probe_costs::SYSCALL_NS;
use crate::slice_budget::{SliceBudget, SlicedProbes};

/// The syscall budget of `attach` and the agent unless told otherwise: counting every syscall
/// costs a server that makes a few per request 10-30% of its CPU (README, Performance).
pub const DEFAULT_SYSCALL_BUDGET: f64 = 0.01;

/// The syscall programs, as a budget slices them.
pub struct SyscallProbes;

impl SlicedProbes for SyscallProbes {
    fn what(&self) -> &'static str {
        "syscall"
    }
    fn start_slice(&self, engine: &mut Engine<'_>) -> Result<()> {
        engine.start_syscall_slice()
    }
    fn count(&self, engine: &mut Engine<'_>, on: bool) {
        engine.count_syscalls(on)
    }
    fn end_slice(&self, engine: &mut Engine<'_>) {
        engine.end_syscall_slice()
    }
    fn io_syscalls_counted(&self, engine: &Engine<'_>) -> Result<Option<u64>> {
        engine.io_syscalls_counted().map(Some)
    }
    /// Before the slowdown is measured (by syscalls in and out of slices), the budget goes by
    /// the cost of a syscall counted on the development machine.
    fn probe_ns(&self, engine: &Engine<'_>) -> Result<f64> {
        Ok(engine.syscalls_counted()? as f64 * SYSCALL_NS)
    }
    fn counted(&self, engine: &Engine<'_>) -> Result<u64> {
        engine.syscalls_counted()
    }
    fn voided(&self, engine: &Engine<'_>) -> Result<u64> {
        engine.syscalls_voided()
    }
}

/// The phase totals whose syscalls the syscall budget extrapolates: all of them where the phases
/// were counted throughout (exact, or their probes cheap enough to stay), none where the phase
/// budget estimated them: the syscall programs were held in force through every phase slice
/// (see `Session::tick`), and the phase budget's extrapolation took their syscalls with the
/// rest.
fn phase_syscalls<'a>(meta: &Meta, stats: &'a mut [PhaseStats]) -> &'a mut [PhaseStats] {
    match &meta.phase_budget {
        Some(b) if !b.attached_throughout => &mut [],
        _ => stats,
    }
}

/// The last window that counted: its syscall samples as counted (with their frames and stacks),
/// each phase's syscalls and their time, and what counted them.
struct Counted {
    samples: Profile,
    phases: Vec<(u64, u64)>,
    info: BudgetInfo,
}

pub struct SyscallBudget {
    pub slices: SliceBudget,
    last_counted: Option<Counted>,
}

impl SyscallBudget {
    pub fn new(budget: f64) -> Self {
        SyscallBudget {
            slices: SliceBudget::new(budget),
            last_counted: None,
        }
    }

    /// `p`'s syscalls, as counted in slices, as estimates for all of it (`info`, from
    /// `window_info` for a window of a session cut in `windows`, else `finish`).
    pub fn estimate(&mut self, p: &mut Profile, info: &BudgetInfo, windows: bool) {
        if windows {
            return self.estimate_window(p, info);
        }
        scale(
            &mut p.samples,
            phase_syscalls(&p.meta, &mut p.phase_stats),
            info.scale(),
        );
        p.meta.syscall_budget = Some(info.clone());
    }

    /// A window's syscalls (`p`'s syscall samples and phase totals, as counted in its slices) as
    /// estimates for the whole window (`info`, from `window_info`): extrapolated from its
    /// slices, or the last slices' at this window's rate where none fell in it.
    pub fn estimate_window(&mut self, p: &mut Profile, info: &BudgetInfo) {
        match &self.last_counted {
            Some(last) if info.carried_windows > 0 => {
                let by = window_scale(info, Some(&last.info));
                add_syscall_samples(&last.samples, p, by);
                let up = |v: u64| (v as f64 * by).round() as u64;
                for (st, &(n, ns)) in phase_syscalls(&p.meta, &mut p.phase_stats)
                    .iter_mut()
                    .zip(&last.phases)
                {
                    (st.syscalls, st.syscall_ns) = (up(n), up(ns));
                }
            }
            _ => {
                if info.counted() {
                    let mut samples = Profile::default();
                    add_syscall_samples(p, &mut samples, 1.0);
                    self.last_counted = Some(Counted {
                        samples,
                        phases: (p.phase_stats.iter())
                            .map(|st| (st.syscalls, st.syscall_ns))
                            .collect(),
                        info: info.clone(),
                    });
                }
                let by = window_scale(info, None);
                let phases = phase_syscalls(&p.meta, &mut p.phase_stats);
                scale(&mut p.samples, phases, by);
            }
        }
        p.meta.syscall_budget = Some(info.clone());
    }
}
