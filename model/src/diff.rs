//! `diff`: two sets of runs (A, the baseline, and B) compared metric by metric — per phase per
//! call, and over the whole recording — with the difference's confidence interval and a verdict
//! that says whether the change is real, and stack by stack, ranked by significance.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::profile::{EventKind, Profile};
use crate::stats::{difference, mean_sd, verdict, Difference, Verdict};
use crate::summary::Summary;

/// The row name of whole-recording metrics.
pub const TOTAL: &str = "(total)";

/// Options of a comparison.
#[derive(Clone, Debug)]
pub struct DiffOptions {
    /// Family-wise confidence level of the intervals (Bonferroni over the metrics compared).
    pub confidence: f64,
    /// Relative change below which a difference is noise, whatever its significance.
    pub threshold: f64,
    /// Stack changes kept per event kind.
    pub top_stacks: usize,
}

impl Default for DiffOptions {
    fn default() -> Self {
        DiffOptions {
            confidence: 0.95,
            threshold: 0.01,
            top_stacks: 10,
        }
    }
}

/// One side's values of a metric.
#[derive(Clone, Debug, Serialize)]
pub struct Side {
    pub mean: f64,
    pub sd: f64,
    pub n: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct MetricDiff {
    pub phase: String,
    pub metric: String,
    pub a: Side,
    pub b: Side,
    /// B − A with its interval.
    pub diff: Difference,
    /// (B − A) / A; None when A is 0.
    pub relative: Option<f64>,
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// How one stack's share of an event kind changed.
#[derive(Clone, Debug, Serialize)]
pub struct StackChange {
    pub event: EventKind,
    /// Frames root first, `;`-separated (as folded stacks).
    pub stack: String,
    pub a_share: f64,
    pub b_share: f64,
    pub diff: Difference,
    /// |delta| / standard error (infinite for a change with no spread); None with one run.
    pub t: Option<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct DiffReport {
    pub a_runs: usize,
    pub b_runs: usize,
    pub confidence: f64,
    /// Each interval is at 1 − (1 − confidence) / compared, so all hold together.
    pub compared: usize,
    pub threshold: f64,
    pub metrics: Vec<MetricDiff>,
    pub stacks: Vec<StackChange>,
}

/// Every metric of one profile: (phase or TOTAL, metric) → value. Phase metrics are per call
/// (runs of different lengths compare), for phases with calls.
pub fn metrics(p: &Profile) -> BTreeMap<(String, String), f64> {
    let mut m = BTreeMap::new();
    let mut put = |phase: &str, metric: &str, v: f64| {
        m.insert((phase.to_string(), metric.to_string()), v);
    };
    let alloc = p.recorded(EventKind::Alloc);
    let faults = p.recorded(EventKind::Pagefault);
    for (i, st) in p.phase_stats.iter().enumerate().skip(1) {
        if st.calls == 0 {
            continue;
        }
        let name = p.phase_name(i as u32);
        let per = |v: u64| v as f64 / st.calls as f64;
        put(name, "calls", st.calls as f64);
        put(name, "wall_ns", per(st.wall_ns));
        put(name, "cpu_ns", per(st.cpu_ns));
        put(name, "offcpu_ns", per(st.offcpu_ns));
        put(name, "syscalls", per(st.syscalls));
        put(name, "syscall_ns", per(st.syscall_ns));
        if alloc {
            put(name, "alloc_bytes", per(st.alloc_bytes));
            put(name, "allocs", per(st.allocs));
        }
        if faults {
            put(name, "page_faults", per(st.page_faults));
        }
        for (cost, v) in &st.costs {
            put(name, cost, per(*v));
        }
    }
    let s = Summary::of(p);
    put(TOTAL, "duration_ns", p.duration_ns() as f64);
    let num = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_f64());
    if let Some(v) = s.events.get("cpu").and_then(|e| num(e, "samples")) {
        put(TOTAL, "cpu_samples", v);
    }
    if let Some(v) = s.events.get("offcpu").and_then(|e| num(e, "total_ns")) {
        put(TOTAL, "offcpu_ns", v);
    }
    if let Some(v) = s.events.get("syscall").and_then(|e| num(e, "count")) {
        put(TOTAL, "syscalls", v);
    }
    if let Some(e) = s.events.get("alloc") {
        put(TOTAL, "alloc_bytes", num(e, "bytes").unwrap_or(0.0));
        put(TOTAL, "allocs", num(e, "count").unwrap_or(0.0));
    }
    if let Some(v) = s.events.get("pagefault").and_then(|e| num(e, "count")) {
        put(TOTAL, "page_faults", v);
    }
    for (cost, v) in &s.costs {
        if let Some(v) = v {
            put(TOTAL, cost, *v as f64);
        }
    }
    m
}

/// Folded stack → share of the kind's total, for one profile.
fn stack_shares(p: &Profile, kind: EventKind) -> HashMap<String, f64> {
    let mut by: HashMap<String, f64> = HashMap::new();
    let mut total = 0.0;
    for w in p.weighted_stacks(kind, None) {
        total += w.value as f64;
        let names: Vec<String> = (p.names_root_first(&w).iter())
            .map(|n| crate::folded_frame_name(n))
            .collect();
        *by.entry(names.join(";")).or_default() += w.value as f64;
    }
    if total > 0.0 {
        for v in by.values_mut() {
            *v /= total;
        }
    }
    by
}

fn side(xs: &[f64]) -> Side {
    let (mean, sd) = mean_sd(xs);
    Side {
        mean,
        sd,
        n: xs.len(),
    }
}

/// What a diff needs of one run: its metrics and, per event kind it recorded, each stack's
/// share. Much smaller than the profile, so many runs (a fleet's stored windows) can be
/// compared by decoding one profile at a time and keeping only this.
#[derive(Clone, Debug)]
pub struct RunDigest {
    metrics: BTreeMap<(String, String), f64>,
    shares: Vec<(EventKind, HashMap<String, f64>)>,
}

impl RunDigest {
    pub fn of(p: &Profile) -> Self {
        RunDigest {
            metrics: metrics(p),
            shares: EventKind::ALL
                .into_iter()
                .filter(|&k| p.recorded(k))
                .map(|k| (k, stack_shares(p, k)))
                .collect(),
        }
    }

    fn shares(&self, kind: EventKind) -> Option<&HashMap<String, f64>> {
        self.shares.iter().find(|(k, _)| *k == kind).map(|(_, s)| s)
    }
}

/// Compares runs `a` (baseline) with runs `b`.
pub fn diff(a: &[Profile], b: &[Profile], opts: &DiffOptions) -> DiffReport {
    let digest = |runs: &[Profile]| runs.iter().map(RunDigest::of).collect::<Vec<_>>();
    diff_digests(&digest(a), &digest(b), opts)
}

/// `diff` of runs already digested.
pub fn diff_digests(a: &[RunDigest], b: &[RunDigest], opts: &DiffOptions) -> DiffReport {
    let ma: Vec<_> = a.iter().map(|r| &r.metrics).collect();
    let mb: Vec<_> = b.iter().map(|r| &r.metrics).collect();
    let keys: BTreeSet<&(String, String)> = ma.iter().chain(&mb).flat_map(|m| m.keys()).collect();
    let values = |ms: &[&BTreeMap<(String, String), f64>], k: &(String, String)| -> Vec<f64> {
        ms.iter().filter_map(|m| m.get(k).copied()).collect()
    };
    // `calls` is context, not a cost: shown, never judged.
    let judged: Vec<&&(String, String)> = keys
        .iter()
        .filter(|k| k.1 != "calls" && !values(&ma, k).is_empty() && !values(&mb, k).is_empty())
        .collect();
    let compared = judged.len().max(1);
    let alpha = (1.0 - opts.confidence) / compared as f64;
    let n = a.len().min(b.len());
    let mut metrics = Vec::new();
    for k in keys {
        let (xa, xb) = (values(&ma, k), values(&mb, k));
        if xa.is_empty() || xb.is_empty() {
            continue;
        }
        let d = difference(&xa, &xb, alpha);
        let (sa, sb) = (side(&xa), side(&xb));
        let scale = if sa.mean != 0.0 {
            sa.mean.abs()
        } else {
            sb.mean.abs()
        };
        let v = if k.1 == "calls" {
            Verdict::Context
        } else {
            verdict(&d, n, opts.threshold * scale)
        };
        metrics.push(MetricDiff {
            phase: k.0.clone(),
            metric: k.1.clone(),
            relative: (sa.mean != 0.0).then(|| d.delta / sa.mean),
            a: sa,
            b: sb,
            diff: d,
            verdict: v,
        });
    }
    // Named phases first, the whole recording last.
    metrics.sort_by_key(|m| (m.phase == TOTAL, m.phase.clone()));
    DiffReport {
        a_runs: a.len(),
        b_runs: b.len(),
        confidence: opts.confidence,
        compared,
        threshold: opts.threshold,
        metrics,
        stacks: stack_changes(a, b, opts, alpha),
    }
}

/// Per event kind, the stacks whose share changed most significantly (|t|), or most (one run).
fn stack_changes(
    a: &[RunDigest],
    b: &[RunDigest],
    opts: &DiffOptions,
    alpha: f64,
) -> Vec<StackChange> {
    let mut out = Vec::new();
    for kind in EventKind::ALL {
        let sa: Option<Vec<_>> = a.iter().map(|r| r.shares(kind)).collect();
        let sb: Option<Vec<_>> = b.iter().map(|r| r.shares(kind)).collect();
        let (Some(sa), Some(sb)) = (sa, sb) else {
            continue; // not recorded by every run
        };
        let stacks: BTreeSet<&String> = sa.iter().chain(&sb).flat_map(|m| m.keys()).collect();
        let mut changes: Vec<StackChange> = stacks
            .into_iter()
            .filter_map(|s| {
                let get = |ms: &[&HashMap<String, f64>]| -> Vec<f64> {
                    ms.iter()
                        .map(|m| m.get(s).copied().unwrap_or(0.0))
                        .collect()
                };
                let (xa, xb) = (get(&sa), get(&sb));
                let (ma, sda) = mean_sd(&xa);
                let (mb, sdb) = mean_sd(&xb);
                if ma.max(mb) < 0.001 {
                    return None; // under 0.1% on both sides: not worth a row
                }
                let d = difference(&xa, &xb, alpha);
                let se = (sda * sda / xa.len() as f64 + sdb * sdb / xb.len() as f64).sqrt();
                let se = if se <= 1e-12 * ma.max(mb) { 0.0 } else { se };
                let t = (xa.len() > 1 && xb.len() > 1).then(|| {
                    if se == 0.0 {
                        if d.delta == 0.0 {
                            0.0
                        } else {
                            f64::INFINITY
                        }
                    } else {
                        d.delta.abs() / se
                    }
                });
                Some(StackChange {
                    event: kind,
                    stack: s.clone(),
                    a_share: ma,
                    b_share: mb,
                    diff: d,
                    t,
                })
            })
            .collect();
        changes.sort_by(|x, y| {
            let key = |c: &StackChange| (c.t.unwrap_or(0.0), c.diff.delta.abs());
            let (kx, ky) = (key(x), key(y));
            ky.0.total_cmp(&kx.0).then(ky.1.total_cmp(&kx.1))
        });
        out.extend(changes.into_iter().take(opts.top_stacks));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::phase_stats::PhaseStats;
    use crate::profile::Meta;

    fn run(flushes_per_call: u64, wall: u64) -> Profile {
        let mut p = Profile {
            meta: Meta {
                events: vec![EventKind::Syscall],
                start_unix_ns: 0,
                end_unix_ns: 1_000,
                ..Meta::default()
            },
            phases: vec!["(none)".into(), "finalize".into()],
            ..Profile::default()
        };
        let mut st = PhaseStats {
            calls: 10,
            wall_ns: wall * 10,
            ..PhaseStats::default()
        };
        st.costs
            .insert("flush_syscalls".into(), flushes_per_call * 10);
        p.phase_stats = vec![PhaseStats::default(), st];
        p
    }

    fn find<'a>(r: &'a DiffReport, phase: &str, metric: &str) -> &'a MetricDiff {
        r.metrics
            .iter()
            .find(|m| m.phase == phase && m.metric == metric)
            .unwrap()
    }

    // Checks that an exact per-call cost drop is `improved`, noise inside the threshold is not
    // judged a change, and `calls` is never judged.
    #[test]
    fn verdicts_per_phase_metric() {
        let a: Vec<_> = [1000, 1003, 998, 1001, 999].map(|w| run(100, w)).into();
        let b: Vec<_> = [1001, 999, 1000, 1002, 998].map(|w| run(25, w)).into();
        let r = diff(&a, &b, &DiffOptions::default());
        let flush = find(&r, "finalize", "flush_syscalls");
        assert_eq!(flush.verdict, Verdict::Improved);
        assert!(flush.diff.high < 0.0);
        assert_eq!(find(&r, "finalize", "wall_ns").verdict, Verdict::NoChange);
        assert_eq!(find(&r, "finalize", "calls").verdict, Verdict::Context);
        let same = diff(&a, &a, &DiffOptions::default());
        assert!(same
            .metrics
            .iter()
            .all(|m| !matches!(m.verdict, Verdict::Improved | Verdict::Regressed)));
    }
}
