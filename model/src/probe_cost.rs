//! phaseprof's own cost to its targets, measured: every cpu sample taken while a target's thread
//! ran one of phaseprof's probes (the program, the glue that runs it, a uprobe's trap, and the
//! user-mode instruction where an entry probe's trap resumes the thread, where a sample due
//! while the trap ran with interrupts off lands) is put under a tower of its own, `[phaseprof probes]`, split by mechanism at its leaf. The tower's
//! share of the samples is the probes' share of the targets' CPU time, with a binomial
//! standard error: a measurement on the running machine and target, not a cost per hit written
//! down elsewhere. What runs with interrupts off (the scheduler's programs) or in the sampling
//! interrupt itself shows in no sample of its own: those programs time themselves. (A sample
//! due while the scheduler's programs run fires as interrupts come back on, at
//! `finish_task_switch` in the thread switched in: that part of our cost is also drawn in the
//! target's kernel frames. Known, not yet taken out.)
use crate::{Profile, Sample, SampleKind};

/// The frame every cpu sample taken inside phaseprof's own probes is counted under: the
/// profiler's cost in the targets' threads, as a tower of its own, never inside their code.
pub const OWN_COST_FRAME: &str = "[phaseprof probes]";
/// The tower's leaf for the syscall probes (sys_enter, sys_exit and the kernel's slow path
/// that runs them).
pub const SYSCALL_PROBES_FRAME: &str = "[syscall probes]";
/// The tower's leaf for uprobes: phases and allocations, their programs and traps.
pub const UPROBE_PROBES_FRAME: &str = "[uprobes: phases, allocations]";
/// The tower's leaf for the rest (page faults, signals, process events).
pub const OTHER_PROBES_FRAME: &str = "[other probes]";

/// Cpu samples taken inside phaseprof's probes, by mechanism, and all cpu samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OwnSamples {
    pub syscalls: u64,
    pub uprobes: u64,
    pub other: u64,
    pub all: u64,
}

/// Cpu samples in the probes below this many say too little to measure their cost by.
pub const MIN_OWN_SAMPLES: u64 = 10;

impl OwnSamples {
    pub fn own(&self) -> u64 {
        self.syscalls + self.uprobes + self.other
    }

    /// The time in ns that `own` of these samples stand for, of `target_cpu_ns` of the
    /// targets' CPU time, and its binomial standard error: None without samples or CPU time.
    pub fn measured(&self, own: u64, target_cpu_ns: u64) -> Option<(f64, f64)> {
        if self.all == 0 || target_cpu_ns == 0 {
            return None;
        }
        let p = own as f64 / self.all as f64;
        let err = (p * (1.0 - p) / self.all as f64).sqrt();
        let cpu = target_cpu_ns as f64;
        Some((p * cpu, err * cpu))
    }
}

/// What phaseprof's probes cost the targets over a recording or window: the cpu samples taken in
/// them, the targets' CPU time, the time of the programs no sample sees, timed by themselves
/// (the scheduler's at switches to targets and their wakeups, `Meta::switch_probe_ns`, and the
/// cpu sampler's, `Meta::sample_probe_ns`), and under a syscall budget what its slices cost.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProbeCost {
    pub samples: OwnSamples,
    pub target_cpu_ns: u64,
    pub switch_ns: u64,
    pub sample_ns: u64,
    /// Under a syscall budget, the syscall slices' cost as the budget measured it (the slowdown
    /// while counted, from the CPU time per syscall in and out of slices, over the targets' CPU
    /// time in slices). It stands for the samples in the syscall probes, the few that fell in
    /// a slice, and the kernel's syscall path around them that no probe frame shows.
    pub syscall_slices_ns: Option<u64>,
}

impl ProbeCost {
    /// The probes' time in ns, and its standard error (the samples').
    pub fn ns(&self) -> (f64, f64) {
        let s = &self.samples;
        let sampled = match self.syscall_slices_ns {
            Some(_) => s.uprobes + s.other,
            None => s.own(),
        };
        let (ns, err) = (s.measured(sampled, self.target_cpu_ns)).unwrap_or((0.0, 0.0));
        let timed = self.switch_ns + self.sample_ns + self.syscall_slices_ns.unwrap_or(0);
        (ns + timed as f64, err)
    }

    /// The targets' CPU time with the probes over their time without, less one.
    pub fn slowdown(&self) -> f64 {
        let (ns, _) = self.ns();
        let rest = self.target_cpu_ns as f64 - ns;
        if rest <= 0.0 {
            return 0.0;
        }
        ns / rest
    }

