//! The `report --json` object; its contract is documented in `model/FORMAT.md` ("The JSON
//! summary").
use std::collections::BTreeMap;

use serde::Serialize;

use crate::kinds::*;
use crate::profile::*;

/// Syscalls that flush data to a file or socket: the built-in `flush_syscalls` cost.
pub const FLUSH_SYSCALLS: &[&str] = &[
    "write",
    "writev",
    "pwrite64",
    "pwritev",
    "pwritev2",
    "sendto",
    "sendmsg",
    "sendmmsg",
    "fsync",
    "fdatasync",
    "sync_file_range",
    "msync",
];

#[derive(Serialize, Debug)]
pub struct Summary {
    pub version: u32,
    pub target: Target,
    pub duration_ns: u64,
    pub events: BTreeMap<String, serde_json::Value>,
    pub costs: BTreeMap<String, Option<u64>>,
    pub phases: Vec<serde_json::Value>,
    /// What the phase probes cost the targets (absent without phases).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase_probes: Option<serde_json::Value>,
    /// Phases recorded under a budget: the named phases' totals are estimates from slices
    /// covering `coverage` of the targets' own CPU time (absent: exact).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase_budget: Option<serde_json::Value>,
    /// Syscalls recorded under a budget: their totals are estimates from slices (absent:
    /// exact).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syscall_budget: Option<serde_json::Value>,
    /// What all of phaseprof's probes cost the targets, measured from the cpu samples taken in
    /// them (absent without cpu samples or the targets' CPU time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_cost: Option<serde_json::Value>,
    pub lost: LostSummary,
}

#[derive(Serialize, Debug)]
pub struct Target {
    pub pids: Vec<u32>,
    pub comm: String,
    pub exe: String,
    pub build_id: Option<String>,
    pub command: Vec<String>,
    pub host: String,
    pub kernel: String,
    /// The kernel's BPF features and what was used without each (empty for older recordings).
    pub kernel_features: BTreeMap<String, String>,
}

#[derive(Serialize, Debug)]
pub struct LostSummary {
    pub events: u64,
    pub stacks: u64,
    pub by_reason: BTreeMap<String, u64>,
    pub syscalls_in_flight_at_start: u64,
    /// Whether every phase entry was matched with its return (see `phase_issues`).
    pub phases_complete: bool,
    /// Counts of what made phase numbers incomplete, by cause.
    pub phase_issues: BTreeMap<String, u64>,
    /// The same in words.
    pub phases: String,
}

#[derive(Serialize, Debug, Default, Clone, Copy)]
pub struct CountNs {
    pub count: u64,
    pub total_ns: u64,
}

impl Summary {
    pub fn of(profile: &Profile) -> Summary {
        let mut events = BTreeMap::new();
        let mut costs = BTreeMap::new();
        let m = &profile.meta;
        if profile.recorded(EventKind::Cpu) {
            let samples = profile.total(SampleKind::Cpu, CPU_COUNT);
            events.insert(
                "cpu".into(),
                serde_json::json!({
                    "samples": samples,
                    "frequency_hz": m.frequency_hz,
                    // From the targets' CPU time; null when it could not be read at the end.
                    "expected_samples": profile.expected_cpu_samples(),
                    "shortfall": profile.cpu_sample_shortfall(),
                    "unwind": m.unwind,
                }),
            );
        }
        if profile.recorded(EventKind::Offcpu) {
            let total = profile.total(SampleKind::Offcpu, OFFCPU_NS);
            // With sampled stacks (`stack_walks_per_sec` > 0), the time under stacks of their
            // own; the rest was spread over them at the drain.
            events.insert(
                "offcpu".into(),
                serde_json::json!({
                    "total_ns": total,
                    "with_stack_ns": profile.offcpu_with_stack_ns(),
                    "stack_walks_per_sec": m.offcpu_stack_walks_per_sec,
                }),
            );
        }
        if profile.recorded(EventKind::Syscall) {
            let by_name = syscalls_by_name(profile);
            let count = crate::saturating_sum(by_name.values().map(|c| c.count));
            let total_ns = crate::saturating_sum(by_name.values().map(|c| c.total_ns));
            let flushes = crate::saturating_sum(
                FLUSH_SYSCALLS
                    .iter()
                    .filter_map(|n| by_name.get(*n))
                    .map(|c| c.count),
            );
            costs.insert("flush_syscalls".into(), Some(flushes));
            events.insert(
                "syscall".into(),
                serde_json::json!({"count": count, "total_ns": total_ns, "by_name": by_name}),
            );
        }
        if profile.recorded(EventKind::Alloc) {
            events.insert("alloc".into(), alloc_json(profile));
        }
        if profile.recorded(EventKind::Pagefault) {
            let count = profile.total(SampleKind::Pagefault, FAULT_COUNT);
            events.insert(
                "pagefault".into(),
                serde_json::json!({"count": count, "unwind": m.unwind}),
            );
        }
        add_totals(profile, &mut events);
        for (name, v) in &profile.costs {
            costs.insert(name.clone(), Some(*v));
        }
        costs.entry("clone_bytes".into()).or_insert(None);
        let phases = phase_summaries(profile);
        Summary {
            version: 1,
            target: Target {
                pids: m.pids.clone(),
                comm: m.comm.clone(),
                exe: m.exe.clone(),
                build_id: m.build_id.clone(),
                command: m.command.clone(),
                host: m.host.clone(),
                kernel: m.kernel.clone(),
                kernel_features: m.kernel_features.clone(),
            },
            duration_ns: profile.duration_ns(),
            events,
            costs,
            phases,
            phase_probes: (m.phase_probes.as_ref()).map(|c| phase_probes_json(profile, c)),
            phase_budget: m.phase_budget.as_ref().map(budget_json),
            syscall_budget: m.syscall_budget.as_ref().map(budget_json),
            probe_cost: probe_cost_json(profile),
            lost: LostSummary {
                events: profile.lost.events,
                stacks: profile.lost.stacks,
                by_reason: profile.lost.by_reason.clone(),
                syscalls_in_flight_at_start: profile.lost.syscalls_in_flight_at_start,
                phases_complete: profile.lost.phase_issues().is_empty(),
                phase_issues: profile
                    .lost
                    .phase_issues()
                    .into_iter()
                    .map(|(name, n, _)| (name, n))
                    .collect(),
                phases: profile.describe_phases(),
            },
        }
    }
}

