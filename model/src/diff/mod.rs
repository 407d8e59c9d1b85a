//! `diff`: two sets of runs (A, the baseline, and B) compared metric by metric — per phase per
//! call, and over the whole recording per second — with the difference's confidence interval
//! (Holm over the metrics) and a verdict that says whether the change is real, stack by stack
//! (`stacks`), and with warnings when the two sides are not comparable.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::Serialize;

use crate::kinds::KINDS;
use crate::profile::{EventKind, Profile};
use crate::stats::{
    bootstrap, holm_levels, interval, mean_sd, p_value, skewness, verdict, Difference, Estimate,
    Method, Verdict,
};
use crate::summary::Summary;

mod per_call;
mod stacks;

pub use per_call::CallDist;
pub use stacks::StackChange;

/// The row name of whole-recording metrics.
pub const TOTAL: &str = "(total)";

/// Options of a comparison.
#[derive(Clone, Debug)]
pub struct DiffOptions {
    /// Family-wise confidence level (Holm over the metrics compared, and over each kind's stacks).
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

/// What a metric's values measure.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    Ns,
    Bytes,
    Count,
}

/// What a metric's values are per: a phase's call, a second of the recording, or a run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Per {
    Call,
    Second,
    Run,
}

/// The unit of metric `name` (costs are counts unless named in ns or bytes).
pub fn unit_of(name: &str) -> Unit {
    if name.ends_with("_ns") {
        Unit::Ns
    } else if name.contains("bytes") {
        Unit::Bytes
    } else {
        Unit::Count
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct MetricDiff {
    pub phase: String,
    pub metric: String,
    pub unit: Unit,
    pub per: Per,
    pub a: Side,
    pub b: Side,
    /// B − A with its interval (at this metric's Holm level).
    pub diff: Difference,
    /// Two-sided p-value of B − A; None when not judged.
    pub p: Option<f64>,
    /// (B − A) / A; None when A is 0.
    pub relative: Option<f64>,
    #[serde(flatten)]
    pub verdict: Verdict,
}

#[derive(Clone, Debug, Serialize)]
pub struct DiffReport {
    pub a_runs: usize,
    pub b_runs: usize,
    pub confidence: f64,
    /// Metrics judged together (Holm's family).
    pub compared: usize,
    pub threshold: f64,
    /// Why the two sides may not compare: different programs, phases on one side only, …
    pub warnings: Vec<String>,
    pub metrics: Vec<MetricDiff>,
    pub stacks: Vec<StackChange>,
}

/// Every metric of one profile: (phase or TOTAL, metric) → value. Phase metrics are per call,
/// for phases with calls; whole-recording totals per second (runs of different lengths compare),
/// but `duration_ns`.
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
    let seconds = p.duration_ns() as f64 / 1e9;
    m.insert((TOTAL.into(), "duration_ns".into()), p.duration_ns() as f64);
    let mut put = |phase: &str, metric: &str, v: f64| {
        if seconds > 0.0 {
            m.insert((phase.to_string(), metric.to_string()), v / seconds);
        }
    };
    // The values the kinds' table names as metrics, for the events recorded.
    for k in KINDS.iter().filter(|k| p.recorded(k.event)) {
        for (i, v) in k.values.iter().enumerate() {
            if let Some(metric) = v.metric {
                put(TOTAL, metric, p.total(k.kind, i) as f64);
            }
        }
    }
    for (cost, v) in &s.costs {
        if let Some(v) = v {
            put(TOTAL, cost, *v as f64);
        }
    }
    m
}

/// The `Per` of a metric row.
fn per_of(phase: &str, metric: &str) -> Per {
    match (phase == TOTAL, metric) {
        (_, "calls") | (true, "duration_ns") => Per::Run,
        (true, _) => Per::Second,
        (false, _) => Per::Call,
    }
}

/// What a diff needs of one run: its metrics, its phases' per-call wall distributions, per
/// event kind it recorded each stack's share, and what it ran. Much smaller than the profile,
/// so many runs (a fleet's stored windows) can be compared by decoding one at a time.
#[derive(Clone, Debug)]
pub struct RunDigest {
    metrics: BTreeMap<(String, String), f64>,
    walls: BTreeMap<String, CallDist>,
    shares: Vec<(EventKind, HashMap<String, f64>)>,
    program: String,
    phases: BTreeSet<String>,
}

impl RunDigest {
    pub fn of(p: &Profile) -> Self {
        let named = p.phase_stats.iter().enumerate().skip(1);
        let walls = named
            .clone()
            .filter_map(|(i, st)| Some((p.phase_name(i as u32).to_string(), CallDist::of(st)?)))
            .collect();
        let program = std::path::Path::new(&p.meta.exe)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| p.meta.comm.clone());
        RunDigest {
            metrics: metrics(p),
            walls,
            shares: EventKind::ALL
                .into_iter()
                .filter(|&k| p.recorded(k))
                .map(|k| (k, stacks::stack_shares(p, k)))
                .collect(),
            program,
            phases: p.phases.iter().skip(1).cloned().collect(),
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

/// Why the sides may not compare.
fn warnings(a: &[RunDigest], b: &[RunDigest]) -> Vec<String> {
    let mut out = Vec::new();
    let programs = |runs: &[RunDigest]| -> BTreeSet<String> {
        runs.iter()
            .map(|r| r.program.clone())
            .filter(|p| !p.is_empty())
            .collect()
    };
    let (pa, pb) = (programs(a), programs(b));
    if !pa.is_empty() && !pb.is_empty() && pa != pb {
        let list = |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(", ");
        out.push(format!(
            "different programs: A ran {}, B ran {}; stacks and totals may not compare",
            list(&pa),
            list(&pb)
        ));
    }
    let phases = |runs: &[RunDigest]| -> BTreeSet<String> {
        runs.iter().flat_map(|r| r.phases.iter().cloned()).collect()
    };
    let (fa, fb) = (phases(a), phases(b));
    match (fa.is_empty(), fb.is_empty()) {
        (false, true) => {
            out.push("A was recorded with phases and B without: only totals compare".into())
        }
        (true, false) => {
            out.push("B was recorded with phases and A without: only totals compare".into())
        }
        _ => {
            let only = |x: &BTreeSet<String>, y: &BTreeSet<String>| {
                x.difference(y).cloned().collect::<Vec<_>>().join(", ")
            };
            let (oa, ob) = (only(&fa, &fb), only(&fb, &fa));
            if !oa.is_empty() || !ob.is_empty() {
                out.push(format!(
                    "the sides' phases differ (only in A: {}; only in B: {})",
                    if oa.is_empty() { "none" } else { &oa },
                    if ob.is_empty() { "none" } else { &ob }
                ));
            }
        }
    }
    out
}

/// One metric's two estimates: per-call wall time from the calls (see `per_call`), everything
/// else over runs.
fn estimates(
    a: &[RunDigest],
    b: &[RunDigest],
    key: &(String, String),
    xa: &[f64],
    xb: &[f64],
) -> (Estimate, Estimate, bool) {
    if key.1 == "wall_ns" && key.0 != TOTAL {
        let walls = |runs: &[RunDigest]| -> Option<Vec<CallDist>> {
            runs.iter().map(|r| r.walls.get(&key.0).copied()).collect()
        };
        if let (Some(wa), Some(wb)) = (walls(a), walls(b)) {
            return (per_call::estimate(&wa), per_call::estimate(&wb), true);
        }
    }
    (Estimate::of_runs(xa), Estimate::of_runs(xb), false)
}

/// `diff` of runs already digested.
pub fn diff_digests(a: &[RunDigest], b: &[RunDigest], opts: &DiffOptions) -> DiffReport {
    let ma: Vec<_> = a.iter().map(|r| &r.metrics).collect();
    let mb: Vec<_> = b.iter().map(|r| &r.metrics).collect();
    let keys: BTreeSet<&(String, String)> = ma.iter().chain(&mb).flat_map(|m| m.keys()).collect();
    let values = |ms: &[&BTreeMap<(String, String), f64>], k: &(String, String)| -> Vec<f64> {
        ms.iter().filter_map(|m| m.get(k).copied()).collect()
    };
    struct Row<'k> {
        key: &'k (String, String),
        xa: Vec<f64>,
        xb: Vec<f64>,
        ea: Estimate,
        eb: Estimate,
        calls: bool,
    }
    let rows: Vec<Row> = keys
        .into_iter()
        .filter_map(|key| {
            let (xa, xb) = (values(&ma, key), values(&mb, key));
            if xa.is_empty() || xb.is_empty() {
                return None;
            }
            let (ea, eb, calls) = estimates(a, b, key, &xa, &xb);
            Some(Row {
                key,
                xa,
                xb,
                ea,
                eb,
                calls,
            })
        })
        .collect();
    // `calls` is context, not a cost: shown, never judged.
    let judged: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].key.1 != "calls")
        .collect();
    let ps: Vec<f64> = judged
        .iter()
        .map(|&i| p_value(&rows[i].ea, &rows[i].eb))
        .collect();
    let alpha = 1.0 - opts.confidence;
    let mut level = vec![alpha; rows.len()];
    let mut p_of = vec![None; rows.len()];
    for ((&i, l), p) in judged.iter().zip(holm_levels(&ps, alpha)).zip(&ps) {
        level[i] = l;
        p_of[i] = Some(*p);
    }
    let n = a.len().min(b.len());
    let mut metrics = Vec::new();
    for (i, row) in rows.into_iter().enumerate() {
        let skewed = |xs: &[f64]| skewness(xs).abs() > 1.0;
        let d = if !row.calls
            && row.xa.len().min(row.xb.len()) >= crate::stats::MIN_BOOTSTRAP_RUNS
            && (skewed(&row.xa) || skewed(&row.xb))
        {
            bootstrap(&row.xa, &row.xb, level[i])
        } else {
            let mut d = interval(&row.ea, &row.eb, level[i]);
            if row.calls {
                d.method = Method::Calls;
            }
            d
        };
        let (sa, sb) = (side(&row.xa), side(&row.xb));
        let scale = if sa.mean != 0.0 {
            sa.mean.abs()
        } else {
            sb.mean.abs()
        };
        let (phase, metric) = row.key;
        let v = if metric == "calls" {
            Verdict::Context
        } else {
            verdict(&d, n, opts.threshold * scale)
        };
        metrics.push(MetricDiff {
            phase: phase.clone(),
            metric: metric.clone(),
            unit: unit_of(metric),
            per: per_of(phase, metric),
            relative: (sa.mean != 0.0).then(|| d.delta / sa.mean),
            a: sa,
            b: sb,
            diff: d,
            p: p_of[i],
            verdict: v,
        });
    }
    // Named phases first, the whole recording last.
    metrics.sort_by_key(|m| (m.phase == TOTAL, m.phase.clone()));
    DiffReport {
        a_runs: a.len(),
        b_runs: b.len(),
        confidence: opts.confidence,
        compared: judged.len(),
        threshold: opts.threshold,
        warnings: warnings(a, b),
        metrics,
        stacks: stacks::stack_changes(a, b, opts),
    }
}

