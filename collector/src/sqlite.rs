//! The embedded store: one SQLite file under `--data DIR`, durable across restarts. WAL with
//! synchronous=NORMAL: a committed window survives the collector being killed (the WAL is in
//! the page cache); only a power loss can take the last commits. FULL would fsync every window
//! (~10 ms here), capping ingest far below a fleet's rate. Queries read through their own
//! connection (WAL readers do not wait for the writer), so a large query never holds up ingest.
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};

use crate::store::{Inserted, Selector, Store, StoreError, WindowInfo};

pub struct SqliteStore {
    conn: Mutex<Connection>,
    /// Queries' connection; None in memory (a second connection would be another database).
    reader: Option<Mutex<Connection>>,
}

fn backend(e: rusqlite::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

impl SqliteStore {
    /// Opens (creating if needed) `DIR/windows.sqlite`.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::Backend(format!("{}: {e}", dir.display())))?;
        let path = dir.join("windows.sqlite");
        let mut store = Self::with(Connection::open(&path).map_err(backend)?)?;
        let reader = Connection::open(&path).map_err(backend)?;
        reader
            .busy_timeout(std::time::Duration::from_secs(10))
            .map_err(backend)?;
        store.reader = Some(Mutex::new(reader));
        Ok(store)
    }

    /// An in-memory store (tests).
    pub fn memory() -> Result<Self, StoreError> {
        Self::with(Connection::open_in_memory().map_err(backend)?)
    }

    fn with(conn: Connection) -> Result<Self, StoreError> {
        conn.execute_batch(
            "PRAGMA journal_mode=WAL;
             PRAGMA synchronous=NORMAL;
             CREATE TABLE IF NOT EXISTS windows (
                 id INTEGER PRIMARY KEY,
                 agent TEXT NOT NULL,
                 labels TEXT NOT NULL,      -- JSON object
                 start_ns INTEGER NOT NULL, -- i64: SQLite has no u64
                 end_ns INTEGER NOT NULL,
                 body BLOB NOT NULL         -- the .phaseprof bytes as received
             );
             CREATE INDEX IF NOT EXISTS windows_start ON windows(start_ns);",
        )
        .map_err(backend)?;
        // The idempotency key (added to stores created before it existed).
        let has_key: bool = conn
            .prepare("SELECT 1 FROM pragma_table_info('windows') WHERE name = 'idem'")
            .and_then(|mut s| s.exists([]))
            .map_err(backend)?;
        if !has_key {
            conn.execute_batch("ALTER TABLE windows ADD COLUMN idem TEXT")
                .map_err(backend)?;
        }
        conn.execute_batch(
            "CREATE UNIQUE INDEX IF NOT EXISTS windows_idem ON windows(agent, idem) \
             WHERE idem IS NOT NULL;",
        )
        .map_err(backend)?;
        Ok(SqliteStore {
            conn: Mutex::new(conn),
            reader: None,
        })
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn reader(&self) -> std::sync::MutexGuard<'_, Connection> {
        match &self.reader {
            Some(r) => r.lock().unwrap_or_else(|e| e.into_inner()),
            None => self.conn(),
        }
    }

    /// Rows in the time range; labels are matched in Rust (selectors are few, windows' labels
    /// are a small JSON object).
    fn rows(
        &self,
        sel: &Selector,
        with_body: bool,
    ) -> Result<Vec<(WindowInfo, Vec<u8>)>, StoreError> {
        let conn = self.reader();
        let to = if sel.to_ns == 0 {
            i64::MAX
        } else {
            sel.to_ns.min(i64::MAX as u64) as i64
        };
        let sql = if with_body {
            "SELECT id, agent, labels, start_ns, end_ns, length(body), body FROM windows \
             WHERE start_ns >= ?1 AND start_ns < ?2 ORDER BY start_ns, id"
        } else {
            "SELECT id, agent, labels, start_ns, end_ns, length(body), x'' FROM windows \
             WHERE start_ns >= ?1 AND start_ns < ?2 ORDER BY start_ns, id"
        };
        let mut stmt = conn.prepare_cached(sql).map_err(backend)?;
        let rows = stmt
            .query_map(params![sel.from_ns.min(i64::MAX as u64) as i64, to], |r| {
                Ok((
                    r.get::<_, i64>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, i64>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, i64>(5)?,
                    r.get::<_, Vec<u8>>(6)?,
                ))
            })
            .map_err(backend)?;
        let mut out = Vec::new();
        for row in rows {
            let (id, agent, labels, start, end, len, body) = row.map_err(backend)?;
            let labels: BTreeMap<String, String> =
                serde_json::from_str(&labels).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            if !sel.matches(&labels, start as u64) {
                continue;
            }
            out.push((
                WindowInfo {
                    id,
                    agent,
                    labels,
                    start_ns: start as u64,
                    end_ns: end as u64,
                    bytes: len as usize,
                },
                body,
            ));
        }
        Ok(out)
    }
}