/// `events.alloc`: the totals, by process, how they were taken and what the probes cost.
fn alloc_json(profile: &Profile) -> serde_json::Value {
    let total = |i| profile.total(SampleKind::AllocTotal, i);
    let (bytes, count, frees) = (total(TOTAL_BYTES), total(TOTAL_COUNT), total(TOTAL_FREES));
    let info = profile.meta.alloc.clone().unwrap_or_default();
    let live_bytes = profile.total(SampleKind::Live, LIVE_BYTES);
    let mut by_pid: BTreeMap<String, [u64; 3]> = BTreeMap::new();
    for t in profile.samples_of(SampleKind::AllocTotal) {
        let e = by_pid.entry(t.pid.to_string()).or_default();
        for (i, v) in [TOTAL_BYTES, TOTAL_COUNT, TOTAL_FREES]
            .into_iter()
            .enumerate()
        {
            e[i] = e[i].saturating_add(t.value(v));
        }
    }
    let by_pid: BTreeMap<String, serde_json::Value> = by_pid
        .into_iter()
        .map(|(pid, [b, c, f])| (pid, serde_json::json!({"bytes": b, "count": c, "frees": f})))
        .collect();
    serde_json::json!({
        "bytes": bytes,
        "count": count,
        "frees": frees,
        "by_pid": by_pid,
        // Exact unless Go's sampling or a duty cycle made them estimates.
        "exact": !info.go_sampled && info.budget.is_none(),
        "sample_bytes": info.sample_bytes,
        "live_bytes": live_bytes,
        "attached_fraction": info.attached_fraction,
        "basis": info.budget.map(|_| info.basis().name()),
        "syscalls_in_slices": info.syscalls_in_slices,
        "syscalls": info.syscalls,
        "counted_own_ns": info.counted_own_ns,
        "ns_per_hit": info.ns_per_hit,
        "ns_per_hit_measured": info.ns_per_hit_measured,
        "estimated_overhead": info.estimated_overhead,
        "probes": info.probes,
    })
}

/// What every probe of phaseprof cost the targets, measured from the cpu samples in its tower:
/// ns and standard error in all and by mechanism (null with fewer than MIN_OWN_SAMPLES), and
/// the samples they come from.
fn probe_cost_json(profile: &Profile) -> Option<serde_json::Value> {
    let cost = profile.probe_cost()?;
    let (s, cpu) = (cost.samples, cost.target_cpu_ns);
    let ns = |own: u64| {
        let m = (own >= crate::probe_cost::MIN_OWN_SAMPLES)
            .then(|| s.measured(own, cpu))
            .flatten();
        serde_json::json!({
            "samples": own,
            "ns": m.map(|m| m.0 as u64),
            "stderr_ns": m.map(|m| m.1 as u64),
        })
    };
    Some(serde_json::json!({
        "target_cpu_ns": cpu,
        "cpu_samples": s.all,
        "ns": cost.ns().0 as u64,
        "stderr_ns": cost.ns().1 as u64,
        "slowdown": cost.slowdown(),
        "switch_ns": cost.switch_ns,
        "sample_ns": cost.sample_ns,
        "syscall_slices_ns": cost.syscall_slices_ns,
        "sampled": ns(s.own()),
        "syscalls": ns(s.syscalls),
        "uprobes": ns(s.uprobes),
        "other": ns(s.other),
        "in_targets": profile.meta.targets_slowdown.map(|t| serde_json::json!({
            "unit": t.unit,
            "before": t.before,
            "during": t.during,
            "slowdown": t.slowdown(),
            "ns": t.extra_ns(),
        })),
    }))
}

