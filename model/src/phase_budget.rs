//! Phases recorded under a budget (`--phase-budget`): the phase probes were attached for slices
//! of the recording only, so the named phases' totals are estimates, extrapolated from the
//! slices, and per-call figures come from the calls that began and ended inside a slice.
//! The extrapolation is by the targets' syscalls or their own CPU time (see `slice_basis`).
use serde::{Deserialize, Serialize};

use crate::phase_stats::PhaseStats;

/// What probes under a budget counted, and in how much of the recording: the phase budget's
/// (`Meta::phase_budget`) and the syscall budget's (`Meta::syscall_budget`, see
/// `syscall_budget`), whose "calls" are syscalls.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct BudgetInfo {
    /// Allowed slowdown (0.01 = 1%).
    pub budget: f64,
    /// The targets' own CPU time (the probes' estimated time left out) while the probes were
    /// in force, and in all: their ratio is the coverage when syscalls are too few.
    pub counted_own_ns: u64,
    pub own_ns: u64,
    /// The syscalls counted by (`READ_WRITE`: the kernel's per-process counts of read and write
    /// syscalls; stored windows of earlier versions name their commonest syscall), how many
    /// the targets made while the probes were in force, and in all.
    #[serde(default)]
    pub syscall: String,
    #[serde(default)]
    pub syscalls_in_slices: u64,
    #[serde(default)]
    pub syscalls: u64,
    /// Of those syscalls the reads (`syscr`), and the bytes they returned (`rchar` of
    /// /proc/PID/io), while the probes were in force and in all (0 in windows of earlier
    /// versions, and where the probes' totals are not extrapolated by them).
    #[serde(default)]
    pub reads_in_slices: u64,
    #[serde(default)]
    pub reads: u64,
    #[serde(default)]
    pub read_bytes_in_slices: u64,
    #[serde(default)]
    pub read_bytes: u64,
    /// Of the reads in slices, those whose work was set against the calls counted (see the
    /// agent's slice_align): where any, `read_bytes_in_slices` is the bytes those calls
    /// worked on, not the bytes read while the probes were in force.
    #[serde(default)]
    pub reads_aligned: u64,
    /// Slices the probes were attached for, and the shortest one's length: a call longer than
    /// a slice is never seen, and one of length d is seen with probability 1 − d/slice.
    pub slices: u64,
    pub shortest_slice_ns: u64,
    /// Wall time the slices counted, in all (over `slices`, their mean length).
    #[serde(default)]
    pub counted_ns: u64,
    /// Calls a slice's start or end cut, never counted (slices lengthen while they are many).
    #[serde(default)]
    pub calls_voided: u64,
    /// Windows no slice fell in, whose totals are the last slices' rates at their own
    /// syscalls or CPU time (see `carry`).
    #[serde(default)]
    pub carried_windows: u64,
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
    /// The slices' calls against the targets' bytes read and syscalls, slice by slice: how
    /// much they disagree (`error`).
    #[serde(default)]
    pub spread: crate::slice_spread::SliceSpread,
}

pub use crate::slice_basis::Basis;

/// The syscalls a phase budget counts by: the read and write syscalls the kernel counts for
/// each process (`syscr` + `syscw` of /proc/PID/io), free to read and with no probe on the
/// syscall path.
pub const READ_WRITE: &str = "read/write";

impl BudgetInfo {
    /// Whether any slice counted anything (else there are no totals to extrapolate).
    pub fn counted(&self) -> bool {
        self.counted_own_ns > 0 || self.syscalls_in_slices > 0
    }

    /// The targets' reads and writes the totals may be extrapolated by.
    fn io(&self) -> crate::slice_basis::Io {
        crate::slice_basis::Io {
            syscalls_in_slices: self.syscalls_in_slices,
            syscalls: self.syscalls,
            reads_in_slices: self.reads_in_slices,
            reads: self.reads,
            read_bytes_in_slices: self.read_bytes_in_slices,
            read_bytes: self.read_bytes,
        }
    }

