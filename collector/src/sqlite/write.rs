//! The embedded store's writes: a batch of windows in one transaction, rollups updated in it,
//! retention, and the migration of stores made before windows were kept as rows.
use std::collections::HashMap;
use std::sync::Arc;

use rusqlite::{params, Connection, OptionalExtension};

use super::{backend, int};
use crate::rows::{packed, Aggregate, Dictionary, Stored, Table, HOUR_NS, MINUTE_NS};
use crate::store::{Inserted, NewWindow, StoreError};

pub struct Writer {
    conn: Connection,
    stored: Arc<Stored>,
}

/// Whether `conn` holds a store of the first layout (windows kept as bodies only).
pub fn is_old_layout(conn: &Connection) -> Result<bool, StoreError> {
    conn.prepare("SELECT 1 FROM pragma_table_info('windows') WHERE name = 'body'")
        .and_then(|mut s| s.exists([]))
        .map_err(backend)
}

impl Writer {
    pub fn new(conn: Connection, stored: Arc<Stored>) -> Self {
        Writer { conn, stored }
    }

    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    /// Stores `batch` in one transaction: one result per window, in order. A failure fails
    /// the whole batch (nothing of it is stored).
    pub fn write(&mut self, batch: Vec<NewWindow>) -> Vec<Result<Inserted, StoreError>> {
        let n = batch.len();
        let mut added = Vec::new();
        match self.transaction(batch, &mut added) {
            Ok(r) => {
                self.stored.add(added);
                r
            }
            Err(e) => (0..n).map(|_| Err(e.duplicate())).collect(),
        }
    }

    fn transaction(
        &mut self,
        batch: Vec<NewWindow>,
        added: &mut Vec<(Table, u64)>,
    ) -> Result<Vec<Result<Inserted, StoreError>>, StoreError> {
        let tx = self.conn.transaction().map_err(backend)?;
        let mut out = Vec::with_capacity(batch.len());
        let mut keys: HashMap<(String, String), i64> = HashMap::new();
        let mut rollups: HashMap<(u64, u64, u64), Aggregate> = HashMap::new();
        for w in batch {
            if let Some(key) = &w.key {
                let pair = (w.agent.clone(), key.clone());
                let first = match keys.get(&pair) {
                    Some(id) => Some(*id),
                    None => tx
                        .query_row(
                            "SELECT id FROM windows WHERE agent = ?1 AND idem = ?2",
                            params![w.agent, key],
                            |r| r.get(0),
                        )
                        .optional()
                        .map_err(backend)?,
                };
                if let Some(id) = first {
                    out.push(Ok(Inserted {
                        id,
                        duplicate: true,
                    }));
                    continue;
                }
            }
            let r = &w.rows;
            store_dictionary(&tx, &self.stored, added, r.labelset, &r.labels, &r.dict)?;
            tx.prepare_cached(
                "INSERT INTO windows (agent, idem, labelset, start_ns, end_ns, bytes, rows) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    w.agent,
                    w.key,
                    int(r.labelset),
                    int(r.start_ns.min(i64::MAX as u64)),
                    int(r.end_ns.min(i64::MAX as u64)),
                    w.body.len() as i64,
                    packed::encode(&r.agg)
                ])
            })
            .map_err(backend)?;
            let id = tx.last_insert_rowid();
            tx.prepare_cached("INSERT INTO bodies (id, body) VALUES (?1, ?2)")
                .and_then(|mut s| s.execute(params![id, w.body]))
                .map_err(backend)?;
            if let Some(key) = w.key {
                keys.insert((w.agent, key), id);
            }
            for level in [MINUTE_NS, HOUR_NS] {
                let bucket = r.start_ns / level * level;
                let sums = rollups.entry((level, r.labelset, bucket)).or_default();
                sums.absorb(&r.agg);
            }
            out.push(Ok(Inserted {
                id,
                duplicate: false,
            }));
        }
        for ((level, labelset, bucket), mut sums) in rollups {
            let key = params![int(level), int(labelset), int(bucket.min(i64::MAX as u64))];
            let before: Option<Vec<u8>> = tx
                .prepare_cached(
                    "SELECT rows FROM rollups WHERE level = ?1 AND labelset = ?2 AND bucket = ?3",
                )
                .and_then(|mut s| s.query_row(key, |r| r.get(0)).optional())
                .map_err(backend)?;
            if let Some(b) = before {
                packed::absorb(&mut sums, &b)?;
            }
            tx.prepare_cached(
                "INSERT OR REPLACE INTO rollups (level, labelset, bucket, rows) \
                 VALUES (?1, ?2, ?3, ?4)",
            )
            .and_then(|mut s| {
                s.execute(params![
                    int(level),
                    int(labelset),
                    int(bucket.min(i64::MAX as u64)),
                    packed::encode(&sums)
                ])
            })
            .map_err(backend)?;
        }
        tx.commit().map_err(backend)?;
        Ok(out)
    }

    /// Deletes the windows that started before the hour `before_ns` falls in, and their
    /// rollups (whole buckets, so what rollups sum is always what the windows hold).
    pub fn retain(&mut self, before_ns: u64) -> Result<usize, StoreError> {
        let cutoff = int((before_ns / HOUR_NS * HOUR_NS).min(i64::MAX as u64));
        let tx = self.conn.transaction().map_err(backend)?;
        tx.execute(
            "DELETE FROM bodies WHERE id IN (SELECT id FROM windows WHERE start_ns < ?1)",
            params![cutoff],
        )
        .map_err(backend)?;
        let n = tx
            .execute("DELETE FROM windows WHERE start_ns < ?1", params![cutoff])
            .map_err(backend)?;
        tx.execute("DELETE FROM rollups WHERE bucket < ?1", params![cutoff])
            .map_err(backend)?;
        tx.commit().map_err(backend)?;
        Ok(n)
    }

    /// Re-stores every window of a first-layout store (`windows_v1`, bodies only) as rows, in
    /// its order, then drops the old table: nothing stored before is lost.
    pub fn migrate(&mut self) -> Result<(), StoreError> {
        let old: Vec<(String, Option<String>, Vec<u8>)> = {
            let mut s = self
                .conn
                .prepare("SELECT agent, idem, body FROM windows_v1 ORDER BY id")
                .map_err(backend)?;
            let rows = s
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .map_err(backend)?;
            rows.collect::<Result<_, _>>().map_err(backend)?
        };
        for chunk in old.chunks(super::BATCH) {
            let mut batch = Vec::new();
            for (agent, key, body) in chunk {
                let stored = &self.stored;
                batch.push(NewWindow::from_body(
                    agent,
                    key.as_deref(),
                    body.clone(),
                    stored,
                )?);
            }
            for r in self.write(batch) {
                r?;
            }
        }
        self.conn
            .execute_batch("DROP TABLE windows_v1;")
            .map_err(backend)
    }
}