/// What the phase probes cost: the model's figure, and the one measured from the cpu samples in
/// the probes' tower (null with too few), with the samples it comes from.
fn phase_probes_json(profile: &Profile, c: &crate::PhaseProbeCost) -> serde_json::Value {
    let s = profile.own_samples();
    let (own, all) = (s.uprobes, s.all);
    let measured = c.measured((own, all));
    serde_json::json!({
        "calls": c.calls,
        "switch_hits": c.switch_hits,
        "target_cpu_ns": c.target_cpu_ns,
        "model_ns": c.probe_ns,
        "measured_ns": measured.map(|m| m.0 as u64),
        "measured_stderr_ns": measured.map(|m| m.1 as u64),
        "cpu_samples_in_probes": own,
        "cpu_samples": all,
    })
}

/// One `phases` member per phase with exact kernel totals: named phases in config order, then
/// `(none)`. Values are inclusive of nested phases.
pub fn phase_summaries(profile: &Profile) -> Vec<serde_json::Value> {
    let order = (1..profile.phase_stats.len()).chain(std::iter::once(0));
    let shares = profile.phase_probe_shares();
    order
        .filter_map(|i| profile.phase_stats.get(i).map(|st| (i, st)))
        .map(|(i, st)| {
            let recorded = |k: EventKind, v: u64| profile.recorded(k).then_some(v);
            let per_call = |v: u64| {
                if st.calls == 0 {
                    0.0
                } else {
                    v as f64 / st.calls as f64
                }
            };
            let per_call_costs: BTreeMap<&String, f64> =
                st.costs.iter().map(|(k, v)| (k, per_call(*v))).collect();
            serde_json::json!({
                "name": profile.phase_name(i as u32),
                "calls": st.calls,
                "wall_ns": {
                    "total": st.wall_ns,
                    "p50": st.wall_quantile(0.50),
                    "p95": st.wall_quantile(0.95),
                    "p99": st.wall_quantile(0.99),
                    "max": st.wall_max_ns,
                },
                "cpu_ns": st.cpu_ns,
                "offcpu_ns": st.offcpu_ns,
                "cpu_wait_ns": st.cpu_wait_ns,
                "gowait_ns": st.gowait_ns,
                "syscalls": st.syscalls,
                "syscall_ns": st.syscall_ns,
                // Recorded by `--events pagefault` / `alloc` only: null means "not recorded".
                "page_faults": recorded(EventKind::Pagefault, st.page_faults),
                "alloc_bytes": recorded(EventKind::Alloc, st.alloc_bytes),
                "allocs": recorded(EventKind::Alloc, st.allocs),
                "frees": recorded(EventKind::Alloc, st.frees),
                "costs": with_unmeasured_costs(&st.costs),
                "probes": phase_probes_inside_json(st, shares[i]),
                "per_call": {
                    "wall_ns": per_call(st.wall_ns),
                    "cpu_ns": per_call(st.cpu_ns),
                    "offcpu_ns": per_call(st.offcpu_ns),
                    "cpu_wait_ns": per_call(st.cpu_wait_ns),
                    "gowait_ns": per_call(st.gowait_ns),
                    "syscalls": per_call(st.syscalls),
                    "page_faults": per_call(st.page_faults),
                    "alloc_bytes": per_call(st.alloc_bytes),
                    "allocs": per_call(st.allocs),
                    "costs": per_call_costs,
                },
            })
        })
        .collect()
}

/// How much of a phase's times is phaseprof's probes, from its cpu samples: the share (null
/// with too few samples) and the phase's cpu and wall time without it.
fn phase_probes_inside_json(
    st: &crate::phase_stats::PhaseStats,
    share: crate::phase_probe_share::PhaseProbeShare,
) -> serde_json::Value {
    let without = share.without(st.cpu_ns, st.wall_ns);
    serde_json::json!({
        "cpu_samples": share.all,
        "cpu_samples_in_probes": share.in_probes,
        "share": share.share().map(|s| s.0),
        "share_stderr": share.share().map(|s| s.1),
        "cpu_ns_without": without.map(|w| w.0),
        "wall_ns_without": without.map(|w| w.1),
    })
}

