//! What one probe hit costs a target, in ns of its CPU time: measured while recording, from the
//! cpu samples taken inside the uprobes (the `[phaseprof probes]` tower's uprobes leaf), the
//! targets' CPU time and the hits the kernel counted meanwhile. The constants are what a hit
//! is assumed to cost before that measurement has enough samples, or without cpu samples
//! (`--events alloc` alone): measured with `bench` on the 2-core development VM (README
//! "Performance"). x86 uprobes emulate a probed `push` (the usual entry site) but single-step
//! most other instructions, a `ret` included, so every exact Go exit costs a single-step.
use phaseprof_model::probe_cost::{OwnSamples, MIN_OWN_SAMPLES};

/// A native phase call: entry probe on an emulated instruction, exit through a uretprobe, with
/// the default events (2,612 ns measured; 2,273 with cpu samples only).
pub const NATIVE_PHASE_CALL_NS: f64 = 2_600.0;
/// A Go phase call: entry probe after the stack check (`push rbp`, emulated), exit probe on a
/// `ret` (single-stepped): 17,619 ns measured.
pub const GO_PHASE_CALL_NS: f64 = 18_000.0;
/// Added when a function's entry had to be probed on an instruction the kernel single-steps
/// (a bare bpftrace uprobe on Go's first `cmp`: 16,179 ns; on free's `test`: 16,640 ns).
pub const SINGLE_STEP_NS: f64 = 16_000.0;
/// One hit of a Go scheduler switch point (`mcall` and `execute`, probed on `push rbp`): 1,522.
pub const GO_SWITCH_HIT_NS: f64 = 1_500.0;
/// One allocator probe hit (an entry, a return or a free) at the chosen instruction: 1,067.
pub const ALLOC_HIT_NS: f64 = 1_100.0;
/// A target's syscall counted with its latency, no stack (`--syscall-stacks none`): +381 ns.
pub const SYSCALL_NS: f64 = 381.0;

/// The uprobes' cost per hit, measured over a recording: the samples in them and in all, the
/// targets' CPU time and the uprobe hits, summed over the stretches between calls of `add`.
#[derive(Default)]
pub struct UprobeHitCost {
    uprobe_samples: u64,
    all_samples: u64,
    cpu_ns: u64,
    hits: u64,
    /// The counters at the last `add` (samples are the aggregator's, which a session cut in
    /// windows starts afresh: see `aggregator_restarted`).
    last: Option<(OwnSamples, u64, u64)>,
}

impl UprobeHitCost {
    /// Adds the stretch up to now: `own` samples folded so far, the targets' CPU time `cpu_ns`
    /// and the uprobe hits so far (both cumulative).
    pub fn add(&mut self, own: OwnSamples, cpu_ns: u64, hits: u64) {
        if let Some((o, c, h)) = self.last {
            self.uprobe_samples += own.uprobes.saturating_sub(o.uprobes);
            self.all_samples += own.all.saturating_sub(o.all);
            self.cpu_ns += cpu_ns.saturating_sub(c);
            self.hits += hits.saturating_sub(h);
        }
        self.last = Some((own, cpu_ns, hits));
    }

    /// The aggregator whose samples `add` is given starts afresh (a new window): its counts
    /// start from zero again.
    pub fn aggregator_restarted(&mut self) {
        if let Some((own, _, _)) = &mut self.last {
            *own = OwnSamples::default();
        }
    }

    /// ns of the targets' CPU per uprobe hit; None before MIN_OWN_SAMPLES samples in uprobes.
    pub fn ns_per_hit(&self) -> Option<f64> {
        if self.uprobe_samples < MIN_OWN_SAMPLES || self.all_samples == 0 || self.hits == 0 {
            return None;
        }
        let share = self.uprobe_samples as f64 / self.all_samples as f64;
        Some(share * self.cpu_ns as f64 / self.hits as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the measurement: 75 of 375 samples in uprobes over 3 s of the targets' CPU and
    // 600,000 hits are 1,000 ns a hit; a new window's aggregator counts from zero.
    #[test]
    fn cost_per_hit_is_the_uprobes_share_of_cpu_over_the_hits() {
        let own = |uprobes, all| OwnSamples {
            uprobes,
            all,
            ..OwnSamples::default()
        };
        let mut c = UprobeHitCost::default();
        c.add(own(0, 0), 1_000_000_000, 100);
        assert_eq!(c.ns_per_hit(), None);
        c.add(own(30, 150), 2_500_000_000, 300_100);
        assert_eq!(c.ns_per_hit(), Some(1_000.0));
        // A new window: the aggregator's counts start again, here higher than the last.
        c.aggregator_restarted();
        c.add(own(45, 225), 4_000_000_000, 600_100);
        assert_eq!(c.ns_per_hit(), Some(1_000.0));
    }
}
