//! The allocation probes' cost per hit, measured while recording: after each window is folded,
//! the uprobes' share of the cpu samples so far, the targets' CPU time and the allocation probe
//! hits give the ns a hit costs, which the allocation estimates and budget then use instead of
//! the cost assumed before (`ALLOC_HIT_NS`).
use super::Session;

impl Session<'_> {
    /// Measures the allocation probes' cost per hit from what has been folded (see the module).
    /// Phase probes are uprobes too, at other costs per hit: with both, their shares of the
    /// samples cannot be told apart, and the assumed cost stays.
    pub(super) fn calibrate_alloc_cost(&mut self) {
        if self.alloc.is_none() || !self.phase_names.is_empty() {
            return;
        }
        let Ok(hits) = self.engine.alloc_probe_hits() else {
            return;
        };
        let cpu = self.calibration_cpu.read(self.live.iter().copied());
        self.uprobe_cost.add(self.agg.own_samples(), cpu, hits);
        if let (Some(ns), Some(alloc)) = (self.uprobe_cost.ns_per_hit(), &mut self.alloc) {
            alloc.calibrate(ns);
        }
    }
}