    /// In words: the probes' time and share of the targets' CPU, by mechanism; None with fewer
    /// than MIN_OWN_SAMPLES samples in them and nothing timed.
    pub fn describe(&self) -> Option<String> {
        let s = &self.samples;
        let timed = self.switch_ns + self.sample_ns + self.syscall_slices_ns.unwrap_or(0);
        if s.own() < MIN_OWN_SAMPLES && timed == 0 {
            return None;
        }
        let (ns, err) = self.ns();
        let cpu = self.target_cpu_ns.max(1) as f64;
        let pct = |n: u64| 100.0 * n as f64 / s.all.max(1) as f64;
        let mut parts = Vec::new();
        let syscalls = if self.syscall_slices_ns.is_some() {
            0
        } else {
            s.syscalls
        };
        for (n, what) in [
            (syscalls, "syscall probes"),
            (s.uprobes, "uprobes"),
            (s.other, "others"),
        ] {
            if n > 0 {
                parts.push(format!("{what} {:.2}%", pct(n)));
            }
        }
        let mut out = format!(
            "{:.1} ± {:.1} ms, {:.2}% of the targets' CPU time, a slowdown of {:.1}% (measured: {} \
             of {} cpu samples in {OWN_COST_FRAME}",
            ns / 1e6,
            err / 1e6,
            100.0 * ns / cpu,
            100.0 * self.slowdown(),
            s.own(),
            s.all,
        );
        if !parts.is_empty() {
            out += &format!(": {}", parts.join(", "));
        }
        let ms = |ns: u64| ns as f64 / 1e6;
        let mut timed = Vec::new();
        if self.switch_ns > 0 {
            timed.push(format!(
                "{:.1} ms of the scheduler's probes (switches to the targets, their wakeups)",
                ms(self.switch_ns)
            ));
        }
        if self.sample_ns > 0 {
            timed.push(format!("{:.1} ms of the cpu sampler", ms(self.sample_ns)));
        }
        if !timed.is_empty() {
            out += &format!("; and {}, timed by themselves", timed.join(", "));
        }
        if let Some(ns) = self.syscall_slices_ns {
            out += &format!(
                "; and {:.1} ms of the syscall budget's slices, as it measured them (the \
                 samples in the syscall probes left out)",
                ms(ns)
            );
        }
        Some(out + ")")
    }
}

impl Profile {
    /// What the probes cost the targets (see ProbeCost); None without the targets' CPU time or
    /// cpu samples.
    pub fn probe_cost(&self) -> Option<ProbeCost> {
        self.probe_cost_over(self.meta.targets_cpu_ns?)
    }

    /// What the probes cost targets that ran `target_cpu_ns` (another reading of their CPU
    /// time than the recording's own); None without cpu samples.
    pub fn probe_cost_over(&self, target_cpu_ns: u64) -> Option<ProbeCost> {
        let samples = self.own_samples();
        (samples.all > 0).then_some(ProbeCost {
            samples,
            target_cpu_ns,
            switch_ns: self.meta.switch_probe_ns,
            sample_ns: self.meta.sample_probe_ns,
            syscall_slices_ns: self.meta.syscall_budget.as_ref().and_then(|b| b.probe_ns()),
        })
    }

    /// The cpu samples taken inside phaseprof's own probes, by mechanism (the tower's leaf).
    pub fn own_samples(&self) -> OwnSamples {
        let mut out = OwnSamples {
            all: self.total(SampleKind::Cpu, 0),
            ..OwnSamples::default()
        };
        for s in self.samples_of(SampleKind::Cpu) {
            if let Some(leaf) = self.own_cost_leaf(s) {
                let n = s.value(0);
                match leaf {
                    SYSCALL_PROBES_FRAME => out.syscalls += n,
                    UPROBE_PROBES_FRAME => out.uprobes += n,
                    _ => out.other += n,
                }
            }
        }
        out
    }

    /// The leaf of `s`'s stack when its root is the probes' tower.
    pub(crate) fn own_cost_leaf(&self, s: &Sample) -> Option<&str> {
        let frames = &self.stacks.get(s.stack? as usize)?.frames;
        let name = |i: &u32| self.frames.get(*i as usize).map(|f| f.function.as_str());
        (name(frames.last()?)? == OWN_COST_FRAME).then(|| name(frames.first()?))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the measurement: 44 of 287 samples in the probes, of 2.82 s of the targets' CPU
    // time, are 432.3 ± 60.0 ms, 15.33% of it and 18.1% more than without them; the scheduler's
    // and the sampler's own time add to it; under a syscall budget its slices' cost stands for
    // the samples in the syscall probes; with fewer than MIN_OWN_SAMPLES nothing is said.
    #[test]
    fn probes_cost_their_share_of_the_samples() {
        let samples = OwnSamples {
            syscalls: 40,
            uprobes: 4,
            other: 0,
            all: 287,
        };
        let mut c = ProbeCost {
            samples,
            target_cpu_ns: 2_819_847_135,
            switch_ns: 0,
            sample_ns: 0,
            syscall_slices_ns: None,
        };
        let line = c.describe().unwrap();
        assert!(
            line.starts_with(
                "432.3 ± 60.0 ms, 15.33% of the targets' CPU time, a slowdown of 18.1%"
            ),
            "{line}"
        );
        assert!(
            line.ends_with("syscall probes 13.94%, uprobes 1.39%)"),
            "{line}"
        );
        c.switch_ns = 100_000_000;
        c.sample_ns = 20_000_000;
        assert!((c.ns().0 - 552_311_059.0).abs() < 1.0);
        let line = c.describe().unwrap();
        assert!(
            line.contains(
                "and 100.0 ms of the scheduler's probes (switches to the targets, their \
                 wakeups), 20.0 ms of the cpu sampler, timed by themselves"
            ),
            "{line}"
        );
        // 4 samples in uprobes are 39.3 ms (of 2.82 s); the 40 in the syscall probes give way to the
        // budget's 30 ms.
        c.syscall_slices_ns = Some(30_000_000);
        assert!((c.ns().0 - 189_301_005.0).abs() < 1.0, "{:?}", c.ns());
        let line = c.describe().unwrap();
        assert!(line.contains(": uprobes 1.39%;"), "{line}");
        assert!(
            line.ends_with(
                "and 30.0 ms of the syscall budget's slices, as it measured them (the samples in \
                 the syscall probes left out))"
            ),
            "{line}"
        );
        c.syscall_slices_ns = None;
        c.sample_ns = 0;
        c.samples = OwnSamples {
            uprobes: 9,
            all: 287,
            ..OwnSamples::default()
        };
        c.switch_ns = 0;
        assert_eq!(c.describe(), None);
    }
}
