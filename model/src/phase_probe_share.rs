//! How much of each phase's time is phaseprof's own probes. A phase's times run from its entry
//! probe to its exit probe, so they hold part of those probes' work (the trap's return after the
//! entry program, the exit trap before its program) and all of the probes that fire inside (its
//! nested phases', the allocator's, the syscalls'). For a Go function of 1 µs whose `ret` the
//! kernel single-steps, that is most of what the phase measures. The cpu samples say how much:
//! those taken while a thread was inside the phase (its bit in the sample's phase mask), and of
//! them those under the probes' tower. Their ratio, with its binomial standard error, is the
//! probes' share of the phase's CPU time; the rest is the phase's own.
use crate::{Profile, SampleKind};

/// A phase's cpu samples below this many say too little to measure the probes' share by.
pub const MIN_PHASE_SAMPLES: u64 = 20;

/// A phase's cpu samples, and of them those taken inside phaseprof's probes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseProbeShare {
    pub in_probes: u64,
    pub all: u64,
}

impl PhaseProbeShare {
    /// The probes' share of the phase's CPU time and its standard error; None with fewer than
    /// MIN_PHASE_SAMPLES samples.
    pub fn share(&self) -> Option<(f64, f64)> {
        if self.all < MIN_PHASE_SAMPLES {
            return None;
        }
        let p = self.in_probes as f64 / self.all as f64;
        Some((p, (p * (1.0 - p) / self.all as f64).sqrt()))
    }

    /// `cpu_ns` of the phase's CPU time, and `wall_ns` of its wall time, without the probes'
    /// (their time inside a phase is on-CPU time); None when the share is not measured.
    pub fn without(&self, cpu_ns: u64, wall_ns: u64) -> Option<(u64, u64)> {
        let (p, _) = self.share()?;
        let probes = (cpu_ns as f64 * p) as u64;
        Some((cpu_ns - probes, wall_ns.saturating_sub(probes)))
    }

    /// In words, for the phase table: "12.3% ± 1.8 (41 of 333 samples)"; with none in the
    /// probes, the bound the samples set (95%: three in `all`); None unmeasured.
    pub fn describe(&self) -> Option<String> {
        let (p, err) = self.share()?;
        if self.in_probes == 0 {
            let bound = 300.0 / self.all as f64;
            return Some(format!("under {bound:.1}% (0 of {} samples)", self.all));
        }
        Some(format!(
            "{:.1}% ± {:.1} ({} of {} samples)",
            100.0 * p,
            100.0 * err,
            self.in_probes,
            self.all
        ))
    }
}

impl Profile {
    /// Each phase's probe share, by phase id (`phase_stats`' order): the samples whose phase
    /// mask holds the phase (nested phases included, as the phase's times are); for `(none)`,
    /// those outside every phase.
    pub fn phase_probe_shares(&self) -> Vec<PhaseProbeShare> {
        let mut out = vec![PhaseProbeShare::default(); self.phase_stats.len()];
        for s in self.samples_of(SampleKind::Cpu) {
            let n = s.value(0);
            let in_probes = self.own_cost_leaf(s).is_some();
            for (i, share) in out.iter_mut().enumerate() {
                let inside = match i {
                    0 => s.phase == 0,
                    _ => i < 64 && s.phase_mask & (1 << i) != 0,
                };
                if inside {
                    share.all += n;
                    if in_probes {
                        share.in_probes += n;
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe_cost::{OWN_COST_FRAME, UPROBE_PROBES_FRAME};

    // Checks the share and what is left: 41 of 333 samples are 12.3% ± 1.8; a phase of 10 ms of
    // CPU and 15 ms of wall time keeps 8.77 ms and 13.77 ms without the probes; under 20
    // samples nothing is said; none of 90 in the probes bounds the share by 3.3%.
    #[test]
    fn the_probes_share_comes_out_of_the_phases_times() {
        let s = PhaseProbeShare {
            in_probes: 41,
            all: 333,
        };
        let (p, err) = s.share().unwrap();
        assert!((p - 0.123_123).abs() < 1e-5 && (err - 0.018_004).abs() < 1e-5);
        assert_eq!(s.describe().unwrap(), "12.3% ± 1.8 (41 of 333 samples)");
        assert_eq!(
            s.without(10_000_000, 15_000_000),
            Some((8_768_769, 13_768_769))
        );
        let none = PhaseProbeShare {
            in_probes: 0,
            all: 90,
        };
        assert_eq!(none.describe().unwrap(), "under 3.3% (0 of 90 samples)");
        let few = PhaseProbeShare {
            in_probes: 19,
            all: 19,
        };
        assert_eq!((few.share(), few.describe()), (None, None));
    }

    // Checks which samples count for which phase: a sample in `inner` (nested in `outer`) counts
    // for both; one under the probes' tower counts as in the probes for every phase it was in;
    // `(none)` takes the samples outside every phase.
    #[test]
    fn samples_count_for_every_phase_they_were_in() {
        use crate::{Frame, FrameKind, Profile, Sample, Stack};
        let frame = |f: &str| Frame {
            function: f.into(),
            module: String::new(),
            kind: FrameKind::Synthetic,
            inlined: false,
        };
        let frames = ["work", OWN_COST_FRAME, UPROBE_PROBES_FRAME]
            .map(frame)
            .to_vec();
        let stacks = vec![
            Stack { frames: vec![0] },
            // Leaf first: the mechanism, then the tower's root.
            Stack { frames: vec![2, 1] },
        ];
        let cpu = |stack: u32, phase: u32, phase_mask: u64, n: u64| Sample {
            kind: SampleKind::Cpu,
            pid: 1,
            tid: 1,
            phase,
            phase_mask,
            stack: Some(stack),
            nr: 0,
            values: vec![n],
        };
        let p = Profile {
            phases: vec!["(none)".into(), "outer".into(), "inner".into()],
            phase_stats: vec![Default::default(); 3],
            frames,
            stacks,
            samples: vec![
                cpu(0, 1, 0b010, 30),
                cpu(1, 1, 0b010, 10),
                cpu(0, 2, 0b110, 15),
                cpu(1, 2, 0b110, 5),
                cpu(0, 0, 0b001, 7),
            ],
            ..Profile::default()
        };
        let shares = p.phase_probe_shares();
        let got: Vec<(u64, u64)> = shares.iter().map(|s| (s.in_probes, s.all)).collect();
        assert_eq!(got, [(0, 7), (15, 60), (5, 20)]);
    }
}
