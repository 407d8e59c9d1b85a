//! The embedded store's reads: window lists, bodies, merged sums (rollups where whole
//! buckets fit, windows' own rows for the rest) and per-window sums for diffs.
use std::collections::{BTreeMap, HashSet};

use rusqlite::{params, Connection, OptionalExtension};

use super::{backend, int, labelset_list};
use crate::rows::{packed, plan, Aggregate, Dictionary, Merged, References, HOUR_NS, MINUTE_NS};
use crate::store::{LabelSet, Selector, StoreError, WindowInfo};

/// The label sets `sel` matches, with their labels.
fn labelsets(c: &Connection, sel: &Selector) -> Result<BTreeMap<u64, String>, StoreError> {
    let mut s = c
        .prepare_cached("SELECT id, labels FROM labelsets")
        .map_err(backend)?;
    let all: Vec<(u64, String)> = s
        .query_map([], |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)))
        .map_err(backend)?
        .collect::<Result<_, _>>()
        .map_err(backend)?;
    let wanted: HashSet<u64> = sel.matching_labelsets(&all)?.into_iter().collect();
    Ok(all
        .into_iter()
        .filter(|(id, _)| wanted.contains(id))
        .collect())
}

pub fn windows(c: &Connection, sel: &Selector) -> Result<Vec<WindowInfo>, StoreError> {
    let sets = labelsets(c, sel)?;
    if sets.is_empty() {
        return Ok(vec![]);
    }
    let ids: Vec<u64> = sets.keys().copied().collect();
    let mut s = c
        .prepare(&format!(
            "SELECT id, agent, labelset, start_ns, end_ns, bytes FROM windows \
             WHERE start_ns >= ?1 AND start_ns < ?2 AND labelset IN ({}) ORDER BY start_ns, id",
            labelset_list(&ids)
        ))
        .map_err(backend)?;
    let rows = s
        .query_map(
            params![int(sel.from_ns.min(i64::MAX as u64)), int(sel.to())],
            |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)? as u64,
                    r.get::<_, i64>(3)? as u64,
                    r.get::<_, i64>(4)? as u64,
                    r.get::<_, i64>(5)? as usize,
                ))
            },
        )
        .map_err(backend)?;
    let mut out = Vec::new();
    for row in rows {
        let (id, agent, set, start_ns, end_ns, bytes) = row.map_err(backend)?;
        let labels =
            serde_json::from_str(&sets[&set]).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        out.push(WindowInfo {
            id,
            agent,
            labels,
            start_ns,
            end_ns,
            bytes,
        });
    }
    Ok(out)
}

pub fn label_sets(c: &Connection, sel: &Selector) -> Result<Vec<LabelSet>, StoreError> {
    let sets = labelsets(c, sel)?;
    if sets.is_empty() {
        return Ok(vec![]);
    }
    let ids: Vec<u64> = sets.keys().copied().collect();
    let mut s = c
        .prepare(&format!(
            "SELECT labelset, count(*), min(start_ns), max(end_ns) FROM windows \
             WHERE start_ns >= ?1 AND start_ns < ?2 AND labelset IN ({}) GROUP BY labelset",
            labelset_list(&ids)
        ))
        .map_err(backend)?;
    let rows = s
        .query_map(
            params![int(sel.from_ns.min(i64::MAX as u64)), int(sel.to())],
            |r| {
                Ok((
                    r.get::<_, i64>(0)? as u64,
                    r.get::<_, i64>(1)? as u64,
                    r.get::<_, i64>(2)? as u64,
                    r.get::<_, i64>(3)? as u64,
                ))
            },
        )
        .map_err(backend)?;
    let mut out = Vec::new();
    for row in rows {
        let (set, windows, start_ns, end_ns) = row.map_err(backend)?;
        out.push(LabelSet {
            labels: serde_json::from_str(&sets[&set])
                .map_err(|e| StoreError::Corrupt(e.to_string()))?,
            windows,
            start_ns,
            end_ns,
        });
    }
    Ok(out)
}

pub fn body(c: &Connection, id: i64) -> Result<Option<Vec<u8>>, StoreError> {
    c.query_row("SELECT body FROM bodies WHERE id = ?1", params![id], |r| {
        r.get(0)
    })
    .optional()
    .map_err(backend)
}

