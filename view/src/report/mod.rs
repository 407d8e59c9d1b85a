//! `phaseprof report`: human tables (top functions per event kind, syscalls by name) and the
//! JSON summary, plus the call tree and callers views (`tree`).
mod alloc;
mod json;
mod tree;
mod who;

use std::collections::{HashMap, HashSet};
use std::io::Write;

use self::alloc::{write_alloc_header, write_live};
pub use self::tree::TreeView;
use crate::format::{fmt_bytes, fmt_ns, fmt_value, pct};
use phaseprof_model::summary::{syscalls_by_name, CountNs};
use phaseprof_model::{display_name, in_phase, is_go_sampling_hook, EventKind, Meta, Profile};

/// Options of `report`, independent of the CLI.
#[derive(Clone, Debug, Default)]
pub struct ReportOptions {
    pub json: bool,
    /// Only this event kind.
    pub event: Option<EventKind>,
    /// Only stacks recorded in this phase.
    pub phase: Option<u32>,
    pub top: usize,
    /// Show the live heap (allocations not freed at the end) by stack, with ages.
    pub live: bool,
    /// Also say how stacks were walked, per target.
    pub verbose: bool,
    /// Instead of the tables: the stacks of `event` (cpu by default) as a call tree.
    pub tree: Option<TreeView>,
    /// Branches of the tree under this share of the whole are folded.
    pub min_percent: f64,
}

/// Self and inclusive value of one function.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FunctionCost {
    pub name: String,
    pub self_value: u64,
    pub total_value: u64,
}

/// Functions of `kind` ranked by self value, with inclusive values; and the grand total.
pub fn top_functions(
    profile: &Profile,
    kind: EventKind,
    phase: Option<u32>,
) -> (Vec<FunctionCost>, u64) {
    let mut costs: HashMap<String, FunctionCost> = HashMap::new();
    let mut grand: u64 = 0;
    for w in profile.weighted_stacks(kind, phase) {
        grand = grand.saturating_add(w.value);
        let mut names: Vec<String> = w
            .frames
            .iter()
            .filter_map(|&f| profile.frames.get(f as usize))
            .map(display_name)
            .collect();
        if kind == EventKind::Alloc {
            let hook = names.iter().take_while(|n| is_go_sampling_hook(n)).count();
            if hook < names.len() {
                names.drain(..hook);
            }
        }
        if let Some(leaf) = names.first() {
            let e = costs.entry(leaf.clone()).or_insert_with(|| FunctionCost {
                name: leaf.clone(),
                ..Default::default()
            });
            e.self_value = e.self_value.saturating_add(w.value);
        }
        let unique: HashSet<&String> = names.iter().collect();
        for n in unique {
            let e = costs.entry(n.clone()).or_insert_with(|| FunctionCost {
                name: n.clone(),
                ..Default::default()
            });
            e.total_value = e.total_value.saturating_add(w.value);
        }
    }
    let mut v: Vec<FunctionCost> = costs.into_values().collect();
    v.sort_by(|a, b| {
        b.self_value
            .cmp(&a.self_value)
            .then(b.total_value.cmp(&a.total_value))
            .then(a.name.cmp(&b.name))
    });
    (v, grand)
}

