//! The phase probes under a budget (`--phase-budget 1%`): attached for slices (`SliceBudget`),
//! their cost per slice estimated from the calls counted (see `probe_overhead`). A window's
//! named phase totals are extrapolated from its slices, or carried from the last window that
//! had some.
use anyhow::Result;
use phaseprof_model::{BudgetInfo, PhaseStats};

use super::probe_overhead::PhaseProbeOverhead;
use crate::engine::Engine;
use crate::slice_align::Aligned;
use crate::slice_budget::{SliceBudget, SlicedProbes};

/// The phase probes, as a budget slices them.
pub struct PhaseProbes<'a>(pub &'a PhaseProbeOverhead);

impl SlicedProbes for PhaseProbes<'_> {
    fn by_read_bytes(&self) -> bool {
        true
    }

    fn what(&self) -> &'static str {
        "phase"
    }
    fn start_slice(&self, engine: &mut Engine<'_>) -> Result<()> {
        engine.start_phase_slice()
    }
    fn count(&self, engine: &mut Engine<'_>, on: bool) {
        engine.count_phases(on)
    }
    fn end_slice(&self, engine: &mut Engine<'_>) {
        engine.end_phase_slice()
    }
    /// Where the syscall programs are in force (exact, or held through the slice by their
    /// budget), the syscalls they saw enter while phases counted.
    fn io_syscalls_counted(&self, engine: &Engine<'_>) -> Result<Option<u64>> {
        engine.io_syscalls_in_phase_slices()
    }
    fn probe_ns(&self, engine: &Engine<'_>) -> Result<f64> {
        self.0.probe_ns(engine)
    }
    fn counted(&self, engine: &Engine<'_>) -> Result<u64> {
        self.0.calls(engine)
    }
    fn voided(&self, engine: &Engine<'_>) -> Result<u64> {
        engine.phase_calls_voided()
    }
    fn aligned(&self, engine: &Engine<'_>) -> Result<Aligned> {
        Aligned::read(engine)
    }
}

pub struct PhaseBudget {
    pub slices: SliceBudget,
    /// The last window that counted: its named phases' totals as counted, and what counted
    /// them (a window no slice falls in carries its rates: `carry`).
    last_counted: Option<(Vec<PhaseStats>, BudgetInfo)>,
}

impl PhaseBudget {
    pub fn new(budget: f64) -> Self {
        PhaseBudget {
            slices: SliceBudget::new(budget),
            last_counted: None,
        }
    }

    /// A window's named phase totals (`stats`, as the kernel counted them in its slices) as
    /// estimates for the whole window (`info`, from `window_info`): extrapolated from its
    /// slices, or the last slices' rates where none fell in it.
    pub fn estimate_window(&mut self, stats: &mut Vec<PhaseStats>, info: &BudgetInfo) {
        use phaseprof_model::phase_budget::{carry, extrapolate};
        match &self.last_counted {
            Some((last, last_info)) if info.carried_windows > 0 => {
                *stats = carry(last, last_info, info);
            }
            _ if info.counted() => {
                self.last_counted = Some((stats.clone(), info.clone()));
                extrapolate(stats, info);
            }
            _ => extrapolate(stats, info),
        }
    }
}