/// Each packed row of `sql` (its parameters: from, to) absorbed by `f`.
fn each_packed(
    c: &Connection,
    sql: &str,
    (from, to): (u64, u64),
    mut f: impl FnMut(&[u8]) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let mut s = c.prepare(sql).map_err(backend)?;
    let mut rows = s
        .query(params![
            int(from.min(i64::MAX as u64)),
            int(to.min(i64::MAX as u64))
        ])
        .map_err(backend)?;
    while let Some(r) = rows.next().map_err(backend)? {
        let bytes = r
            .get_ref(0)
            .map_err(backend)?
            .as_blob()
            .map_err(|e| StoreError::Corrupt(format!("a stored row is not a blob: {e}")))?;
        f(bytes)?;
    }
    Ok(())
}

pub fn merged(c: &Connection, sel: &Selector) -> Result<Merged, StoreError> {
    let sets = labelsets(c, sel)?;
    let mut agg = Aggregate::default();
    if sets.is_empty() {
        return Ok(Merged::default());
    }
    let list = labelset_list(&sets.keys().copied().collect::<Vec<_>>());
    let p = plan(sel.from_ns, sel.to());
    for (level, ranges) in [(HOUR_NS, &p.hours), (MINUTE_NS, &p.minutes)] {
        let sql = format!(
            "SELECT rows FROM rollups WHERE level = {} AND labelset IN ({list}) \
             AND bucket >= ?1 AND bucket < ?2",
            int(level)
        );
        for &range in ranges {
            each_packed(c, &sql, range, |b| packed::absorb(&mut agg, b))?;
        }
    }
    let sql = format!(
        "SELECT rows FROM windows WHERE start_ns >= ?1 AND start_ns < ?2 AND labelset IN ({list})"
    );
    for &range in &p.raw {
        each_packed(c, &sql, range, |b| packed::absorb(&mut agg, b))?;
    }
    let dict = dictionary(c, &[&agg])?;
    Ok(Merged { agg, dict })
}

pub fn per_window(
    c: &Connection,
    sel: &Selector,
) -> Result<(Vec<Aggregate>, Dictionary), StoreError> {
    let sets = labelsets(c, sel)?;
    if sets.is_empty() {
        return Ok(Default::default());
    }
    let list = labelset_list(&sets.keys().copied().collect::<Vec<_>>());
    let sql = format!(
        "SELECT rows FROM windows WHERE start_ns >= ?1 AND start_ns < ?2 \
         AND labelset IN ({list}) ORDER BY start_ns, id"
    );
    let mut aggs = Vec::new();
    each_packed(c, &sql, (sel.from_ns, sel.to()), |b| {
        let mut a = Aggregate::default();
        packed::absorb(&mut a, b)?;
        aggs.push(a);
        Ok(())
    })?;
    let dict = dictionary(c, &aggs.iter().collect::<Vec<_>>())?;
    Ok((aggs, dict))
}

/// The stacks, names and phase sets `aggs` refer to.
fn dictionary(c: &Connection, aggs: &[&Aggregate]) -> Result<Dictionary, StoreError> {
    let mut d = Dictionary::default();
    let References {
        stacks,
        phasesets: sets,
        mut names,
    } = References::of(aggs);
    let get = |sql: &str, id: u64| -> Result<Option<Vec<u8>>, StoreError> {
        c.prepare_cached(sql)
            .and_then(|mut s| s.query_row(params![int(id)], |r| r.get(0)).optional())
            .map_err(backend)
    };
    let mut maps = HashSet::new();
    for id in stacks {
        if let Some(b) = get("SELECT frames FROM stacks WHERE id = ?1", id)? {
            let s = packed::decode_stack(&b)?;
            names.extend(&s.functions);
            maps.extend(s.mappings.iter().copied());
            d.stacks.insert(id, s);
        }
    }
    for id in sets {
        if let Some(b) = get("SELECT phases FROM phasesets WHERE id = ?1", id)? {
            let set: Vec<u64> = (b.chunks_exact(8))
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect();
            names.extend(&set);
            d.phasesets.insert(id, set);
        }
    }
    let text = |sql: &str, id: u64| -> Result<Option<String>, StoreError> {
        c.prepare_cached(sql)
            .and_then(|mut s| s.query_row(params![int(id)], |r| r.get(0)).optional())
            .map_err(backend)
    };
    for id in names {
        if let Some(n) = text("SELECT name FROM functions WHERE id = ?1", id)? {
            d.functions.insert(id, n);
        }
    }
    for id in maps {
        if let Some(n) = text("SELECT name FROM mappings WHERE id = ?1", id)? {
            d.mappings.insert(id, n);
        }
    }
    Ok(d)
}
