//! Phases recorded under a budget (`--phase-budget`): the phase probes were attached for slices
//! of the recording only, so the named phases' totals are estimates, extrapolated from the
//! slices, and per-call figures come from the calls that began and ended inside a slice.
//!
//! The extrapolation is by the targets' syscalls when they made enough inside slices: the
//! kernel counts them exactly in and out of slices, and the probes' cost does not change how
//! many a unit of work makes (a server slowed by its probes serves fewer requests in a slice,
//! and makes fewer syscalls in proportion). Else it is by the targets' own CPU time, their CPU
//! time less the probes' estimated time, which an error in the probes' cost per call moves the
//! more the larger their share of the CPU while attached.
use serde::{Deserialize, Serialize};

use crate::phase_stats::PhaseStats;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct PhaseBudgetInfo {
    /// Allowed slowdown (0.01 = 1%).
    pub budget: f64,
    /// The targets' own CPU time (the probes' estimated time left out) while the probes were
    /// in force, and in all: their ratio is the coverage when syscalls are too few.
    pub counted_own_ns: u64,
    pub own_ns: u64,
    /// The syscall counted by (the targets' commonest inside slices), how many of it the
    /// targets made while the probes were in force, and in all.
    #[serde(default)]
    pub syscall: String,
    #[serde(default)]
    pub syscalls_in_slices: u64,
    #[serde(default)]
    pub syscalls: u64,
    /// Slices the probes were attached for, and the shortest one's length: a call longer than
    /// a slice is never seen, and one of length d is seen with probability 1 − d/slice.
    pub slices: u64,
    pub shortest_slice_ns: u64,
    /// Calls a slice's start or end cut, never counted (slices lengthen while they are many).
    #[serde(default)]
    pub calls_voided: u64,
    /// The probes stayed attached throughout (cheap enough for the budget): the totals are
    /// exact, not extrapolated.
    #[serde(default)]
    pub attached_throughout: bool,
    /// Whether `overhead_while_attached` was measured (the targets' CPU time per syscall in
    /// and out of slices), else estimated from the calls at an assumed cost per call.
    #[serde(default)]
    pub slowdown_measured: bool,
    /// Estimated slowdown of the targets while the probes were attached.
    pub overhead_while_attached: f64,
}

/// Syscalls inside slices below which they are too few to extrapolate by (their count's own
/// noise, √n, would pass 5%).
pub const MIN_SYSCALLS_IN_SLICES: u64 = 400;

/// What the totals were extrapolated by.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Basis {
    Syscalls,
    OwnCpu,
}

impl PhaseBudgetInfo {
    pub fn basis(&self) -> Basis {
        if self.syscalls_in_slices >= MIN_SYSCALLS_IN_SLICES {
            Basis::Syscalls
        } else {
            Basis::OwnCpu
        }
    }

    /// The share of the targets' work in which phases were counted, by the basis.
    pub fn coverage(&self) -> f64 {
        match self.basis() {
            Basis::Syscalls => ratio(self.syscalls_in_slices, self.syscalls),
            Basis::OwnCpu => self.cpu_coverage(),
        }
    }

    /// The share of the targets' own CPU time in which phases were counted.
    pub fn cpu_coverage(&self) -> f64 {
        ratio(self.counted_own_ns, self.own_ns)
    }

    /// The factor from the slices' totals to the whole (1 when nothing was counted, or all).
    pub fn scale(&self) -> f64 {
        if self.attached_throughout {
            return 1.0;
        }
        let c = self.coverage();
        if c > 0.0 {
            1.0 / c
        } else {
            1.0
        }
    }

    /// How far the own-CPU extrapolation can be trusted: the own time in slices is their CPU
    /// time less the probes' (a share s/(1+s) of it at slowdown s), so an error of 10% in the
    /// probes' cost moves it, and the totals, by about s × 10%.
    pub fn cpu_sensitivity(&self) -> String {
        let moved = 10.0 * self.overhead_while_attached;
        if moved >= 100.0 {
            format!(
                "where the probes took {:.0}x the targets' own time: a 10% error in their cost \
                 would move the totals {moved:.0}%, so the totals cannot be told (per-call figures \
                 hold)",
                self.overhead_while_attached
            )
        } else {
            format!("which a 10% error in the probes' cost would move {moved:.0}%")
        }
    }

    /// Another window's, added (the collector's and `attach`'s merged views).
    pub fn absorb(&mut self, b: &PhaseBudgetInfo) {
        self.counted_own_ns += b.counted_own_ns;
        self.own_ns += b.own_ns;
        // Windows may count by different syscalls (each window was extrapolated by its own):
        // merged, the sums are of whichever each counted by.
        if self.syscall != b.syscall && !b.syscall.is_empty() {
            self.syscall = "syscalls".into();
        }
        self.syscalls_in_slices += b.syscalls_in_slices;
        self.syscalls += b.syscalls;
        self.slices += b.slices;
        self.calls_voided += b.calls_voided;
        self.attached_throughout &= b.attached_throughout;
        self.slowdown_measured &= b.slowdown_measured;
        self.shortest_slice_ns = match (self.shortest_slice_ns, b.shortest_slice_ns) {
            (0, x) | (x, 0) => x,
            (x, y) => x.min(y),
        };
        self.budget = self.budget.max(b.budget);
        self.overhead_while_attached = self.overhead_while_attached.max(b.overhead_while_attached);
    }

