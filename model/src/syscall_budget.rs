//! Syscalls recorded under a budget (`--syscall-budget`): the syscall programs were attached
//! for slices only, so syscall counts, times and errors (and each phase's syscalls) are
//! estimates, extrapolated from the slices by the targets' read and write syscalls or their own
//! CPU time (see `slice_basis`). A syscall is counted only when its entry and its exit both
//! fell inside one slice: one as long as a slice is never seen.
use crate::phase_budget::{Basis, BudgetInfo};
use crate::phase_stats::PhaseStats;
use std::collections::HashMap;

use crate::profile::{Frame, Profile, Sample, SampleKind, Stack};

/// Scales the syscall samples' values (calls, ns, errors) and the phases' syscall totals by
/// `scale` (what `BudgetInfo::scale` gives, or a carried window's rate).
pub fn scale(samples: &mut [Sample], phase_stats: &mut [PhaseStats], scale: f64) {
    if scale == 1.0 {
        return;
    }
    let up = |v: &mut u64| *v = (*v as f64 * scale).round() as u64;
    for s in samples.iter_mut().filter(|s| s.kind == SampleKind::Syscall) {
        s.values.iter_mut().for_each(up);
    }
    for st in phase_stats {
        up(&mut st.syscalls);
        up(&mut st.syscall_ns);
    }
}

/// The factor from a window's counts to the whole of it: its slices' coverage, or, for a
/// window no slice fell in, the rate of the last that counted (`last`, whose samples are
/// carried) at this window's own syscalls or CPU time.
pub fn window_scale(info: &BudgetInfo, last: Option<&BudgetInfo>) -> f64 {
    match last {
        Some(last) if info.carried_windows > 0 => {
            let (now, then) = match last.basis() {
                Basis::ReadBytes => (info.read_bytes, last.read_bytes_in_slices),
                Basis::Syscalls => (info.syscalls, last.syscalls_in_slices),
                Basis::OwnCpu => (info.own_ns, last.counted_own_ns),
            };
            now as f64 / then.max(1) as f64
        }
        _ => info.scale(),
    }
}

/// Adds `from`'s syscall samples to `into` (a window no slice fell in carries the last
/// counted window's), their frames and stacks added to `into`'s as needed, their values times
/// `scale`.
pub fn add_syscall_samples(from: &Profile, into: &mut Profile, scale: f64) {
    let mut frames: HashMap<Frame, u32> = (into.frames.iter().cloned()).zip(0..).collect();
    let mut stacks: HashMap<Vec<u32>, u32> = (into.stacks.iter())
        .map(|s| s.frames.clone())
        .zip(0..)
        .collect();
    for s in from
        .samples
        .iter()
        .filter(|s| s.kind == SampleKind::Syscall)
    {
        let mut s = s.clone();
        if let Some(stack) = s.stack.and_then(|i| from.stacks.get(i as usize)) {
            let ids: Vec<u32> = (stack.frames.iter())
                .filter_map(|&f| from.frames.get(f as usize))
                .map(|f| {
                    *frames.entry(f.clone()).or_insert_with(|| {
                        into.frames.push(f.clone());
                        into.frames.len() as u32 - 1
                    })
                })
                .collect();
            s.stack = Some(*stacks.entry(ids.clone()).or_insert_with(|| {
                into.stacks.push(Stack { frames: ids });
                into.stacks.len() as u32 - 1
            }));
        }
        for v in s.values.iter_mut() {
            *v = (*v as f64 * scale).round() as u64;
        }
        into.samples.push(s);
    }
}

/// In words, for reports: how the syscalls were counted and how far to trust their totals.
pub fn describe(b: &BudgetInfo) -> String {
    if b.attached_throughout {
        return format!(
            "budget {:.2}%: counting syscalls cost {:.2}% of the targets' CPU time, within it: \
             counted throughout, totals exact",
            b.budget * 100.0,
            b.overhead_while_attached * 100.0
        );
    }
    let by = match b.basis() {
        Basis::ReadBytes => format!(
            "{} of the {} bytes the targets read ({:.2}%, ±{:.1}%)",
            b.read_bytes_in_slices,
            b.read_bytes,
            100.0 * b.coverage(),
            100.0 * b.error().unwrap_or(0.0)
        ),
        Basis::Syscalls => format!(
            "{} of the targets' {} read/write syscalls ({:.2}%, ±{:.1}%)",
            b.syscalls_in_slices,
            b.syscalls,
            100.0 * b.coverage(),
            100.0 * b.error().unwrap_or(0.0)
        ),
        Basis::OwnCpu => format!(
            "{:.2}% of the targets' own CPU time (too few read/write syscalls to count by), {}",
            100.0 * b.coverage(),
            b.cpu_sensitivity()
        ),
    };
    let how = if b.slowdown_measured {
        "measured by CPU time per syscall in and out of slices"
    } else {
        "estimated from the syscalls counted"
    };
    let mut s = format!(
        "budget {:.2}%: syscalls counted in {} slices (shortest {:.0} ms, {:.0}% slowdown while \
         counted, {how}), which saw {by}; totals (calls, time, errors, per phase) estimated from \
         it, latencies from syscalls that began and ended inside a slice ({} cut by a slice's \
         start or end were not counted: a syscall as long as a slice is never seen)",
        b.budget * 100.0,
        b.slices,
        b.shortest_slice_ns as f64 / 1e6,
        100.0 * b.overhead_while_attached,
        b.calls_voided,
    );
    if b.carried_windows > 0 {
        s += &format!(
            "; {} windows had no slice of their own: their syscalls are the previous slices' \
             at their own rate",
            b.carried_windows
        );
    }
    if !b.counted() {
        s += "; no slice counted anything (record longer or raise --syscall-budget)";
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PhaseAt;

    // Checks the extrapolation: a tenth of the read/write syscalls counted scales every syscall
    // value and each phase's syscalls by 10, nothing else; a carried window takes the last
    // slices' rate at its own syscalls.
    #[test]
    fn syscalls_scale_by_the_inverse_of_the_coverage() {
        let info = BudgetInfo {
            budget: 0.01,
            counted_own_ns: 1_000_000,
            own_ns: 10_000_000,
            syscalls_in_slices: 1_000,
            syscalls: 10_000,
            slices: 4,
            reads_aligned: 0,
            overhead_while_attached: 0.5,
            ..BudgetInfo::default()
        };
        let mut samples = vec![
            Sample::new(SampleKind::Syscall, (1, 1), PhaseAt::NONE, vec![7, 700, 1]),
            Sample::new(SampleKind::Cpu, (1, 1), PhaseAt::NONE, vec![5]),
        ];
        let mut stats = vec![PhaseStats {
            calls: 3,
            syscalls: 7,
            syscall_ns: 700,
            ..PhaseStats::default()
        }];
        scale(&mut samples, &mut stats, window_scale(&info, None));
        assert_eq!(samples[0].values, vec![70, 7000, 10]);
        assert_eq!(samples[1].values, vec![5]);
        assert_eq!((stats[0].calls, stats[0].syscalls), (3, 70));
        let carried = BudgetInfo {
            syscalls_in_slices: 0,
            syscalls: 3_000,
            carried_windows: 1,
            ..info.clone()
        };
        assert_eq!(window_scale(&carried, Some(&info)), 3.0);
        assert!(describe(&info).contains("1000 of the targets' 10000 read/write syscalls"));
    }
}
