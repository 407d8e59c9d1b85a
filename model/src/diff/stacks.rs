//! Stack by stack: how each stack's share of an event kind changed, whole stacks (root to leaf),
//! ranked by effect size (the change in share points) among those whose change is significant
//! (Welch over runs, Holm over the stacks of a kind), then the rest by effect size — so a sparse
//! stack seen in one run, with no spread to speak of, does not float to the top.
use std::collections::{BTreeSet, HashMap};

use serde::Serialize;

use super::{DiffOptions, RunDigest};
use crate::profile::{EventKind, Profile};
use crate::stats::{holm_levels, interval, p_value, Difference, Estimate};

/// How one stack's share of an event kind changed.
#[derive(Clone, Debug, Serialize)]
pub struct StackChange {
    pub event: EventKind,
    /// Frames root first, `;`-separated (as folded stacks).
    pub stack: String,
    pub a_share: f64,
    pub b_share: f64,
    /// B − A (share points as a fraction), its interval at the stack's Holm level.
    pub diff: Difference,
    /// |delta| / standard error (infinite for a change with no spread); None with one run.
    pub t: Option<f64>,
    /// Two-sided p-value of the change; None with one run a side.
    pub p: Option<f64>,
    /// Significant after Holm's correction over this kind's stacks.
    pub significant: bool,
}

/// A frame as diffs compare it: an unsymbolized address differs from run to run (ASLR), so
/// every `[unknown]+0x…` is one `[unknown]`.
fn comparable(frame: &str) -> String {
    if frame.starts_with("[unknown]") {
        "[unknown]".into()
    } else {
        crate::folded_frame_name(frame)
    }
}

/// Folded stack → share of the kind's total, for one profile.
pub(super) fn stack_shares(p: &Profile, kind: EventKind) -> HashMap<String, f64> {
    let mut by: HashMap<String, f64> = HashMap::new();
    let mut total = 0.0;
    for w in p.weighted_stacks(kind, None) {
        total += w.value as f64;
        let names: Vec<String> = (p.names_root_first(&w).iter())
            .map(|n| comparable(n))
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

/// Per event kind recorded by every run, the `top_stacks` stacks that changed: significant ones
/// by effect size first.
pub(super) fn stack_changes(
    a: &[RunDigest],
    b: &[RunDigest],
    opts: &DiffOptions,
) -> Vec<StackChange> {
    let alpha = 1.0 - opts.confidence;
    let replicated = a.len() > 1 && b.len() > 1;
    let mut out = Vec::new();
    for kind in EventKind::ALL {
        let sa: Option<Vec<_>> = a.iter().map(|r| r.shares(kind)).collect();
        let sb: Option<Vec<_>> = b.iter().map(|r| r.shares(kind)).collect();
        let (Some(sa), Some(sb)) = (sa, sb) else {
            continue; // not recorded by every run
        };
        let stacks: BTreeSet<&String> = sa.iter().chain(&sb).flat_map(|m| m.keys()).collect();
        let get = |ms: &[&HashMap<String, f64>], s: &String| -> Vec<f64> {
            ms.iter()
                .map(|m| m.get(s).copied().unwrap_or(0.0))
                .collect()
        };
        let rows: Vec<(&String, Estimate, Estimate)> = stacks
            .into_iter()
            .map(|s| {
                (
                    s,
                    Estimate::of_runs(&get(&sa, s)),
                    Estimate::of_runs(&get(&sb, s)),
                )
            })
            // Under 0.1% on both sides: not worth a row.
            .filter(|(_, ea, eb)| ea.mean.max(eb.mean) >= 0.001)
            .collect();
        let ps: Vec<f64> = rows.iter().map(|(_, ea, eb)| p_value(ea, eb)).collect();
        let levels = holm_levels(&ps, alpha);
        let mut changes: Vec<StackChange> = rows
            .iter()
            .zip(ps.iter().zip(&levels))
            .map(|((s, ea, eb), (&p, &level))| {
                let diff = interval(ea, eb, level);
                let se = (ea.se * ea.se + eb.se * eb.se).sqrt();
                let t = replicated.then(|| match (se > 0.0, diff.delta == 0.0) {
                    (true, _) => diff.delta.abs() / se,
                    (false, true) => 0.0,
                    (false, false) => f64::INFINITY,
                });
                StackChange {
                    event: kind,
                    stack: (*s).clone(),
                    a_share: ea.mean,
                    b_share: eb.mean,
                    diff,
                    t,
                    p: replicated.then_some(p),
                    significant: replicated && p <= level && diff.delta != 0.0,
                }
            })
            .collect();
        changes.sort_by(|x, y| {
            y.significant
                .cmp(&x.significant)
                .then(y.diff.delta.abs().total_cmp(&x.diff.delta.abs()))
                .then(x.stack.cmp(&y.stack))
        });
        out.extend(changes.into_iter().take(opts.top_stacks));
    }
    out
}