/// The measured costs plus the built-in ones this profile could not measure, as null
/// (`clone_bytes` needs `--events alloc`).
fn with_unmeasured_costs(costs: &BTreeMap<String, u64>) -> BTreeMap<String, Option<u64>> {
    let mut all: BTreeMap<String, Option<u64>> =
        costs.iter().map(|(k, v)| (k.clone(), Some(*v))).collect();
    all.entry("clone_bytes".into()).or_insert(None);
    all
}

/// Each recorded event's `totals`: every value of each of its kinds summed, by kind and value
/// name as the kinds' table lists them (a value or an event added there shows here without
/// more code).
fn add_totals(profile: &Profile, events: &mut BTreeMap<String, serde_json::Value>) {
    for event in &profile.meta.events {
        let v = (events.entry(event.name().to_string())).or_insert_with(|| serde_json::json!({}));
        let kinds = KINDS.iter().filter(|k| k.event == *event);
        let totals: serde_json::Map<String, serde_json::Value> = kinds
            .map(|k| {
                let values = (k.values.iter().enumerate())
                    .map(|(i, v)| (v.name.to_string(), profile.total(k.kind, i).into()))
                    .collect::<serde_json::Map<_, _>>();
                (k.name.to_string(), values.into())
            })
            .collect();
        if let Some(o) = v.as_object_mut() {
            o.insert("totals".into(), totals.into());
        }
    }
}

/// Syscall count and time by name, over all phases and stacks.
pub fn syscalls_by_name(profile: &Profile) -> BTreeMap<String, CountNs> {
    let mut by_name: BTreeMap<String, CountNs> = BTreeMap::new();
    for s in profile.samples_of(SampleKind::Syscall) {
        let e = by_name.entry(s.syscall_name()).or_default();
        e.count = e.count.saturating_add(s.value(SYSCALL_COUNT));
        e.total_ns = e.total_ns.saturating_add(s.value(SYSCALL_NS));
    }
    by_name
}

/// A budget (phases', syscalls'): how much its slices saw, and by what its totals were scaled.
fn budget_json(b: &crate::BudgetInfo) -> serde_json::Value {
    serde_json::json!({
        "budget": b.budget,
        "coverage": b.coverage(),
        "slices": b.slices,
        "syscall": b.syscall,
        "syscalls_in_slices": b.syscalls_in_slices,
        "syscalls": b.syscalls,
        "reads_in_slices": b.reads_in_slices,
        "error": b.error(),
        "reads": b.reads,
        "read_bytes_in_slices": b.read_bytes_in_slices,
        "read_bytes": b.read_bytes,
        "reads_aligned": b.reads_aligned,
        "cpu_coverage": b.cpu_coverage(),
        "shortest_slice_ns": b.shortest_slice_ns,
        "counted_ns": b.counted_ns,
        "calls_voided": b.calls_voided,
        "carried_windows": b.carried_windows,
        "basis": b.basis().name(),
        "overhead_while_attached": b.overhead_while_attached,
        "slowdown_measured": b.slowdown_measured,
        "estimated": !b.attached_throughout,
        "totals_doubtful": b.totals_doubtful(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::PhaseAt;

    // Checks the JSON shape PRODUCT.md promises: members present, flush cost from write+fsync.
    #[test]
    fn json_has_the_contract_members() {
        let mut b = crate::ProfileBuilder::new(
            Meta {
                pids: vec![7],
                events: vec![EventKind::Cpu, EventKind::Offcpu, EventKind::Syscall],
                frequency_hz: 99,
                start_unix_ns: 10,
                end_unix_ns: 110,
                ..Meta::default()
            },
            vec![],
        );
        b.add(
            Sample::new(SampleKind::Syscall, (7, 7), PhaseAt::NONE, vec![4, 400])
                .on(None)
                .syscall(1),
        ); // write
        b.add(
            Sample::new(SampleKind::Syscall, (7, 7), PhaseAt::NONE, vec![1, 100])
                .on(None)
                .syscall(74),
        ); // fsync
        b.add(
            Sample::new(SampleKind::Syscall, (7, 7), PhaseAt::NONE, vec![2, 10])
                .on(None)
                .syscall(0),
        ); // read
        let json = serde_json::to_value(Summary::of(&b.finish())).unwrap();
        assert_eq!(json["version"], 1);
        assert_eq!(json["duration_ns"], 100);
        assert_eq!(json["events"]["syscall"]["count"], 7);
        assert_eq!(json["events"]["syscall"]["by_name"]["write"]["count"], 4);
        assert_eq!(json["events"]["cpu"]["frequency_hz"], 99);
        assert_eq!(json["events"]["offcpu"]["total_ns"], 0);
        assert!(json["events"].get("alloc").is_none());
        assert_eq!(json["costs"]["flush_syscalls"], 5);
        assert_eq!(json["phases"], serde_json::json!([]));
        assert_eq!(json["lost"]["events"], 0);
    }
}
