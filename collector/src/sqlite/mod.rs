//! The embedded store: one SQLite file under `--data DIR`, durable across restarts. WAL with
//! synchronous=NORMAL: a committed window survives the collector being killed (the WAL is in
//! the page cache); only a power loss can take the last commits. Windows arriving together
//! are written in one transaction by one thread (`batch`). Queries read through their own
//! connection (WAL readers do not wait for the writer), so a large query never holds up ingest.
//!
//! Layout: `windows` (one row per window: labels as a label-set id, times, its rows packed as
//! `rows::packed`), `bodies` (as received, for download), the stored-once `labelsets`,
//! `functions`, `mappings`, `stacks`, `phasesets`, and `rollups`: per (minute | hour,
//! label set) the sums of the windows that started in it, updated in the transaction that
//! stores them. A query reads hour rollups for whole hours, minute rollups for whole minutes
//! and windows' own rows for the rest.
mod read;
mod write;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::Connection;

use crate::batch::Batcher;
use crate::rows::{Aggregate, Dictionary, Merged, Stored};
use crate::store::{
    Footprint, Inserted, LabelSet, NewWindow, Selector, Store, StoreError, TableSize, WindowInfo,
};

pub struct SqliteStore {
    stored: Arc<Stored>,
    writer: Arc<Mutex<write::Writer>>,
    batches: Batcher<NewWindow>,
    /// Queries' connection; the writer's in memory (a second connection would be another
    /// database).
    reader: Option<Mutex<Connection>>,
}

