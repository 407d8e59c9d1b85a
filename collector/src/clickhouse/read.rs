//! Reads from ClickHouse: window lists, bodies, and merged or per-window sums computed by
//! GROUP BY in the server (hour and minute rollups where whole buckets fit, raw rows at the
//! edges), with the dictionary rows they refer to.
use std::collections::{BTreeMap, HashMap, HashSet};

use phaseprof_model::phase_stats::PhaseStats;

use super::columns::{self, KEY};
use super::http::Http;
use super::rowbinary::RowReader;
use crate::rows::{
    plan, Aggregate, Dictionary, Head, Merged, References, SampleKey, SampleVals, StackRow,
};
use crate::store::{LabelSet, Selector, StoreError, WindowInfo};

/// Ids per `IN (…)` list: a query stays well under ClickHouse's 256 KiB `max_query_size`.
const IDS_PER_QUERY: usize = 5000;

fn rows(http: &Http, query: &str) -> Result<Vec<u8>, StoreError> {
    http.run(&format!("{query} FORMAT RowBinary"), None)
}

fn list(ids: &[u64]) -> String {
    ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

/// The selection as a WHERE clause on a table with `labelset` and a time column, None when
/// no label set matches.
fn label_filter(http: &Http, t: &str, sel: &Selector) -> Result<Option<String>, StoreError> {
    let reply = rows(
        http,
        &format!("SELECT DISTINCT id, labels FROM {t}_labelsets"),
    )?;
    let mut r = RowReader(&reply);
    let mut sets = Vec::new();
    while !r.is_empty() {
        sets.push((r.u64()?, r.string()?));
    }
    let ids = sel.matching_labelsets(&sets)?;
    Ok((!ids.is_empty()).then(|| format!("labelset IN ({})", list(&ids))))
}

fn ranges(column: &str, rs: &[(u64, u64)]) -> String {
    if rs.is_empty() {
        return "0".into();
    }
    let parts: Vec<String> = (rs.iter())
        .map(|(a, b)| format!("({column} >= {a} AND {column} < {b})"))
        .collect();
    format!("({})", parts.join(" OR "))
}

pub fn windows(http: &Http, t: &str, sel: &Selector) -> Result<Vec<WindowInfo>, StoreError> {
    let Some(labels) = label_filter(http, t, sel)? else {
        return Ok(vec![]);
    };
    let reply = rows(
        http,
        &format!(
            "SELECT id, agent, labels, start_ns, end_ns, bytes FROM {t} WHERE {labels} AND {} \
             ORDER BY start_ns, id",
            ranges("start_ns", &[(sel.from_ns, sel.to())])
        ),
    )?;
    let mut r = RowReader(&reply);
    let mut v = Vec::new();
    while !r.is_empty() {
        let (id, agent) = (r.i64()?, r.string()?);
        let labels: BTreeMap<String, String> =
            serde_json::from_str(&r.string()?).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let (start_ns, end_ns, bytes) = (r.u64()?, r.u64()?, r.u64()? as usize);
        v.push(WindowInfo {
            id,
            agent,
            labels,
            start_ns,
            end_ns,
            bytes,
        });
    }
    Ok(v)
}

pub fn label_sets(http: &Http, t: &str, sel: &Selector) -> Result<Vec<LabelSet>, StoreError> {
    let Some(labels) = label_filter(http, t, sel)? else {
        return Ok(vec![]);
    };
    let reply = rows(
        http,
        &format!(
            "SELECT any(labels), count(), min(start_ns), max(end_ns) FROM {t} \
             WHERE {labels} AND {} GROUP BY labelset",
            ranges("start_ns", &[(sel.from_ns, sel.to())])
        ),
    )?;
    let mut r = RowReader(&reply);
    let mut v = Vec::new();
    while !r.is_empty() {
        let labels =
            serde_json::from_str(&r.string()?).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        v.push(LabelSet {
            labels,
            windows: r.u64()?,
            start_ns: r.u64()?,
            end_ns: r.u64()?,
        });
    }
    Ok(v)
}

pub fn body(http: &Http, t: &str, id: i64) -> Result<Option<Vec<u8>>, StoreError> {
    let reply = rows(
        http,
        &format!("SELECT body FROM {t} WHERE id = {id} LIMIT 1"),
    )?;
    let mut r = RowReader(&reply);
    if r.is_empty() {
        return Ok(None);
    }
    r.bytes().map(Some)
}

fn read_sample(r: &mut RowReader) -> Result<(SampleKey, SampleVals), StoreError> {
    let key = SampleKey {
        kind: r.u8()?,
        pid: r.u32()?,
        phase: r.u64()?,
        phaseset: r.u64()?,
        stack: r.u64()?,
        nr: r.u32()?,
    };
    let mut vals = SampleVals::default();
    for v in &mut vals.0 {
        *v = r.u64()?;
    }
    Ok((key, vals.with_float_count(key.kind, r.f64()?)))
}

/// The windows table's part of an aggregate, per window (`by_window`) or for all: counts,
/// span, events, the earliest head, counters.
fn window_sums(
    http: &Http,
    t: &str,
    filter: &str,
    by_window: bool,
) -> Result<HashMap<i64, Aggregate>, StoreError> {
    let (group, id) = if by_window {
        ("GROUP BY id", "id")
    } else {
        ("", "toInt64(0)")
    };
    let reply = rows(
        http,
        &format!(
            "SELECT {id}, count(), min(start_ns), max(end_ns), groupBitOr(events), \
             argMin(head, start_ns) FROM {t} WHERE {filter} {group}"
        ),
    )?;
    let mut out: HashMap<i64, Aggregate> = HashMap::new();
    let mut r = RowReader(&reply);
    while !r.is_empty() {
        let (w, n, start, end, events) = (r.i64()?, r.u64()?, r.u64()?, r.u64()?, r.u8()?);
        let head: Option<Head> = serde_json::from_slice(&r.bytes()?).unwrap_or_default();
        if n == 0 {
            continue;
        }
        let a = out.entry(w).or_default();
        a.absorb_window_stats(n, start, end, events);
        if let Some(h) = &head {
            a.offer_head(h);
        }
    }
    let id = if by_window { "id" } else { "toInt64(0)" };
    let reply = rows(
        http,
        &format!(
            "SELECT {id} AS w, name, sum(value) FROM {t} ARRAY JOIN counter_names AS name, \
             counter_values AS value WHERE {filter} GROUP BY w, name"
        ),
    )?;
    let mut r = RowReader(&reply);
    while !r.is_empty() {
        let (w, name, v) = (r.i64()?, r.string()?, r.u64()?);
        out.entry(w).or_default().add_counter(&name, v);
    }
    Ok(out)
}

/// Per-phase totals, per window or for all.
fn phase_sums(
    http: &Http,
    t: &str,
    filter: &str,
    by_window: bool,
    out: &mut HashMap<i64, Aggregate>,
) -> Result<(), StoreError> {
    let w = if by_window { "window" } else { "toInt64(0)" };
    // Rows of listed windows only: an attempt that failed before its window was stored left
    // rows under an id no window has (see `write`).
    let filter = format!("{filter} AND window IN (SELECT id FROM {t} WHERE {filter})");
    let reply = rows(
        http,
        &format!(
            "SELECT {w} AS w, phase, sum(calls), sum(wall_ns), max(wall_max_ns), \
             sumMap(hist_idx, hist_n), sum(cpu_ns), sum(offcpu_ns), sum(gowait_ns), \
             sum(syscalls), sum(syscall_ns), sum(alloc_bytes), sum(allocs), sum(frees), \
             sum(page_faults), sum(cpu_wait_ns) FROM {t}_phase_stats WHERE {filter} GROUP BY w, phase"
        ),
    )?;
    let mut r = RowReader(&reply);
    while !r.is_empty() {
        let (w, phase) = (r.i64()?, r.u64()?);
        let (calls, wall_ns, wall_max_ns) = (r.u64()?, r.u64()?, r.u64()?);
        let (idx, n) = (r.u32s()?, r.u64s()?);
        let s = PhaseStats {
            calls,
            wall_ns,
            wall_max_ns,
            wall_hist: idx.into_iter().zip(n).collect(),
            cpu_ns: r.u64()?,
            offcpu_ns: r.u64()?,
            gowait_ns: r.u64()?,
            syscalls: r.u64()?,
            syscall_ns: r.u64()?,
            costs: BTreeMap::new(),
            alloc_bytes: r.u64()?,
            allocs: r.u64()?,
            frees: r.u64()?,
            page_faults: r.u64()?,
            cpu_wait_ns: r.u64()?,
        };
        out.entry(w).or_default().add_phase_stats(phase, &s);
    }
    let reply = rows(
        http,
        &format!(
            "SELECT {w} AS w, phase, name, sum(value) FROM {t}_phase_stats ARRAY JOIN \
             cost_names AS name, cost_values AS value WHERE {filter} GROUP BY w, phase, name"
        ),
    )?;
    let mut r = RowReader(&reply);
    while !r.is_empty() {
        let (w, phase, name, v) = (r.i64()?, r.u64()?, r.string()?, r.u64()?);
        let mut s = PhaseStats::default();
        s.costs.insert(name, v);
        out.entry(w).or_default().add_phase_stats(phase, &s);
    }
    Ok(())
}

pub fn merged(http: &Http, t: &str, sel: &Selector) -> Result<Merged, StoreError> {
    let Some(labels) = label_filter(http, t, sel)? else {
        return Ok(Merged::default());
    };
    let whole = format!(
        "{labels} AND {}",
        ranges("start_ns", &[(sel.from_ns, sel.to())])
    );
    let mut parts = window_sums(http, t, &whole, false)?;
    phase_sums(http, t, &whole, false, &mut parts)?;
    let mut agg = parts.remove(&0).unwrap_or_default();
    let p = plan(sel.from_ns, sel.to());
    let (values, sums) = (columns::list(), columns::saturating_sums());
    let reply = rows(
        http,
        &format!(
            "SELECT {KEY}, {sums} FROM (\
               SELECT {KEY}, {values} FROM {t}_samples_1h \
                 WHERE {labels} AND {} \
               UNION ALL SELECT {KEY}, {values} FROM {t}_samples_1m \
                 WHERE {labels} AND {} \
               UNION ALL SELECT {KEY}, {values} FROM {t}_samples \
                 WHERE {labels} AND {}) GROUP BY {KEY}",
            ranges("t", &p.hours),
            ranges("t", &p.minutes),
            ranges("start_ns", &p.raw)
        ),
    )?;
    let mut r = RowReader(&reply);
    while !r.is_empty() {
        let (k, v) = read_sample(&mut r)?;
        agg.add_sample(k, &v);
    }
    let dict = dictionary(http, t, &[&agg])?;
    Ok(Merged { agg, dict })
}

pub fn per_window(
    http: &Http,
    t: &str,
    sel: &Selector,
) -> Result<(Vec<Aggregate>, Dictionary), StoreError> {
    let Some(labels) = label_filter(http, t, sel)? else {
        return Ok(Default::default());
    };
    let filter = format!(
        "{labels} AND {}",
        ranges("start_ns", &[(sel.from_ns, sel.to())])
    );
    let mut by = window_sums(http, t, &filter, true)?;
    phase_sums(http, t, &filter, true, &mut by)?;
    let reply = rows(
        http,
        &format!(
            "SELECT window, {KEY}, {} FROM {t}_samples WHERE {filter} GROUP BY window, {KEY}",
            columns::saturating_sums()
        ),
    )?;
    let mut r = RowReader(&reply);
    while !r.is_empty() {
        let w = r.i64()?;
        let (k, v) = read_sample(&mut r)?;
        by.entry(w).or_default().add_sample(k, &v);
    }
    let mut aggs: Vec<Aggregate> = by.into_values().filter(|a| a.windows > 0).collect();
    aggs.sort_by_key(|a| a.start_ns);
    let dict = dictionary(http, t, &aggs.iter().collect::<Vec<_>>())?;
    Ok((aggs, dict))
}

/// Runs `query` (with `{ids}` for an id list) over `ids` in chunks, calling `f` per reply.
fn by_ids(
    http: &Http,
    ids: &HashSet<u64>,
    query: impl Fn(&str) -> String,
    mut f: impl FnMut(&mut RowReader) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let ids: Vec<u64> = ids.iter().copied().collect();
    for chunk in ids.chunks(IDS_PER_QUERY) {
        let reply = rows(http, &query(&list(chunk)))?;
        let mut r = RowReader(&reply);
        while !r.is_empty() {
            f(&mut r)?;
        }
    }
    Ok(())
}

/// The stacks, names and phase sets `aggs` refer to.
fn dictionary(http: &Http, t: &str, aggs: &[&Aggregate]) -> Result<Dictionary, StoreError> {
    let mut d = Dictionary::default();
    let References {
        stacks,
        phasesets: sets,
        mut names,
    } = References::of(aggs);
    let mut maps = HashSet::new();
    let q = |ids: &str| {
        format!("SELECT id, functions, mappings, flags FROM {t}_stacks WHERE id IN ({ids})")
    };
    by_ids(http, &stacks, q, |r| {
        let id = r.u64()?;
        let s = StackRow {
            functions: r.u64s()?,
            mappings: r.u64s()?,
            flags: r.u8s()?,
        };
        names.extend(&s.functions);
        maps.extend(&s.mappings);
        d.stacks.insert(id, s);
        Ok(())
    })?;
    let q = |ids: &str| format!("SELECT id, phases FROM {t}_phasesets WHERE id IN ({ids})");
    by_ids(http, &sets, q, |r| {
        let (id, set) = (r.u64()?, r.u64s()?);
        names.extend(&set);
        d.phasesets.insert(id, set);
        Ok(())
    })?;
    for (table, ids, into) in [
        ("functions", &names, &mut d.functions),
        ("mappings", &maps, &mut d.mappings),
    ] {
        let q = |l: &str| format!("SELECT id, name FROM {t}_{table} WHERE id IN ({l})");
        by_ids(http, ids, q, |r| {
            into.insert(r.u64()?, r.string()?);
            Ok(())
        })?;
    }
    Ok(d)
}
