//! Batches of windows into ClickHouse, each table one INSERT per batch, exactly once however a
//! batch fails. ClickHouse has no transactions, so the order does the work:
//!
//! 1. the dictionary rows not known to be stored (ReplacingMergeTree by content: a repeat is
//!    harmless);
//! 2. sample rows into `T_staging` and phase totals into `T_phase_stats`, under the window's
//!    id, fresh for every attempt: rows of an attempt that failed are never read;
//! 3. the windows themselves: from here a window is stored, listed and read (phase totals are
//!    read only for listed windows), and a retry of its idempotency key finds it;
//! 4. promotion: its staged samples copied into `T_samples` by one INSERT … SELECT (whose
//!    materialized views feed the rollups), unless they are there already (a copy whose answer
//!    was lost), then a mark in `T_promoted`.
//!
//! A batch failing after step 3 is answered with the error; the agent's retry finds its
//! windows stored and promotes what is not, and so does the next batch after any failure
//! (`recover`), for windows whose agent never came back.
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

use super::http::{quoted, Http};
use super::rowbinary::*;
use crate::rows::{self, SampleKey, Stored, Table};
use crate::store::{Inserted, NewWindow, StoreError};

pub struct Writer {
    http: Http,
    table: String,
    stored: Arc<Stored>,
    /// A batch failed since the last `recover`: windows may be stored and not promoted.
    unsure: std::sync::atomic::AtomicBool,
}

/// How far back `recover` looks for windows stored and not promoted.
const RECOVER_NS: u64 = 2 * 24 * crate::rows::HOUR_NS;

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A fresh id: ClickHouse has no sequences, and collectors sharing a table must not collide.
/// 63 random bits (std's per-process random hasher keys, fed the time and a counter).
fn new_id() -> i64 {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    (h.finish() >> 1) as i64
}

/// One INSERT's data per table.
#[derive(Default)]
struct Tables {
    windows: Vec<u8>,
    samples: Vec<u8>,
    phase_stats: Vec<u8>,
    dict: [Vec<u8>; 5],
}

const DICT_TABLES: [&str; 5] = ["labelsets", "functions", "mappings", "stacks", "phasesets"];

impl Writer {
    pub fn new(http: Http, table: &str, stored: Arc<Stored>) -> Self {
        Writer {
            http,
            table: table.to_string(),
            stored,
            // A collector killed mid-batch left no note: look once at start.
            unsure: std::sync::atomic::AtomicBool::new(true),
        }
    }

    pub fn write(&self, batch: Vec<NewWindow>) -> Vec<Result<Inserted, StoreError>> {
        use std::sync::atomic::Ordering;
        let n = batch.len();
        let mut added = Vec::new();
        if self.unsure.load(Ordering::Relaxed) && self.recover().is_ok() {
            self.unsure.store(false, Ordering::Relaxed);
        }
        match self.insert(batch, &mut added) {
            Ok(r) => {
                self.stored.add(added);
                r
            }
            Err(e) => {
                self.unsure.store(true, Ordering::Relaxed);
                (0..n).map(|_| Err(e.duplicate())).collect()
            }
        }
    }

    /// Promotes the windows of the last RECOVER_NS stored and not promoted.
    pub fn recover(&self) -> Result<(), StoreError> {
        let t = &self.table;
        let since = now_ns().saturating_sub(RECOVER_NS);
        let reply = self.http.run(
            &format!(
                "SELECT id, labelset, start_ns FROM {t} WHERE start_ns >= {since} AND id NOT IN \
                 (SELECT id FROM {t}_promoted WHERE start_ns >= {since}) FORMAT RowBinary"
            ),
            None,
        )?;
        let mut r = RowReader(&reply);
        let mut todo = Vec::new();
        while !r.is_empty() {
            todo.push((r.i64()?, r.u64()?, r.u64()?));
        }
        for chunk in todo.chunks(256) {
            self.promote(chunk)?;
        }
        Ok(())
    }