    /// The basis that errs less (see `slice_basis`).
    pub fn basis(&self) -> Basis {
        crate::slice_basis::basis(
            &self.io(),
            self.overhead_while_attached,
            self.counted_own_ns,
        )
    }

    /// The share of the targets' work in which phases were counted, by the basis.
    pub fn coverage(&self) -> f64 {
        match self.basis() {
            Basis::ReadBytes => ratio(self.read_bytes_in_slices, self.read_bytes),
            Basis::Syscalls => ratio(self.syscalls_in_slices, self.syscalls),
            Basis::OwnCpu => self.cpu_coverage(),
        }
    }

    /// The share of the targets' own CPU time in which phases were counted.
    pub fn cpu_coverage(&self) -> f64 {
        ratio(self.counted_own_ns, self.own_ns)
    }

    /// What the probes cost while in force, in ns of the targets' CPU time (the slowdown while
    /// attached over their own time in slices); None when they stayed attached throughout,
    /// where the cpu samples in them measure it.
    pub fn probe_ns(&self) -> Option<u64> {
        (!self.attached_throughout)
            .then(|| (self.overhead_while_attached.max(0.0) * self.counted_own_ns as f64) as u64)
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
        if self.totals_doubtful() {
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

    /// Whether the probes slowed the targets so much while attached (10x or more) that the
    /// totals are in doubt by the basis chosen: a 10% error in their cost moves the CPU time's
    /// extrapolation 100%, and a server slowed that much may batch its syscalls otherwise
    /// (nats-server at ~40x was estimated 82% under by them; validator-sim's one write a
    /// block at ~11x, within 1%). The bytes they read are the protocol's, whatever the pace
    /// (nats-server slowed 8-9x: 2.1% and 2.5% under).
    pub fn totals_doubtful(&self) -> bool {
        !self.attached_throughout
            && self.overhead_while_attached >= 10.0
            && self.basis() != Basis::ReadBytes
    }

    /// The totals' expected relative error by the I/O basis: 1/√n for the n syscalls or reads
    /// in slices (the reads the calls were aligned with, where they were), or the slices'
    /// disagreement if larger (`slice_spread`); by the syscalls, at least how far they stand
    /// from the bytes read (`Io::syscalls_disagree`). None by own CPU time.
    pub fn error(&self) -> Option<f64> {
        use crate::slice_spread::Unit;
        let reads = match self.reads_aligned {
            0 => self.reads_in_slices,
            n => n,
        };
        let (by_count, unit) = match self.basis() {
            Basis::ReadBytes => (crate::slice_basis::syscall_error(reads), Unit::ReadBytes),
            Basis::Syscalls => (self.io().error_by(Basis::Syscalls), Unit::Syscalls),
            Basis::OwnCpu => return None,
        };
        Some(by_count.max(self.spread.relative_error(unit).unwrap_or(0.0)))
    }

    /// Another window's, added (the collector's and `attach`'s merged views).
    pub fn absorb(&mut self, b: &BudgetInfo) {
        self.spread.absorb(&b.spread);
        self.counted_own_ns += b.counted_own_ns;
        self.own_ns += b.own_ns;
        // Windows stored by earlier versions counted by their commonest syscall: merged with
        // others, the sums are of whichever each counted by.
        if self.syscall != b.syscall && !b.syscall.is_empty() {
            self.syscall = "mixed".into();
        }
        self.syscalls_in_slices += b.syscalls_in_slices;
        self.syscalls += b.syscalls;
        self.reads_in_slices += b.reads_in_slices;
        self.reads += b.reads;
        self.read_bytes_in_slices += b.read_bytes_in_slices;
        self.read_bytes += b.read_bytes;
        self.reads_aligned += b.reads_aligned;
        self.slices += b.slices;
        self.counted_ns += b.counted_ns;
        self.calls_voided += b.calls_voided;
        self.carried_windows += b.carried_windows;
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
            Basis::ReadBytes => format!(
                "{} of the {} bytes the targets read ({:.2}%, in {} of their {} reads: ±{:.0}%; \
                 by their own CPU time: {:.2}%)",
                self.read_bytes_in_slices,
                self.read_bytes,
                100.0 * self.coverage(),
                self.reads_in_slices,
                self.reads,
                100.0 * self.error().unwrap_or(0.0),
                100.0 * self.cpu_coverage()
            ),
            Basis::Syscalls => {
                format!(
                    "{} of the targets' {} {} syscalls ({:.2}%, ±{:.0}%; by their own CPU time: \
                 {:.2}%)",
                    self.syscalls_in_slices,
                    self.syscalls,
                    self.syscall,
                    100.0 * self.coverage(),
                    100.0 * self.error().unwrap_or(0.0),
                    100.0 * self.cpu_coverage()
                ) + &if self.totals_doubtful() {
                    format!(
                        ", where the probes slowed the targets {:.0}x, which may change how they \
                     batch their syscalls (a server that batches them, nats-server at ~40x, was \
                     estimated 82% under): the totals may be far off (per-call figures hold)",
                        self.overhead_while_attached
                    )
                } else {
                    String::new()
                }
            }
            Basis::OwnCpu => format!(
                "{:.2}% of the targets' own CPU time (the {} {} syscalls in slices, ±{:.0}%, were \
                 too few to count by), {}",
                100.0 * self.coverage(),
                self.syscalls_in_slices,
                self.syscall,
                100.0 * crate::slice_basis::syscall_error(self.syscalls_in_slices),
                self.cpu_sensitivity()
            ),
        };
        // Measured by the bytes read where they carry the work, as the totals are counted.
        let how = if self.slowdown_measured && self.basis() == Basis::ReadBytes {
            "measured by CPU time per byte read in and out of slices"
        } else if self.slowdown_measured {
            "measured by CPU time per syscall in and out of slices"
        } else {
            "estimated from the calls"
        };
        let mut s = format!(
            "budget {:.2}%: phase probes attached in {} slices (shortest {:.0} ms, {:.0}% slowdown \
             while attached, {how}), which saw {by}; totals estimated from it, per-call figures from \
             calls that began and ended inside a slice (a call of d ms is seen with probability \
             1 − d/slice, and counts as 1/(1 − d/slice) calls in the totals)",
            self.budget * 100.0,
            self.slices,
            self.shortest_slice_ns as f64 / 1e6,
            100.0 * self.overhead_while_attached,
        );
        if self.calls_voided > 0 {
            s += &format!(
                "; {} calls cut by a slice's start or end were not counted (the totals weigh the calls counted by how likely a call of their length was to be cut)",
                self.calls_voided
            );
        }
        if self.carried_windows > 0 {
            s += &format!(
                "; {} windows had no slice of their own: their totals are the previous slices' \
                 rates, by their own {}",
                self.carried_windows,
                match self.basis() {
                    Basis::ReadBytes => "bytes read",
                    Basis::Syscalls => "syscalls",
                    Basis::OwnCpu => "CPU time",
                }
            );
        }
        if !self.counted() {
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
pub fn extrapolate(stats: &mut [PhaseStats], info: &BudgetInfo) {
    if let Some(none) = stats.first_mut() {
        *none = PhaseStats::default();
    }
    if info.attached_throughout {
        return;
    }
    unbias_slice_edges(stats, info);
    scale_totals(stats, info.scale());
}

/// A window no slice fell in (`info`, which counted nothing): its named phases' totals are
/// those the last window that counted (`last`, as counted, and `last_info`) saw per syscall or
/// per ns of own CPU time in its slices, at this window's. Its per-call maxima are not known.
pub fn carry(last: &[PhaseStats], last_info: &BudgetInfo, info: &BudgetInfo) -> Vec<PhaseStats> {
    let (now, then) = match last_info.basis() {
        Basis::ReadBytes => (info.read_bytes, last_info.read_bytes_in_slices),
        Basis::Syscalls => (info.syscalls, last_info.syscalls_in_slices),
        Basis::OwnCpu => (info.own_ns, last_info.counted_own_ns),
    };
    let mut stats = last.to_vec();
    if let Some(none) = stats.first_mut() {
        *none = PhaseStats::default();
    }
    for st in stats.iter_mut() {
        st.wall_max_ns = 0;
    }
    unbias_slice_edges(&mut stats, last_info);
    scale_totals(&mut stats, now as f64 / then.max(1) as f64);
    stats
}

/// The weight no counted call passes: calls nearly as long as a slice are rarely seen whole,
/// and say little.
const MAX_EDGE_WEIGHT: f64 = 10.0;

/// A call of length d that began in a slice of length T ended in it (and was counted) with
/// probability (T − d)/T, its start being anywhere in the slice: each counted call stands for
/// T/(T − d) of those that began in it (by its wall histogram bucket, T the slices' mean
/// length). The counts (calls, the histogram, and what the calls counted: syscalls, bytes,
/// allocations, faults, costs) take the calls' weights; the times the weights by time, a longer
/// call's share of them being larger. What a call counts does not grow with its length as its
/// times do (a call is long mostly because it waited): weighed by time, one preempted
/// `finalize` call in a 20 ms slice moved a 4M-write run's writes in it by +12% (CI).
fn unbias_slice_edges(stats: &mut [PhaseStats], info: &BudgetInfo) {
    if info.slices == 0 || info.counted_ns == 0 {
        return;
    }
    let slice = info.counted_ns as f64 / info.slices as f64;
    for st in stats.iter_mut().skip(1) {
        let (mut calls, mut weighed, mut time, mut weighed_time) = (0.0, 0.0, 0.0, 0.0);
        for (idx, n) in st.wall_hist.iter_mut() {
            let (lo, hi) = crate::phase_stats::wall_bucket_bounds(*idx);
            let d = (lo + hi) as f64 / 2.0;
            let w = (slice / (slice - d).max(slice / MAX_EDGE_WEIGHT)).max(1.0);
            let c = *n as f64;
            (calls, weighed) = (calls + c, weighed + c * w);
            (time, weighed_time) = (time + c * d, weighed_time + c * d * w);
            *n = (c * w).round() as u64;
        }
        if calls > 0.0 {
            let by_time = if time > 0.0 { weighed_time / time } else { 1.0 };
            scale_phase(st, weighed / calls, by_time);
        }
    }
}

/// The named phases' totals (ids 1..) times `scale`.
fn scale_totals(stats: &mut [PhaseStats], scale: f64) {
    for st in stats.iter_mut().skip(1) {
        scale_phase(st, scale, scale);
        for (_, n) in st.wall_hist.iter_mut() {
            *n = (*n as f64 * scale).round() as u64;
        }
    }
}

/// A phase's calls and what they counted (syscalls, bytes, allocations, faults, costs) times
/// `by_calls`, its times times `by_time` (its histogram is the caller's).
fn scale_phase(st: &mut PhaseStats, by_calls: f64, by_time: f64) {
    let up = |v: &mut u64, by: f64| *v = (*v as f64 * by).round() as u64;
    for v in [
        &mut st.calls,
        &mut st.syscalls,
        &mut st.alloc_bytes,
        &mut st.allocs,
        &mut st.frees,
        &mut st.page_faults,
    ] {
        up(v, by_calls);
    }
    for v in st.costs.values_mut() {
        up(v, by_calls);
    }
    for v in [
        &mut st.wall_ns,
        &mut st.cpu_ns,
        &mut st.offcpu_ns,
        &mut st.cpu_wait_ns,
        &mut st.gowait_ns,
        &mut st.syscall_ns,
    ] {
        up(v, by_time);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the extrapolation: a quarter of the own time counted scales named phases by 4,
    // keeps the maximum, empties (none); windows add up to the same coverage.
    #[test]
    fn totals_scale_by_the_inverse_of_the_coverage() {
        let info = BudgetInfo {
            budget: 0.01,
            counted_own_ns: 250,
            own_ns: 1000,
            slices: 3,
            shortest_slice_ns: 20_000_000,
            counted_ns: 0,
            calls_voided: 0,
            carried_windows: 0,
            attached_throughout: false,
            slowdown_measured: false,
            reads_aligned: 0,
            overhead_while_attached: 0.5,
            syscall: "write".into(),
            syscalls_in_slices: 100,
            syscalls: 1000,
            reads_in_slices: 0,
            reads: 0,
            read_bytes_in_slices: 0,
            read_bytes: 0,
            spread: Default::default(),
        };
        // Too few syscalls: by own CPU time; enough, by syscalls, or by the bytes their reads
        // returned where they read any.
        assert_eq!(info.coverage(), 0.25);
        let by_syscalls = BudgetInfo {
            syscalls_in_slices: 500,
            syscalls: 4000,
            ..info.clone()
        };
        assert_eq!(by_syscalls.coverage(), 0.125);
        let by_bytes = BudgetInfo {
            reads_in_slices: 400,
            reads: 3000,
            read_bytes_in_slices: 1 << 20,
            read_bytes: 10 << 20,
            ..by_syscalls.clone()
        };
        assert_eq!(by_bytes.coverage(), 0.1);
        assert!(by_bytes
            .describe()
            .contains("bytes the targets read (10.00%"));
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

    // Checks a window without slices: the last slices' calls per syscall at its own syscalls,
    // no maximum, (none) empty.
    #[test]
    fn a_window_without_slices_carries_the_last_rates() {
        let last_info = BudgetInfo {
            budget: 0.01,
            syscall: "write".into(),
            syscalls_in_slices: 1000,
            syscalls: 10_000,
            counted_own_ns: 5_000,
            own_ns: 50_000,
            reads_aligned: 0,
            overhead_while_attached: 0.5,
            ..BudgetInfo::default()
        };
        let info = BudgetInfo {
            syscalls: 3_000,
            own_ns: 1_000,
            ..last_info.clone()
        };
        let last = vec![
            PhaseStats {
                calls: 7,
                ..PhaseStats::default()
            },
            PhaseStats {
                calls: 100,
                wall_ns: 1_000,
                wall_max_ns: 40,
                ..PhaseStats::default()
            },
        ];
        let carried = carry(&last, &last_info, &info);
        assert_eq!(carried[0], PhaseStats::default());
        assert_eq!(
            (carried[1].calls, carried[1].wall_ns, carried[1].wall_max_ns),
            (300, 3_000, 0)
        );
        // Counted by own CPU time (too few syscalls), by it: 1,000 of 5,000 ns.
        let by_cpu = BudgetInfo {
            syscalls_in_slices: 10,
            ..last_info
        };
        assert_eq!(carry(&last, &by_cpu, &info)[1].calls, 20);
    }

    // Checks the slices' edges: calls half a slice long are seen half the time and count
    // twice, short ones once; the time sums grow by the weights by time, what the calls
    // counted (syscalls) as the calls do.
    #[test]
    fn calls_the_slices_edges_cut_are_made_up_for() {
        let bucket_of = |ns: u64| {
            (0..2000u32)
                .find(|&i| crate::phase_stats::wall_bucket_bounds(i).1 > ns)
                .unwrap()
        };
        let (long, short) = (bucket_of(10_000_000), bucket_of(1_000));
        let (lo, hi) = crate::phase_stats::wall_bucket_bounds(long);
        let d = (lo + hi) as f64 / 2.0;
        let info = BudgetInfo {
            slices: 2,
            counted_ns: 40_000_000,
            syscalls_in_slices: 1_000,
            syscalls: 1_000,
            ..BudgetInfo::default()
        };
        let phase = PhaseStats {
            calls: 20,
            wall_ns: 10 * d as u64,
            syscalls: 20,
            wall_hist: vec![(short, 10), (long, 10)],
            ..PhaseStats::default()
        };
        let mut stats = vec![PhaseStats::default(), phase];
        extrapolate(&mut stats, &info);
        let w = 20e6 / (20e6 - d);
        assert_eq!(
            stats[1].wall_hist,
            vec![(short, 10), (long, (10.0 * w).round() as u64)]
        );
        assert_eq!(stats[1].calls, (10.0 + 10.0 * w).round() as u64);
        assert_eq!(stats[1].syscalls, stats[1].calls);
        assert!((stats[1].wall_ns as f64 / (10.0 * d) / w - 1.0).abs() < 1e-3);
    }
}
