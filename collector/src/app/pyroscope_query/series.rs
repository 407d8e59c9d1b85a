//! Pyroscope's time series (`SelectSeries`): one kind's total per step, per group of label
//! values (and per phase, grouped by `phase`). Each point is the store's merged sum of the
//! windows starting in its step, so a step of a minute on whole minutes reads the minute
//! rollups, and every point is what `/api/v1/merged` says for that range.
use std::collections::{BTreeMap, BTreeSet};

use phaseprof_model::{EventKind, Profile};

use super::messages::{LabelPair, Point, SelectSeriesRequest, SelectSeriesResponse, Series};
use super::{invalid, kind_of, pyroscope_name, store_error, store_name, ConnectError, Query};
use crate::app::AppState;
use crate::rows::rebuild;
use crate::store::Selector;

/// Store reads one request may make (points × groups): an hour at a 1 s step, or a day of
/// minutes for a few groups. Beyond it the request is refused and told to widen its step.
const MAX_READS: usize = 4_000;

pub(super) fn select_series(
    s: &AppState,
    q: SelectSeriesRequest,
) -> Result<SelectSeriesResponse, ConnectError> {
    let kind = kind_of(&q.profile_type_id)?;
    let query = Query::of(std::slice::from_ref(&q.label_selector), q.start, q.end)?;
    let step_ms = (q.step * 1000.0).round() as i64;
    if step_ms < 1000 || q.end <= q.start || q.start <= 0 {
        return Err(invalid(format!(
            "SelectSeries: needs a start and an end (ms, start < end) and a step of at least 1 s (got start {}, end {}, step {} s)",
            q.start, q.end, q.step
        )));
    }
    let average = match q.aggregation.unwrap_or(0) {
        0 => false,
        1 => true,
        other => {
            return Err(invalid(format!(
                "SelectSeries: aggregation {other}: 0 (sum) or 1 (average)"
            )))
        }
    };
    // Steps on multiples of the step since the epoch (whole minutes for a minute's step), cut
    // to the requested range.
    let first = q.start / step_ms * step_ms;
    let steps: Vec<(i64, i64, i64)> = (0..)
        .map(|i| first + i * step_ms)
        .take_while(|&t| t < q.end)
        .map(|t| (t, t.max(q.start), (t + step_ms).min(q.end)))
        .collect();
    let by_phase = q.group_by.iter().any(|g| g == "phase");
    let group_names: BTreeSet<&str> = (q.group_by.iter())
        .filter(|g| *g != "phase")
        .map(|g| store_name(g))
        .collect();
    let groups: BTreeSet<BTreeMap<String, String>> = (query.label_sets(s)?.into_iter())
        .map(|mut l| {
            l.retain(|k, _| group_names.contains(k.as_str()));
            l
        })
        .collect();
    let reads = steps.len().saturating_mul(groups.len());
    if reads > MAX_READS {
        return Err(invalid(format!(
            "SelectSeries: {} steps × {} groups is over {MAX_READS} points: widen the step or the selection",
            steps.len(),
            groups.len()
        )));
    }
    let mut series: BTreeMap<Vec<(String, String)>, Vec<Point>> = BTreeMap::new();
    for group in groups {
        let mut sel = query.selector.clone();
        sel.labels.extend(group.clone());
        let labels: Vec<(String, String)> = group.into_iter().collect();
        for &(t, from, to) in &steps {
            sel.from_ns = ms_to_ns(from);
            sel.to_ns = ms_to_ns(to);
            let Some((p, windows)) = merged(s, &sel)? else {
                continue;
            };
            let per = if average { windows as f64 } else { 1.0 };
            let mut point = |labels: Vec<(String, String)>, value: u64| {
                let value = value as f64 / per;
                let points = series.entry(labels).or_default();
                points.push(Point {
                    value,
                    timestamp: t,
                });
            };
            if by_phase {
                for (i, name) in p.phases.iter().enumerate() {
                    let mut labels = labels.clone();
                    labels.push(("phase".into(), name.clone()));
                    labels.sort();
                    point(labels, total(&p, kind, Some(i as u32)));
                }
            } else {
                point(labels.clone(), total(&p, kind, query.phase_in(&p)?));
            }
        }
    }
    let mut series: Vec<Series> = (series.into_iter())
        .map(|(labels, points)| Series {
            labels: (labels.into_iter())
                .map(|(name, value)| LabelPair {
                    name: pyroscope_name(&name).to_string(),
                    value,
                })
                .collect(),
            points,
        })
        .collect();
    if let Some(limit) = q.limit.filter(|&l| l > 0) {
        let sum = |s: &Series| -> f64 { s.points.iter().map(|p| p.value).sum() };
        series.sort_by(|a, b| sum(b).total_cmp(&sum(a)));
        series.truncate(limit as usize);
    }
    Ok(SelectSeriesResponse { series })
}

/// The windows `sel` selects merged by the store, and how many; None if none.
fn merged(s: &AppState, sel: &Selector) -> Result<Option<(Profile, u64)>, ConnectError> {
    let m = s.store.merged(sel).map_err(store_error)?;
    if m.agg.windows == 0 {
        return Ok(None);
    }
    Ok(Some((rebuild(&m.agg, &m.dict), m.agg.windows)))
}

/// `kind`'s total in `p` (in `phase`), as its flame graph counts it.
fn total(p: &Profile, kind: EventKind, phase: Option<u32>) -> u64 {
    p.weighted_stacks(kind, phase).iter().map(|w| w.value).sum()
}

fn ms_to_ns(ms: i64) -> u64 {
    (ms.max(0) as u64).saturating_mul(1_000_000)
}