    /// Step 4 for stored windows (id, labelset, start_ns): staged samples copied into
    /// T_samples unless a copy is there already (found by its sort key and id), then marked.
    fn promote(&self, windows: &[(i64, u64, u64)]) -> Result<(), StoreError> {
        if windows.is_empty() {
            return Ok(());
        }
        let t = &self.table;
        let ids = |w: &[(i64, u64, u64)]| {
            w.iter()
                .map(|(id, _, _)| id.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let marked = self.ids(&format!(
            "SELECT id FROM {t}_promoted WHERE id IN ({})",
            ids(windows)
        ))?;
        let todo: Vec<_> = windows
            .iter()
            .filter(|w| !marked.contains(&w.0))
            .copied()
            .collect();
        if todo.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = todo.iter().map(|(_, l, s)| format!("({l},{s})")).collect();
        let copied = self.ids(&format!(
            "SELECT DISTINCT window FROM {t}_samples WHERE (labelset, start_ns) IN ({}) \
             AND window IN ({})",
            keys.join(","),
            ids(&todo)
        ))?;
        let copy: Vec<_> = todo
            .iter()
            .filter(|w| !copied.contains(&w.0))
            .copied()
            .collect();
        if !copy.is_empty() {
            self.http.run(
                &format!(
                    "INSERT INTO {t}_samples SELECT * FROM {t}_staging WHERE window IN ({})",
                    ids(&copy)
                ),
                None,
            )?;
        }
        let mut marks = Vec::new();
        for (id, _, start) in &todo {
            put_i64(&mut marks, *id);
            put_u64(&mut marks, *start);
        }
        self.insert_into(&format!("{t}_promoted"), &marks)
    }

    /// The Int64 ids a query returns.
    fn ids(&self, query: &str) -> Result<HashSet<i64>, StoreError> {
        let reply = self.http.run(&format!("{query} FORMAT RowBinary"), None)?;
        let mut r = RowReader(&reply);
        let mut out = HashSet::new();
        while !r.is_empty() {
            out.insert(r.i64()?);
        }
        Ok(out)
    }

    /// Ids of windows stored before under the batch's keys, by (agent, key).
    fn stored_keys(
        &self,
        batch: &[NewWindow],
    ) -> Result<HashMap<(String, String), i64>, StoreError> {
        let keys: Vec<String> = batch
            .iter()
            .filter_map(|w| w.key.as_deref().map(quoted))
            .collect();
        let mut out = HashMap::new();
        if keys.is_empty() {
            return Ok(out);
        }
        let reply = self.http.run(
            &format!(
                "SELECT agent, idem, id FROM {} WHERE idem IN ({}) FORMAT RowBinary",
                self.table,
                keys.join(",")
            ),
            None,
        )?;
        let mut r = RowReader(&reply);
        while !r.is_empty() {
            let (agent, key, id) = (r.string()?, r.string()?, r.i64()?);
            out.entry((agent, key)).or_insert(id);
        }
        Ok(out)
    }

    fn insert(
        &self,
        batch: Vec<NewWindow>,
        added: &mut Vec<(Table, u64)>,
    ) -> Result<Vec<Result<Inserted, StoreError>>, StoreError> {
        let mut stored = self.stored_keys(&batch)?;
        let mut t = Tables::default();
        let mut out = Vec::with_capacity(batch.len());
        // Every window of the batch stored by the end of step 3, new or found (a retry).
        let mut windows = Vec::with_capacity(batch.len());
        // Rows several windows of the batch carry go in once.
        let mut fresh: HashSet<(Table, u64)> = HashSet::new();
        for w in &batch {
            let pair = w.key.clone().map(|k| (w.agent.clone(), k));
            if let Some(id) = pair.as_ref().and_then(|p| stored.get(p)) {
                windows.push((*id, w.rows.labelset, w.rows.start_ns));
                out.push(Ok(Inserted {
                    id: *id,
                    duplicate: true,
                }));
                continue;
            }
            let id = new_id();
            if let Some(p) = pair {
                stored.insert(p, id);
            }
            let mut new =
                |table: Table, key: u64| !self.stored.has(table, key) && fresh.insert((table, key));
            put_dictionary(&mut t, &w.rows, &mut new);
            put_rows(&mut t, id, &w.rows);
            put_window(&mut t, id, w);
            windows.push((id, w.rows.labelset, w.rows.start_ns));
            out.push(Ok(Inserted {
                id,
                duplicate: false,
            }));
        }
        let tb = &self.table;
        for (i, name) in DICT_TABLES.iter().enumerate() {
            self.insert_into(&format!("{tb}_{name}"), &t.dict[i])?;
        }
        self.insert_into(&format!("{tb}_staging"), &t.samples)?;
        self.insert_into(&format!("{tb}_phase_stats"), &t.phase_stats)?;
        self.insert_into(
            &format!(
                "{tb} (id, agent, labels, start_ns, end_ns, bytes, body, idem, labelset, events, \
                 head, counter_names, counter_values, rows)"
            ),
            &t.windows,
        )?;
        self.promote(&windows)?;
        added.extend(fresh);
        Ok(out)
    }

    fn insert_into(&self, table: &str, data: &[u8]) -> Result<(), StoreError> {
        if data.is_empty() {
            return Ok(());
        }
        self.http
            .run(&format!("INSERT INTO {table} FORMAT RowBinary"), Some(data))
            .map(|_| ())
    }
}

fn put_dictionary(t: &mut Tables, r: &rows::WindowRows, new: &mut impl FnMut(Table, u64) -> bool) {
    if new(Table::Labelsets, r.labelset) {
        put_u64(&mut t.dict[0], r.labelset);
        put_string(&mut t.dict[0], r.labels.as_bytes());
    }
    for (table, i, names) in [
        (Table::Functions, 1, &r.dict.functions),
        (Table::Mappings, 2, &r.dict.mappings),
    ] {
        for (id, name) in names {
            if new(table, *id) {
                put_u64(&mut t.dict[i], *id);
                put_string(&mut t.dict[i], name.as_bytes());
            }
        }
    }
    for (id, s) in &r.dict.stacks {
        if new(Table::Stacks, *id) {
            let d = &mut t.dict[3];
            put_u64(d, *id);
            put_u64s(d, &s.functions);
            put_u64s(d, &s.mappings);
            put_string(d, &s.flags);
        }
    }
    for (id, set) in &r.dict.phasesets {
        if new(Table::Phasesets, *id) {
            put_u64(&mut t.dict[4], *id);
            put_u64s(&mut t.dict[4], set);
        }
    }
}

fn put_key(out: &mut Vec<u8>, k: &SampleKey) {
    out.push(k.kind);
    out.extend_from_slice(&k.pid.to_le_bytes());
    put_u64(out, k.phase);
    put_u64(out, k.phaseset);
    put_u64(out, k.stack);
    out.extend_from_slice(&k.nr.to_le_bytes());
}

fn put_rows(t: &mut Tables, id: i64, r: &rows::WindowRows) {
    for (k, v) in &r.agg.samples {
        let s = &mut t.samples;
        put_u64(s, r.labelset);
        put_u64(s, r.start_ns);
        put_i64(s, id);
        put_key(s, k);
        for &n in &v.0 {
            put_u64(s, n);
        }
        // fvalue: only rows of the first layout have one (see `columns`).
        put_u64(s, 0f64.to_bits());
    }
    for (phase, s) in &r.agg.phase_stats {
        let o = &mut t.phase_stats;
        put_u64(o, r.labelset);
        put_u64(o, r.start_ns);
        put_i64(o, id);
        put_u64(o, *phase);
        for v in [s.calls, s.wall_ns, s.wall_max_ns] {
            put_u64(o, v);
        }
        put_len(o, s.wall_hist.len());
        for (i, _) in &s.wall_hist {
            o.extend_from_slice(&i.to_le_bytes());
        }
        put_u64s(o, &s.wall_hist.iter().map(|(_, n)| *n).collect::<Vec<_>>());
        for v in [s.cpu_ns, s.offcpu_ns, s.gowait_ns, s.syscalls, s.syscall_ns] {
            put_u64(o, v);
        }
        put_len(o, s.costs.len());
        for k in s.costs.keys() {
            put_string(o, k.as_bytes());
        }
        put_u64s(o, &s.costs.values().copied().collect::<Vec<_>>());
        for v in [
            s.alloc_bytes,
            s.allocs,
            s.frees,
            s.page_faults,
            s.cpu_wait_ns,
        ] {
            put_u64(o, v);
        }
    }
}

fn put_window(t: &mut Tables, id: i64, w: &NewWindow) {
    let (o, r) = (&mut t.windows, &w.rows);
    put_i64(o, id);
    put_string(o, w.agent.as_bytes());
    put_string(o, r.labels.as_bytes());
    put_u64(o, r.start_ns);
    put_u64(o, r.end_ns);
    put_u64(o, w.body.len() as u64);
    put_string(o, &w.body);
    put_string(o, w.key.as_deref().unwrap_or("").as_bytes());
    put_u64(o, r.labelset);
    o.push(r.agg.events);
    let head = serde_json::to_vec(&r.agg.head).unwrap_or_default();
    put_string(o, &head);
    put_len(o, r.agg.counters.len());
    for k in r.agg.counters.keys() {
        put_string(o, k.as_bytes());
    }
    put_u64s(o, &r.agg.counters.values().copied().collect::<Vec<_>>());
    put_u64(o, r.agg.samples.len() as u64);
}

/// Stores as rows the windows a first-layout collector kept as bodies only (their `head` is
/// empty): re-inserted with their rows under new ids, then the old rows deleted.
pub fn migrate(http: &Http, t: &str, writer: &Writer) -> Result<(), StoreError> {
    let old = http.number(&format!("SELECT count() FROM {t} WHERE head = ''"))?;
    if old == 0 {
        return Ok(());
    }
    let reply = http.run(
        &format!("SELECT agent, idem, body FROM {t} WHERE head = '' ORDER BY start_ns, id FORMAT RowBinary"),
        None,
    )?;
    let mut r = RowReader(&reply);
    let mut batch = Vec::new();
    while !r.is_empty() {
        // Their keys are dropped: the old rows still hold them until the deletion is applied.
        let (agent, _key, body) = (r.string()?, r.string()?, r.bytes()?);
        batch.push(NewWindow::from_body(&agent, None, body, &writer.stored)?);
    }
    http.run(&format!("ALTER TABLE {t} DELETE WHERE head = ''"), None)?;
    while !batch.is_empty() {
        let rest = batch.split_off(batch.len().min(super::BATCH_ROWS));
        for res in writer.write(std::mem::replace(&mut batch, rest)) {
            res?;
        }
    }
    Ok(())
}