fn side(xs: &[f64]) -> Side {
    let (mean, sd) = mean_sd(xs);
    Side {
        mean,
        sd,
        n: xs.len(),
    }
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

    /// A run of one phase whose `calls` calls took `fast` or `slow` ns (`slow_calls` of them).
    fn wall_run(calls: u64, slow_calls: u64, fast: u64, slow: u64) -> Profile {
        let mut p = run(1, 0);
        let bucket = |ns: u64| {
            (0..2000u32)
                .find(|&i| {
                    let (lo, hi) = crate::phase_stats::wall_bucket_bounds(i);
                    lo <= ns && ns < hi
                })
                .unwrap()
        };
        let st = &mut p.phase_stats[1];
        st.calls = calls;
        st.wall_ns = (calls - slow_calls) * fast + slow_calls * slow;
        st.wall_hist = vec![
            (bucket(fast), calls - slow_calls),
            (bucket(slow), slow_calls),
        ];
        p
    }

    // Checks the case: a phase whose calls are noisy (1 or 19 ms, 40 a run) doubles its
    // wall time (2 or 38 ms), 3 runs a side. Over the 3 run means alone Welch has ~3 degrees of
    // freedom and Holm's level over the metrics leaves it inconclusive; over the 120 calls a side
    // it is `regressed`, with an interval excluding zero.
    #[test]
    fn doubled_wall_over_three_runs_is_regressed() {
        let ms = 1_000_000;
        let a: Vec<_> = [20, 17, 23].map(|k| wall_run(40, k, ms, 19 * ms)).into();
        let b: Vec<_> = [20, 23, 17]
            .map(|k| wall_run(40, k, 2 * ms, 38 * ms))
            .into();
        let r = diff(&a, &b, &DiffOptions::default());
        let wall = find(&r, "finalize", "wall_ns");
        assert_eq!(wall.verdict, Verdict::Regressed, "{wall:?}");
        assert_eq!(wall.diff.method, Method::Calls);
        assert!(wall.diff.low > 0.0);
        // The same runs judged over run means only: not decided.
        let means = |runs: &[Profile]| -> Vec<f64> {
            runs.iter()
                .map(|p| p.phase_stats[1].wall_ns as f64 / p.phase_stats[1].calls as f64)
                .collect()
        };
        let by_runs = crate::stats::welch(&means(&a), &means(&b), 0.05 / r.compared as f64);
        assert!(by_runs.low < 0.0, "{by_runs:?}");
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