/// Stores what `dict` and the label set hold that is not known to be stored yet.
fn store_dictionary(
    tx: &rusqlite::Transaction,
    stored: &Stored,
    added: &mut Vec<(Table, u64)>,
    labelset: u64,
    labels: &str,
    dict: &Dictionary,
) -> Result<(), StoreError> {
    let put = |sql: &str, id: u64, value: &dyn rusqlite::ToSql| {
        tx.prepare_cached(sql)
            .and_then(|mut s| s.execute(params![int(id), value]))
            .map_err(backend)
    };
    if !stored.has(Table::Labelsets, labelset) {
        put(
            "INSERT OR IGNORE INTO labelsets (id, labels) VALUES (?1, ?2)",
            labelset,
            &labels,
        )?;
        added.push((Table::Labelsets, labelset));
    }
    for (id, name) in &dict.functions {
        put(
            "INSERT OR IGNORE INTO functions (id, name) VALUES (?1, ?2)",
            *id,
            name,
        )?;
    }
    for (id, name) in &dict.mappings {
        put(
            "INSERT OR IGNORE INTO mappings (id, name) VALUES (?1, ?2)",
            *id,
            name,
        )?;
    }
    for (id, s) in &dict.stacks {
        let frames = packed::encode_stack(s);
        put(
            "INSERT OR IGNORE INTO stacks (id, frames) VALUES (?1, ?2)",
            *id,
            &frames,
        )?;
    }
    for (id, set) in &dict.phasesets {
        let bytes: Vec<u8> = set.iter().flat_map(|p| p.to_le_bytes()).collect();
        put(
            "INSERT OR IGNORE INTO phasesets (id, phases) VALUES (?1, ?2)",
            *id,
            &bytes,
        )?;
    }
    added.extend(dict.ids());
    Ok(())
}