/// A stack in one line, leaf first, allocator frames left out: `leak ← replay ← block`.
fn stack_line(profile: &Profile, stack: u32, max: usize) -> String {
    let names: Vec<&str> = profile
        .stacks
        .get(stack as usize)
        .map(|s| {
            s.frames
                .iter()
                .filter_map(|&f| profile.frames.get(f as usize))
                .map(|f| f.function.as_str())
                .filter(|f| !phaseprof_model::is_allocator_frame(f))
                .take(max)
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        "[no stack]".into()
    } else {
        names.join(" ← ")
    }
}

/// The syscall section's header: whether the counts are exact or estimated under a budget,
/// and how their stacks were sampled.
fn write_syscall_header(m: &Meta, grand: u64, out: &mut impl Write) -> std::io::Result<()> {
    let budget = m.syscall_budget.as_ref();
    let how = match budget {
        Some(b) if !b.attached_throughout => "ESTIMATED under a budget",
        _ => "exact",
    };
    match (m.syscall_stack_every, m.syscall_stack_walks_per_sec) {
        (n, 0) if n > 1 && m.syscall_stacks => writeln!(
            out,
            "== syscalls: {grand} calls ({how}); stacks sampled 1 in {n}, counts by stack \
             estimated =="
        )?,
        (n, rate) if n > 1 && m.syscall_stacks => writeln!(
            out,
            "== syscalls: {grand} calls ({how}); stacks sampled 1 in {n} (fewer on busy \
             threads: at most {rate} a second each), counts by stack estimated =="
        )?,
        _ => writeln!(out, "== syscalls: {grand} calls ({how}) ==")?,
    }
    if let Some(b) = budget {
        writeln!(out, "   {}", phaseprof_model::syscall_budget::describe(b))?;
    }
    Ok(())
}

/// The off-CPU section's header: with sampled stacks, how much of the time carries a stack of its
/// own (the rest is shown under the sampled stacks of its thread and phase; the time itself is
/// counted at every switch-out).
fn write_offcpu_header(profile: &Profile, grand: u64, out: &mut impl Write) -> std::io::Result<()> {
    let rate = profile.meta.offcpu_stack_walks_per_sec;
    let total = profile.total(phaseprof_model::SampleKind::Offcpu, 0);
    let own = profile.offcpu_with_stack_ns();
    if rate == 0 || own >= total {
        return writeln!(out, "== off-cpu: {} ==", fmt_ns(grand));
    }
    writeln!(
        out,
        "== off-cpu: {}; stacks sampled on busy threads (at most {rate} a second each): \
         {:.1}% of the time carries its own, time by stack estimated ==",
        fmt_ns(grand),
        pct(own, total)
    )
}

/// What phaseprof's probes cost the targets: all of them, measured from the cpu samples taken
/// in them, and the phase probes on their own.
fn write_probe_costs(profile: &Profile, out: &mut impl Write) -> std::io::Result<()> {
    let m = &profile.meta;
    let own = profile.own_samples();
    if let Some(line) = profile.probe_cost().and_then(|c| c.describe()) {
        writeln!(out, "probes' cost: {line}")?;
    }
    if let Some(line) = m.targets_slowdown.and_then(|t| t.describe()) {
        writeln!(out, "measured in the targets: {line}")?;
    }
    if let Some(cost) = &m.phase_probes {
        let sampled = (own.uprobes, own.all);
        writeln!(out, "phase probes: {}", cost.describe_measured(sampled))?;
    }
    Ok(())
}

pub fn write_report(
    profile: &Profile,
    opts: &ReportOptions,
    mut out: impl Write,
) -> std::io::Result<()> {
    if opts.json {
        serde_json::to_writer_pretty(&mut out, &json::json_report(profile, opts))?;
        return writeln!(out);
    }
    if let Some(view) = &opts.tree {
        let kind = opts.event.unwrap_or(EventKind::Cpu);
        return tree::write_tree(profile, kind, opts.phase, view, opts.min_percent, &mut out);
    }
    let m = &profile.meta;
    writeln!(
        out,
        "{} (pids {:?}) on {} ({}), {}",
        if m.exe.is_empty() { &m.comm } else { &m.exe },
        m.pids,
        m.host,
        m.kernel,
        fmt_ns(profile.duration_ns())
    )?;
    if let Some(id) = &m.build_id {
        writeln!(out, "build id {id}")?;
    }
    let l = &profile.lost;
    writeln!(
        out,
        "lost: {} events, {} stacks{}",
        l.events,
        l.stacks,
        if l.is_empty() {
            " (complete profile)"
        } else {
            " (PARTIAL profile: see lost.by_reason in --json)"
        }
    )?;
    if profile.phase_stats.len() > 1 {
        writeln!(out, "phases: {}", profile.describe_phases())?;
    }
    write_probe_costs(profile, &mut out)?;
    if m.names_late > 0 {
        writeln!(
            out,
            "names: {} addresses named file+offset (their names came after their window was taken)",
            m.names_late
        )?;
    }
    if let (Some(u), true) = (&m.unwind, opts.verbose) {
        writeln!(out, "stacks: {}", u.describe())?;
        for m in u.describe_modules() {
            writeln!(out, "stacks: module {m}")?;
        }
    }
    if let Some(p) = opts.phase {
        writeln!(
            out,
            "phase: {} only (stacks recorded inside it, phases nested in it included)",
            profile.phase_name(p)
        )?;
    }
    if !profile.phase_stats.is_empty() && opts.event.is_none() {
        write_phase_table(profile, &mut out)?;
    }
    let top = if opts.top == 0 { 20 } else { opts.top };
    if opts.event.is_none() {
        who::write_who_table(profile, opts.phase, top, &mut out)?;
    }
    if opts.live {
        return write_live(profile, top, &mut out);
    }
    for kind in EventKind::ALL {
        if !profile.recorded(kind) || opts.event.is_some_and(|e| e != kind) {
            continue;
        }
        let (funcs, grand) = top_functions(profile, kind, opts.phase);
        writeln!(out)?;
        match kind {
            EventKind::Cpu => {
                writeln!(out, "== cpu: {grand} samples at {} Hz ==", m.frequency_hz)?;
                if let Some(why) = profile.cpu_sample_shortfall() {
                    writeln!(out, "{why}")?;
                }
            }
            EventKind::Offcpu => write_offcpu_header(profile, grand, &mut out)?,
            EventKind::Syscall => write_syscall_header(m, grand, &mut out)?,
            EventKind::Alloc => write_alloc_header(profile, &mut out)?,
            EventKind::Pagefault => writeln!(out, "== page faults: {grand} ==")?,
            _ => writeln!(out, "== {kind}: {} ==", fmt_value(kind, grand))?,
        }
        writeln!(
            out,
            "{:>7} {:>7} {:>12} {:>12}  function",
            "self%", "total%", "self", "total"
        )?;
        for f in funcs.iter().take(top) {
            writeln!(
                out,
                "{:>6.2}% {:>6.2}% {:>12} {:>12}  {}",
                pct(f.self_value, grand),
                pct(f.total_value, grand),
                fmt_value(kind, f.self_value),
                fmt_value(kind, f.total_value),
                f.name
            )?;
        }
        if kind == EventKind::Syscall {
            write_syscall_table(profile, opts.phase, &mut out)?;
        }
    }
    Ok(())
}

/// The columns every phase table shows: calls, wall p50/p95/p99/max, cpu, off-cpu, of it the
/// time runnable waiting for a CPU, goroutine wait (Go), syscalls.
pub fn phase_cells(st: &phaseprof_model::PhaseStats) -> Vec<String> {
    vec![
        st.calls.to_string(),
        fmt_ns(st.wall_quantile(0.5)),
        fmt_ns(st.wall_quantile(0.95)),
        fmt_ns(st.wall_quantile(0.99)),
        fmt_ns(st.wall_max_ns),
        fmt_ns(st.cpu_ns),
        fmt_ns(st.offcpu_ns),
        fmt_ns(st.cpu_wait_ns),
        fmt_ns(st.gowait_ns),
        st.syscalls.to_string(),
    ]
}

/// Exact per-phase totals (inclusive of nested phases), then the same per call.
fn write_phase_table(profile: &Profile, mut out: impl Write) -> std::io::Result<()> {
    let rows: Vec<(u32, &phaseprof_model::PhaseStats)> = (1..profile.phase_stats.len())
        .chain(std::iter::once(0))
        .filter_map(|i| profile.phase_stats.get(i).map(|s| (i as u32, s)))
        .collect();
    let costs: Vec<&String> = rows
        .first()
        .map(|(_, s)| s.costs.keys().collect())
        .unwrap_or_default();
    let allocs = profile.recorded(EventKind::Alloc);
    let faults = profile.recorded(EventKind::Pagefault);
    writeln!(out)?;
    let how = match (
        &profile.meta.phase_budget,
        profile.lost.phase_issues().is_empty(),
    ) {
        (_, false) => "INCOMPLETE: see `phases:` above",
        (Some(b), true) if b.attached_throughout => "exact",
        (Some(_), true) => "ESTIMATED under a budget",
        (None, true) => "exact",
    };
    writeln!(out, "== phases ({how}, inclusive of nested phases) ==")?;
    if let Some(b) = &profile.meta.phase_budget {
        writeln!(out, "   {}", b.describe())?;
    }
    write!(
        out,
        "{:<16} {:>8} {:>11} {:>11} {:>11} {:>11} {:>12} {:>12} {:>12} {:>12} {:>9}",
        "phase",
        "calls",
        "wall p50",
        "p95",
        "p99",
        "max",
        "cpu",
        "off-cpu",
        "cpu wait",
        "go wait",
        "syscalls"
    )?;
    if allocs {
        write!(out, " {:>12} {:>9} {:>9}", "alloc", "allocs", "frees")?;
    }
    if faults {
        write!(out, " {:>9}", "faults")?;
    }
    for c in &costs {
        write!(out, " {:>15}", c)?;
    }
    writeln!(out)?;
    for (i, st) in &rows {
        write!(out, "{:<16}", profile.phase_name(*i))?;
        for (cell, width) in phase_cells(st)
            .iter()
            .zip([8, 11, 11, 11, 11, 12, 12, 12, 12, 9])
        {
            write!(out, " {cell:>width$}")?;
        }
        if allocs {
            write!(
                out,
                " {:>12} {:>9} {:>9}",
                fmt_bytes(st.alloc_bytes),
                st.allocs,
                st.frees
            )?;
        }
        if faults {
            write!(out, " {:>9}", st.page_faults)?;
        }
        for c in &costs {
            write!(out, " {:>15}", st.costs.get(*c).copied().unwrap_or(0))?;
        }
        writeln!(out)?;
    }
    writeln!(out, "per call:")?;
    for (i, st) in rows.iter().filter(|(_, st)| st.calls > 0) {
        let per = |v: u64| v / st.calls;
        write!(
            out,
            "{:<16} wall {:>11}  cpu {:>11}  off-cpu {:>11}  cpu wait {:>11}  go wait {:>11}  \
             syscalls {:>8.2}",
            profile.phase_name(*i),
            fmt_ns(per(st.wall_ns)),
            fmt_ns(per(st.cpu_ns)),
            fmt_ns(per(st.offcpu_ns)),
            fmt_ns(per(st.cpu_wait_ns)),
            fmt_ns(per(st.gowait_ns)),
            st.syscalls as f64 / st.calls as f64
        )?;
        if allocs {
            write!(
                out,
                "  alloc {} in {:.2}",
                fmt_bytes(per(st.alloc_bytes)),
                st.allocs as f64 / st.calls as f64
            )?;
        }
        if faults {
            write!(
                out,
                "  faults {:.2}",
                st.page_faults as f64 / st.calls as f64
            )?;
        }
        for c in &costs {
            write!(
                out,
                "  {c} {:.2}",
                st.costs.get(*c).copied().unwrap_or(0) as f64 / st.calls as f64
            )?;
        }
        writeln!(out)?;
    }
    write_probes_inside_phases(profile, &rows, out)
}

/// The phases' times hold the probes' own (see `phase_probe_share`): how much, by the phase's
/// cpu samples, and the cpu and wall time per call without it.
fn write_probes_inside_phases(
    profile: &Profile,
    rows: &[(u32, &phaseprof_model::PhaseStats)],
    mut out: impl Write,
) -> std::io::Result<()> {
    let shares = profile.phase_probe_shares();
    let mut lines = Vec::new();
    for (i, st) in rows.iter().filter(|(_, st)| st.calls > 0) {
        let share = shares[*i as usize];
        let (Some(said), Some((cpu, wall))) =
            (share.describe(), share.without(st.cpu_ns, st.wall_ns))
        else {
            continue;
        };
        lines.push(format!(
            "{:<16} {said}: without them, per call wall {}  cpu {}",
            profile.phase_name(*i),
            fmt_ns(wall / st.calls),
            fmt_ns(cpu / st.calls),
        ));
    }
    if !lines.is_empty() {
        writeln!(
            out,
            "phaseprof's probes inside each phase (its cpu samples taken in them; its times above \
             include that much of the probes' time):"
        )?;
        for line in lines {
            writeln!(out, "{line}")?;
        }
    }
    Ok(())
}

/// Syscalls by name, most frequent first; with `phase`, those made inside it (nested phases
/// included, as everywhere else).
pub fn syscall_rows(profile: &Profile, phase: Option<u32>) -> Vec<(String, CountNs)> {
    let by_name = match phase {
        None => syscalls_by_name(profile),
        Some(p) => {
            let mut only = profile.clone();
            only.samples
                .retain(|s| in_phase(Some(p), s.phase, s.phase_mask));
            syscalls_by_name(&only)
        }
    };
    let mut rows: Vec<_> = by_name.into_iter().collect();
    rows.sort_by(|a, b| b.1.count.cmp(&a.1.count).then(a.0.cmp(&b.0)));
    rows
}

fn write_syscall_table(
    profile: &Profile,
    phase: Option<u32>,
    mut out: impl Write,
) -> std::io::Result<()> {
    let rows = syscall_rows(profile, phase);
    writeln!(out)?;
    writeln!(
        out,
        "{:<20} {:>10} {:>14} {:>12}",
        "syscall", "count", "total", "mean"
    )?;
    for (name, c) in rows {
        writeln!(
            out,
            "{:<20} {:>10} {:>14} {:>12}",
            name,
            c.count,
            fmt_ns(c.total_ns),
            fmt_ns(c.total_ns.checked_div(c.count).unwrap_or(0))
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use phaseprof_model::*;

    // Checks self/inclusive attribution: recursion counted once per stack, leaf is self.
    #[test]
    fn top_functions_self_and_total() {
        let mut b = ProfileBuilder::new(
            Meta {
                events: vec![EventKind::Cpu],
                ..Meta::default()
            },
            vec![],
        );
        let mut f = |n: &str| {
            b.intern_frame(Frame {
                function: n.into(),
                module: "m".into(),
                kind: FrameKind::User,
                inlined: false,
            })
        };
        let (main, rec, burn) = (f("main"), f("rec"), f("burn"));
        let s1 = b.intern_stack(vec![burn, rec, rec, main]);
        let s2 = b.intern_stack(vec![main]);
        b.add(Sample::new(SampleKind::Cpu, (1, 1), PhaseAt::NONE, vec![9]).on(s1));
        b.add(Sample::new(SampleKind::Cpu, (1, 1), PhaseAt::NONE, vec![1]).on(s2));
        let (top, grand) = top_functions(&b.finish(), EventKind::Cpu, None);
        assert_eq!(grand, 10);
        assert_eq!(
            top[0],
            FunctionCost {
                name: "burn".into(),
                self_value: 9,
                total_value: 9
            }
        );
        let rec = top.iter().find(|f| f.name == "rec").unwrap();
        assert_eq!(rec.total_value, 9);
        let main = top.iter().find(|f| f.name == "main").unwrap();
        assert_eq!((main.self_value, main.total_value), (1, 10));
    }
}