    /// In words, for reports: how the phases were taken and how far to trust their totals.
    pub fn describe(&self) -> String {
        if self.attached_throughout {
            return format!(
                "budget {:.2}%: the phase probes cost {:.2}% of the targets' CPU time, within it, and stayed attached throughout: totals exact",
                self.budget * 100.0,
                self.overhead_while_attached * 100.0
            );
        }
        let by = match self.basis() {
            Basis::Syscalls => format!(
                "{} of the targets' {} {} ({:.2}%; by their own CPU time: {:.2}%)",
                self.syscalls_in_slices,
                self.syscalls,
                self.syscall,
                100.0 * self.coverage(),
                100.0 * self.cpu_coverage()
            ),
            Basis::OwnCpu => format!(
                "{:.2}% of the targets' own CPU time (too few syscalls in slices to count by: {}), \
                 {}",
                100.0 * self.coverage(),
                self.syscalls_in_slices,
                self.cpu_sensitivity()
            ),
        };
        let how = if self.slowdown_measured {
            "measured by CPU time per syscall in and out of slices"
        } else {
            "estimated from the calls"
        };
        let mut s = format!(
            "budget {:.2}%: phase probes attached in {} slices (shortest {:.0} ms, {:.0}% slowdown \
             while attached, {how}), which saw {by}; totals estimated from it, per-call figures from \
             calls that began and ended inside a slice (a call of d ms is seen with probability \
             1 − d/slice)",
            self.budget * 100.0,
            self.slices,
            self.shortest_slice_ns as f64 / 1e6,
            100.0 * self.overhead_while_attached,
        );
        if self.calls_voided > 0 {
            s += &format!(
                "; {} calls cut by a slice's start or end were not counted (the totals' extrapolation covers them, per-call figures lean to shorter calls)",
                self.calls_voided
            );
        }
        if self.counted_own_ns == 0 && self.syscalls_in_slices == 0 {
            s += "; no slice counted anything: no phase totals (record longer or raise --phase-budget)";
        }
        s
    }
}

fn ratio(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        return 0.0;
    }
    (part as f64 / whole as f64).min(1.0)
}

/// Scales the named phases' totals (ids 1..) by `info`'s scale, the inverse of the coverage;
/// the maximum stays what was seen (nothing is scaled when the probes stayed attached
/// throughout). `(none)` is emptied: under a budget the kernel keeps no totals of it (they
/// would mix the slices' time outside phases with everything between slices).
pub fn extrapolate(stats: &mut [PhaseStats], info: &PhaseBudgetInfo) {
    if let Some(none) = stats.first_mut() {
        *none = PhaseStats::default();
    }
    if info.attached_throughout {
        return;
    }
    let scale = info.scale();
    let up = |v: &mut u64| *v = (*v as f64 * scale).round() as u64;
    for st in stats.iter_mut().skip(1) {
        for v in [
            &mut st.calls,
            &mut st.wall_ns,
            &mut st.cpu_ns,
            &mut st.offcpu_ns,
            &mut st.cpu_wait_ns,
            &mut st.gowait_ns,
            &mut st.syscalls,
            &mut st.syscall_ns,
            &mut st.alloc_bytes,
            &mut st.allocs,
            &mut st.frees,
            &mut st.page_faults,
        ] {
            up(v);
        }
        for (_, n) in st.wall_hist.iter_mut() {
            up(n);
        }
        for v in st.costs.values_mut() {
            up(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the extrapolation: a quarter of the own time counted scales named phases by 4,
    // keeps the maximum, empties (none); windows add up to the same coverage.
    #[test]
    fn totals_scale_by_the_inverse_of_the_coverage() {
        let info = PhaseBudgetInfo {
            budget: 0.01,
            counted_own_ns: 250,
            own_ns: 1000,
            slices: 3,
            shortest_slice_ns: 20_000_000,
            calls_voided: 0,
            attached_throughout: false,
            slowdown_measured: false,
            overhead_while_attached: 0.5,
            syscall: "write".into(),
            syscalls_in_slices: 100,
            syscalls: 1000,
        };
        // Too few syscalls: by own CPU time; enough, by syscalls.
        assert_eq!(info.coverage(), 0.25);
        let by_syscalls = PhaseBudgetInfo {
            syscalls_in_slices: 500,
            syscalls: 4000,
            ..info.clone()
        };
        assert_eq!(by_syscalls.coverage(), 0.125);
        let mut merged = info.clone();
        merged.absorb(&info);
        assert_eq!((merged.coverage(), merged.slices), (0.25, 6));
        let phase = PhaseStats {
            calls: 10,
            wall_ns: 1000,
            wall_max_ns: 300,
            wall_hist: vec![(3, 10)],
            ..PhaseStats::default()
        };
        let mut stats = vec![phase.clone(), phase];
        extrapolate(&mut stats, &info);
        assert_eq!(stats[0], PhaseStats::default());
        assert_eq!(
            (stats[1].calls, stats[1].wall_ns, stats[1].wall_max_ns),
            (40, 4000, 300)
        );
        assert_eq!(stats[1].wall_hist, vec![(3, 40)]);
        assert!(info
            .describe()
            .contains("25.00% of the targets' own CPU time"));
    }
}
