//! The allocation sections of `report`: how allocations were taken (exact, sampled by Go, or
//! extrapolated under a budget, and how far to trust that), and the live heap by stack.
use std::io::Write;

use super::stack_line;
use crate::format::{fmt_bytes, fmt_ns};
use phaseprof_model::slice_basis::Basis;
use phaseprof_model::{
    EventKind, Profile, Sample, SampleKind, LIVE_AGE_NS, LIVE_BYTES, LIVE_OLDEST_NS, LIVE_SAMPLES,
    TOTAL_BYTES, TOTAL_COUNT, TOTAL_FREES,
};

/// How much a budget's extrapolated totals hang on the cost per probe hit: the target's own CPU
/// time while counted is its CPU time less the probes' (hits × that cost), so when the probes
/// took a share p of it, a cost 10% higher leaves (1 − 1.1p) / (1 − p) of the own time, and the
/// totals scale by the inverse.
fn extrapolation_sensitivity(info: &phaseprof_model::AllocInfo) -> String {
    let o = info.estimated_overhead.max(0.0);
    let p = o / (1.0 + o);
    let how = if info.ns_per_hit_measured {
        "measured"
    } else {
        "assumed: too few cpu samples in the probes to measure it"
    };
    let head = format!(
        "the probes took {:.0}% of the target's CPU while attached, at {:.0} ns a hit ({how})",
        100.0 * p,
        info.ns_per_hit
    );
    if 1.1 * p >= 1.0 {
        return format!(
            "{head}: a cost 10% higher leaves no own time, so the totals cannot be told"
        );
    }
    let moved = (1.0 - p) / (1.0 - 1.1 * p) - 1.0;
    format!(
        "{head}: each 10% error in that cost moves the totals by {:.0}%",
        100.0 * moved
    )
}

pub(super) fn write_alloc_header(profile: &Profile, mut out: impl Write) -> std::io::Result<()> {
    let total = |i| profile.total(SampleKind::AllocTotal, i);
    let (bytes, count, frees) = (total(TOTAL_BYTES), total(TOTAL_COUNT), total(TOTAL_FREES));
    let info = profile.meta.alloc.clone().unwrap_or_default();
    let exact = if info.go_sampled {
        "estimated from Go's heap samples"
    } else if info.budget.is_some() {
        "extrapolated"
    } else {
        "exact"
    };
    writeln!(
        out,
        "== alloc: {} in {count} allocations, {frees} frees ({exact}); stacks sampled every {} ==",
        fmt_bytes(bytes),
        fmt_bytes(info.sample_bytes)
    )?;
    if let Some(b) = info.budget {
        let by = match info.basis() {
            Basis::Syscalls | Basis::ReadBytes => format!(
                "the targets' read and write syscalls ({} of their {} made while counted, ±{:.0}%)",
                info.syscalls_in_slices,
                info.syscalls,
                100.0 * phaseprof_model::slice_basis::syscall_error(info.syscalls_in_slices)
            ),
            Basis::OwnCpu => "the target's CPU time".to_string(),
        };
        writeln!(
            out,
            "   budget {:.2}%: allocations counted {:.2}% of the time, totals extrapolated by {by}",
            b * 100.0,
            info.attached_fraction * 100.0,
        )?;
        if info.basis() == Basis::OwnCpu {
            writeln!(out, "   {}", extrapolation_sensitivity(&info))?;
        }
    }
    writeln!(
        out,
        "   estimated slowdown while attached: {:.2}% of the target's CPU time",
        info.estimated_overhead * 100.0
    )?;
    for p in &info.probes {
        writeln!(out, "   probe {p}")?;
    }
    Ok(())
}

/// Sampled allocations not freed when recording stopped, by stack, largest first.
pub(super) fn write_live(
    profile: &Profile,
    top: usize,
    mut out: impl Write,
) -> std::io::Result<()> {
    writeln!(out)?;
    if !profile.recorded(EventKind::Alloc) {
        return writeln!(
            out,
            "== live heap: not recorded (record with --events alloc) =="
        );
    }
    if profile
        .meta
        .alloc
        .as_ref()
        .is_some_and(|a| a.budget.is_some())
    {
        return writeln!(
            out,
            "== live heap: not tracked (duty-cycled probes miss frees) =="
        );
    }
    let total = profile.total(SampleKind::Live, LIVE_BYTES);
    writeln!(
        out,
        "== live heap at the end: {} (estimated from sampled allocations) ==",
        fmt_bytes(total)
    )?;
    writeln!(
        out,
        "{:>12} {:>8} {:>10} {:>10}  {:<12} stack",
        "bytes", "samples", "oldest", "mean age", "phase"
    )?;
    let mut live: Vec<&Sample> = profile.samples_of(SampleKind::Live).collect();
    live.sort_by_key(|l| std::cmp::Reverse(l.value(LIVE_BYTES)));
    for l in live.into_iter().take(top) {
        let samples = l.value(LIVE_SAMPLES);
        writeln!(
            out,
            "{:>12} {:>8} {:>10} {:>10}  {:<12} {}",
            fmt_bytes(l.value(LIVE_BYTES)),
            samples,
            fmt_ns(l.value(LIVE_OLDEST_NS)),
            fmt_ns(l.value(LIVE_AGE_NS) / samples.max(1)),
            profile.phase_name(l.phase),
            stack_line(profile, l.stack.unwrap_or(u32::MAX), 6)
        )?;
    }
    Ok(())
}
