//! What one probe hit costs a target, in ns of its CPU time. Phase probes: measured before they
//! go on (`PhaseHitCosts`). Allocation probes: measured while recording, from the cpu samples
//! taken inside the uprobes (the `[phaseprof probes]` tower's uprobes leaf), the targets' CPU
//! time and the hits the kernel counted meanwhile. The constants are what a hit is assumed to
//! cost before (or without) a measurement: measured with `bench` on the 2-core development VM
//! (README "Performance"), where they moved 2-3-fold from one week to the next. x86 uprobes
//! emulate a probed `push` (the usual entry site) but single-step most other instructions, a
//! `ret` included, so every exact Go exit costs a single-step.
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
/// What one phase probe hit costs the targets, by kind, in ns: measured on this machine before
/// the phase probes go on (`Engine::calibrate_phase_hits`: the uprobe machinery's cost, to which
/// the programs' work for targets, timed by themselves, is added), else the constants above
/// (work included).
#[derive(Clone, Copy, Debug)]
pub struct PhaseHitCosts {
    /// A native phase call: entry and uretprobe.
    pub native_call_ns: f64,
    /// A Go phase call: entry and a probe on its return instruction.
    pub go_call_ns: f64,
    /// Added when an entry is probed on an instruction the kernel single-steps.
    pub single_step_ns: f64,
    /// A Go scheduler switch point's hit.
    pub switch_hit_ns: f64,
    /// What the calibration measured (None: the constants).
    pub mechanism: Option<MechanismCosts>,
}

/// The kernel's uprobe machinery with the phase programs returning at once (a thread that is no
/// target's), per call of a probed function, in ns; and how long measuring it took.
#[derive(Clone, Copy, Debug)]
pub struct MechanismCosts {
    /// An entry probe on an emulated `push`.
    pub entry_ns: f64,
    /// An entry probe and a uretprobe.
    pub native_call_ns: f64,
    /// A Go entry probe and a probe on the `ret`.
    pub go_call_ns: f64,
    /// An entry probe on a single-stepped instruction.
    pub single_step_entry_ns: f64,
    pub took: std::time::Duration,
}

impl PhaseHitCosts {
    pub const ASSUMED: PhaseHitCosts = PhaseHitCosts {
        native_call_ns: NATIVE_PHASE_CALL_NS,
        go_call_ns: GO_PHASE_CALL_NS,
        single_step_ns: SINGLE_STEP_NS,
        switch_hit_ns: GO_SWITCH_HIT_NS,
        mechanism: None,
    };

    /// The costs measured by the calibration.
    pub fn measured(m: MechanismCosts) -> Self {
        PhaseHitCosts {
            native_call_ns: m.native_call_ns,
            go_call_ns: m.go_call_ns,
            single_step_ns: (m.single_step_entry_ns - m.entry_ns).max(0.0),
            switch_hit_ns: m.entry_ns,
            mechanism: Some(m),
        }
    }

    /// One line for the recording's start.
    pub fn describe(&self) -> String {
        match &self.mechanism {
            Some(m) => format!(
                "phase probes' machinery measured on this machine ({} ms): native call {:.0} ns, \
                 Go call {:.0} ns, single-stepped entry +{:.0} ns, entry alone {:.0} ns (the \
                 programs' work for targets is timed by themselves)",
                m.took.as_millis(),
                self.native_call_ns,
                self.go_call_ns,
                self.single_step_ns,
                m.entry_ns
            ),
            None => "the phase probes' cost per hit of the last `bench` on the development VM \
                     is assumed"
                .to_string(),
        }
    }
}

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

    // Checks what the calibration's measurements stand for: a single-stepped entry costs what
    // it measured beyond an emulated one (never less than nothing), a scheduler switch point
    // what an emulated entry does; without a measurement, the constants.
    #[test]
    fn measured_costs_follow_the_calibration() {
        let m = MechanismCosts {
            entry_ns: 1_000.0,
            native_call_ns: 2_000.0,
            go_call_ns: 6_000.0,
            single_step_entry_ns: 4_500.0,
            took: std::time::Duration::from_millis(90),
        };
        let c = PhaseHitCosts::measured(m);
        assert_eq!(
            (
                c.native_call_ns,
                c.go_call_ns,
                c.single_step_ns,
                c.switch_hit_ns
            ),
            (2_000.0, 6_000.0, 3_500.0, 1_000.0)
        );
        assert!(c.describe().contains("measured on this machine (90 ms)"));
        let noisy = PhaseHitCosts::measured(MechanismCosts {
            single_step_entry_ns: 900.0,
            ..m
        });
        assert_eq!(noisy.single_step_ns, 0.0);
        assert_eq!(PhaseHitCosts::ASSUMED.go_call_ns, GO_PHASE_CALL_NS);
        assert!(PhaseHitCosts::ASSUMED.describe().contains("assumed"));
    }
}