pub(crate) fn backend(e: rusqlite::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

/// Windows per transaction at most.
const BATCH: usize = 256;
/// Least time between two transactions' starts: at any rate, a few commits a second.
const SPACING: Duration = Duration::from_millis(20);

const SCHEMA: &str = "
    PRAGMA journal_mode=WAL;
    PRAGMA synchronous=NORMAL;
    CREATE TABLE IF NOT EXISTS windows (
        id INTEGER PRIMARY KEY,
        agent TEXT NOT NULL,
        idem TEXT,
        labelset INTEGER NOT NULL,
        start_ns INTEGER NOT NULL,
        end_ns INTEGER NOT NULL,
        bytes INTEGER NOT NULL,   -- the body's, as received
        rows BLOB NOT NULL        -- rows::packed
    );
    CREATE INDEX IF NOT EXISTS windows_start ON windows(start_ns);
    CREATE UNIQUE INDEX IF NOT EXISTS windows_idem ON windows(agent, idem) WHERE idem IS NOT NULL;
    CREATE TABLE IF NOT EXISTS bodies (id INTEGER PRIMARY KEY, body BLOB NOT NULL);
    CREATE TABLE IF NOT EXISTS labelsets (id INTEGER PRIMARY KEY, labels TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS functions (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS mappings (id INTEGER PRIMARY KEY, name TEXT NOT NULL);
    CREATE TABLE IF NOT EXISTS stacks (id INTEGER PRIMARY KEY, frames BLOB NOT NULL);
    CREATE TABLE IF NOT EXISTS phasesets (id INTEGER PRIMARY KEY, phases BLOB NOT NULL);
    CREATE TABLE IF NOT EXISTS rollups (
        level INTEGER NOT NULL,    -- bucket length, ns
        labelset INTEGER NOT NULL,
        bucket INTEGER NOT NULL,   -- start, ns
        rows BLOB NOT NULL,        -- rows::packed
        PRIMARY KEY (level, labelset, bucket)
    ) WITHOUT ROWID;";

impl SqliteStore {
    /// Opens (creating if needed) `DIR/windows.sqlite`.
    pub fn open(dir: &Path) -> Result<Self, StoreError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::Backend(format!("{}: {e}", dir.display())))?;
        let path = dir.join("windows.sqlite");
        let mut store = Self::with(Connection::open(&path).map_err(backend)?)?;
        let reader = Connection::open(&path).map_err(backend)?;
        reader
            .busy_timeout(Duration::from_secs(10))
            .map_err(backend)?;
        store.reader = Some(Mutex::new(reader));
        Ok(store)
    }

    /// An in-memory store (tests).
    pub fn memory() -> Result<Self, StoreError> {
        Self::with(Connection::open_in_memory().map_err(backend)?)
    }

    fn with(conn: Connection) -> Result<Self, StoreError> {
        let old = write::is_old_layout(&conn)?;
        if old {
            conn.execute_batch(
                "ALTER TABLE windows RENAME TO windows_v1;
                 DROP INDEX IF EXISTS windows_start;
                 DROP INDEX IF EXISTS windows_idem;",
            )
            .map_err(backend)?;
        }
        conn.execute_batch(SCHEMA).map_err(backend)?;
        let stored = Arc::new(Stored::default());
        let writer = Arc::new(Mutex::new(write::Writer::new(conn, stored.clone())));
        if old {
            lock(&writer).migrate()?;
        }
        let w = writer.clone();
        let batches = Batcher::spawn("sqlite-insert", BATCH, SPACING, move |batch| {
            lock(&w).write(batch)
        })?;
        Ok(SqliteStore {
            stored,
            writer,
            batches,
            reader: None,
        })
    }

    /// Runs `f` on the queries' connection.
    fn read<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match &self.reader {
            Some(r) => f(&lock(r)),
            None => f(lock(&self.writer).conn()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Times and ids as SQLite's integers (i64: times stay below 2^63; ids keep their bits).
pub(crate) fn int(v: u64) -> i64 {
    v as i64
}

impl Store for SqliteStore {
    fn stored(&self) -> &Stored {
        &self.stored
    }

    fn insert(&self, w: NewWindow) -> Result<Inserted, StoreError> {
        self.batches.submit(w)
    }

    fn windows(&self, sel: &Selector) -> Result<Vec<WindowInfo>, StoreError> {
        self.read(|c| read::windows(c, sel))
    }

    fn label_sets(&self, sel: &Selector) -> Result<Vec<LabelSet>, StoreError> {
        self.read(|c| read::label_sets(c, sel))
    }

    fn body(&self, id: i64) -> Result<Option<Vec<u8>>, StoreError> {
        self.read(|c| read::body(c, id))
    }

    fn merged(&self, sel: &Selector) -> Result<Merged, StoreError> {
        self.read(|c| read::merged(c, sel))
    }

    fn per_window(&self, sel: &Selector) -> Result<(Vec<Aggregate>, Dictionary), StoreError> {
        self.read(|c| read::per_window(c, sel))
    }

    fn retain(&self, before_ns: u64) -> Result<usize, StoreError> {
        lock(&self.writer).retain(before_ns)
    }

    fn count(&self) -> Result<u64, StoreError> {
        self.read(|c| {
            c.query_row("SELECT count(*) FROM windows", [], |r| r.get::<_, i64>(0))
                .map(|n| n as u64)
                .map_err(backend)
        })
    }

    fn footprint(&self) -> Result<Footprint, StoreError> {
        self.read(|c| {
            let mut f = Footprint::default();
            for (table, bytes) in [
                ("windows", "length(rows)"),
                ("bodies", "length(body)"),
                ("rollups", "length(rows)"),
                ("stacks", "length(frames)"),
                ("functions", "length(name)"),
                ("mappings", "length(name)"),
            ] {
                let (rows, bytes) = c
                    .query_row(
                        &format!("SELECT count(*), coalesce(sum({bytes}), 0) FROM {table}"),
                        [],
                        |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?)),
                    )
                    .map_err(backend)?;
                if table == "bodies" {
                    // Kept as received: as many bytes in the store.
                    f.body_bytes = bytes as u64;
                    f.body_stored_bytes = Some(bytes as u64);
                }
                f.tables.push(TableSize {
                    table: table.into(),
                    rows: rows as u64,
                    bytes: bytes as u64,
                });
            }
            let file: i64 = c
                .query_row(
                    "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
                    [],
                    |r| r.get(0),
                )
                .map_err(backend)?;
            f.total_bytes = file as u64;
            Ok(f)
        })
    }
}

/// Label-set ids as an SQL list (integers only: nothing to quote).
pub(crate) fn labelset_list(ids: &[u64]) -> String {
    ids.iter()
        .map(|i| int(*i).to_string())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::HOUR_NS;
    use phaseprof_model::{write_profile, EventKind, Meta, Profile};
    use std::collections::BTreeMap;

    fn body(host: &str, start: u64, end: u64) -> Vec<u8> {
        let p = Profile {
            meta: Meta {
                events: vec![EventKind::Cpu],
                start_unix_ns: start,
                end_unix_ns: end,
                labels: BTreeMap::from([("host".to_string(), host.to_string())]),
                ..Meta::default()
            },
            phases: vec!["(none)".into()],
            ..Profile::default()
        };
        let mut out = Vec::new();
        write_profile(&p, &mut out).unwrap();
        out
    }

    fn put(s: &SqliteStore, agent: &str, key: Option<&str>, b: Vec<u8>) -> Inserted {
        s.insert(NewWindow::from_body(agent, key, b, s.stored()).unwrap())
            .unwrap()
    }

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("phaseprof-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    // Checks insert, selection by labels and time, retention by whole hours, durability across
    // a reopen, that a key an agent used before stores nothing twice (other agents may use the
    // same key), and that a body comes back as sent.
    #[test]
    fn stores_selects_and_survives_reopen() {
        let dir = dir("sqlite");
        let h = HOUR_NS;
        {
            let s = SqliteStore::open(&dir).unwrap();
            put(&s, "a1", Some("w1"), body("a", 10, 20));
            put(&s, "b1", Some("w1"), body("b", 15, 25));
            put(&s, "a1", None, body("a", h + 30, h + 40));
        }
        let s = SqliteStore::open(&dir).unwrap();
        assert_eq!(s.count().unwrap(), 3);
        // A retry of a1's first window, after the restart: the first copy, nothing stored.
        let again = put(&s, "a1", Some("w1"), body("a", 10, 20));
        assert_eq!((again.id, again.duplicate), (1, true));
        assert_eq!(s.count().unwrap(), 3);
        let sel = |host: &str, from_ns, to_ns| Selector {
            labels: BTreeMap::from([("host".to_string(), host.to_string())]),
            from_ns,
            to_ns,
        };
        let w = s.windows(&sel("a", 0, 0)).unwrap();
        assert_eq!(
            w.iter().map(|w| w.start_ns).collect::<Vec<_>>(),
            vec![10, h + 30]
        );
        assert_eq!(s.body(w[1].id).unwrap(), Some(body("a", h + 30, h + 40)));
        let w = s.windows(&sel("b", 12, 30)).unwrap();
        assert_eq!((w.len(), w[0].agent.as_str()), (1, "b1"));
        assert_eq!(s.merged(&sel("a", 0, 0)).unwrap().agg.windows, 2);
        // Retention removes whole hours: the first hour's two windows.
        assert_eq!(s.retain(h + 50).unwrap(), 2);
        assert_eq!(s.count().unwrap(), 1);
        assert_eq!(s.merged(&sel("a", 0, 0)).unwrap().agg.windows, 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    // Checks that a store of the first layout (bodies only) opens with every window kept:
    // listed, merged, its body and its idempotency key as before.
    #[test]
    fn first_layout_stores_are_migrated() {
        let dir = dir("sqlite-v1");
        std::fs::create_dir_all(&dir).unwrap();
        {
            let c = Connection::open(dir.join("windows.sqlite")).unwrap();
            c.execute_batch(
                "CREATE TABLE windows (id INTEGER PRIMARY KEY, agent TEXT NOT NULL, \
                 labels TEXT NOT NULL, start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL, \
                 body BLOB NOT NULL, idem TEXT);
                 CREATE INDEX windows_start ON windows(start_ns);
                 CREATE UNIQUE INDEX windows_idem ON windows(agent, idem) WHERE idem IS NOT NULL;",
            )
            .unwrap();
            for (i, key) in [(1u64, "k1"), (2, "k2")] {
                c.execute(
                    "INSERT INTO windows (agent, labels, start_ns, end_ns, body, idem) \
                     VALUES ('a1', '{\"host\":\"a\"}', ?1, ?2, ?3, ?4)",
                    rusqlite::params![i as i64, i as i64 + 5, body("a", i, i + 5), key],
                )
                .unwrap();
            }
        }
        let s = SqliteStore::open(&dir).unwrap();
        assert_eq!(s.count().unwrap(), 2);
        let all = Selector::default();
        assert_eq!(s.merged(&all).unwrap().agg.windows, 2);
        let w = s.windows(&all).unwrap();
        assert_eq!(s.body(w[0].id).unwrap(), Some(body("a", 1, 6)));
        assert!(put(&s, "a1", Some("k2"), body("a", 2, 7)).duplicate);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