impl Store for SqliteStore {
    fn insert(
        &self,
        agent: &str,
        key: Option<&str>,
        labels: &BTreeMap<String, String>,
        start_ns: u64,
        end_ns: u64,
        body: &[u8],
    ) -> Result<Inserted, StoreError> {
        let conn = self.conn();
        if let Some(key) = key {
            let first: Option<i64> = conn
                .query_row(
                    "SELECT id FROM windows WHERE agent = ?1 AND idem = ?2",
                    params![agent, key],
                    |r| r.get(0),
                )
                .optional()
                .map_err(backend)?;
            if let Some(id) = first {
                return Ok(Inserted {
                    id,
                    duplicate: true,
                });
            }
        }
        let labels =
            serde_json::to_string(labels).map_err(|e| StoreError::Backend(e.to_string()))?;
        conn.execute(
            "INSERT INTO windows (agent, labels, start_ns, end_ns, body, idem) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![agent, labels, start_ns.min(i64::MAX as u64) as i64, end_ns.min(i64::MAX as u64) as i64, body, key],
        )
        .map_err(backend)?;
        Ok(Inserted {
            id: conn.last_insert_rowid(),
            duplicate: false,
        })
    }

    fn windows(&self, sel: &Selector) -> Result<Vec<WindowInfo>, StoreError> {
        Ok(self.rows(sel, false)?.into_iter().map(|(w, _)| w).collect())
    }

    fn bodies(&self, sel: &Selector) -> Result<Vec<Vec<u8>>, StoreError> {
        Ok(self.rows(sel, true)?.into_iter().map(|(_, b)| b).collect())
    }

    fn retain(&self, before_ns: u64) -> Result<usize, StoreError> {
        self.conn()
            .execute(
                "DELETE FROM windows WHERE end_ns < ?1",
                params![before_ns.min(i64::MAX as u64) as i64],
            )
            .map_err(backend)
    }

    fn count(&self) -> Result<u64, StoreError> {
        self.reader()
            .query_row("SELECT count(*) FROM windows", [], |r| r.get::<_, i64>(0))
            .map(|n| n as u64)
            .map_err(backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks insert, selection by labels and time, retention, durability across a reopen, and
    // that a key an agent used before stores nothing twice (other agents may use the same key).
    #[test]
    fn stores_selects_and_survives_reopen() {
        let dir = std::env::temp_dir().join(format!("phaseprof-sqlite-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let labels = |host: &str| BTreeMap::from([("host".to_string(), host.to_string())]);
        {
            let s = SqliteStore::open(&dir).unwrap();
            s.insert("a1", Some("w1"), &labels("a"), 10, 20, b"one")
                .unwrap();
            s.insert("b1", Some("w1"), &labels("b"), 15, 25, b"two")
                .unwrap();
            s.insert("a1", None, &labels("a"), 30, 40, b"three")
                .unwrap();
        }
        let s = SqliteStore::open(&dir).unwrap();
        assert_eq!(s.count().unwrap(), 3);
        // A retry of a1's first window, after the restart: the first copy, nothing stored.
        let again = s
            .insert("a1", Some("w1"), &labels("a"), 10, 20, b"one")
            .unwrap();
        assert_eq!((again.id, again.duplicate), (1, true));
        assert_eq!(s.count().unwrap(), 3);
        let sel = Selector {
            labels: labels("a"),
            from_ns: 0,
            to_ns: 0,
        };
        assert_eq!(
            s.bodies(&sel).unwrap(),
            vec![b"one".to_vec(), b"three".to_vec()]
        );
        let sel = Selector {
            labels: BTreeMap::new(),
            from_ns: 12,
            to_ns: 30,
        };
        let w = s.windows(&sel).unwrap();
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].agent.as_str(), w[0].bytes), ("b1", 3));
        assert_eq!(s.retain(26).unwrap(), 2);
        assert_eq!(s.count().unwrap(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
