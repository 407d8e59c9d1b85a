//! The fleet store: ClickHouse over its HTTP interface (`--clickhouse URL`), so several
//! collectors can share one cluster. Schema and queries stay within what Debian's
//! clickhouse-server 18.16 understands (MergeTree families with custom partition keys,
//! materialized views `TO` a table, `ALTER … DELETE`, RowBinary; no Map type) and current
//! releases keep.
//!
//! Tables (`T` is `--clickhouse-table`): `T` (one row per window: labels, times, the
//! earliest-window head, counters as two arrays, the body as received), `T_samples` (one row
//! per sample row of a window), `T_samples_1m` and `T_samples_1h` (SummingMergeTree rollups
//! fed by materialized views), `T_phase_stats` (per window and phase, histogram and costs as
//! arrays), and the stored-once `T_labelsets`, `T_functions`, `T_mappings`, `T_stacks`,
//! `T_phasesets` (ReplacingMergeTree by content id). A merged view is three GROUP BY queries
//! (samples over hour and minute rollups and the edges' raw rows, phase totals, counters);
//! see `docs/fleet.md` for a cluster (Distributed tables over shards).
//!
//! Windows are inserted in batches (`batch`): ClickHouse makes one part per INSERT and
//! refuses inserts once a partition holds a few hundred unmerged parts.
mod columns;
mod http;
mod read;
mod rowbinary;
mod schema;
mod write;

use std::sync::Arc;
use std::time::Duration;

use crate::batch::Batcher;
use crate::rows::{Aggregate, Dictionary, Merged, Stored};
use crate::store::{
    Footprint, Inserted, LabelSet, NewWindow, Selector, Store, StoreError, WindowInfo,
};
use http::Http;

/// Windows per batch at most, and the least time between two batches' starts: a few dozen
/// parts a second at any rate.
const BATCH_ROWS: usize = 1024;
const INSERT_SPACING: Duration = Duration::from_millis(25);

pub struct ClickHouseStore {
    stored: Arc<Stored>,
    http: Http,
    table: String,
    batches: Batcher<NewWindow>,
}

impl ClickHouseStore {
    /// Connects to `url` (e.g. `http://127.0.0.1:8123/?database=default`), creating the
    /// tables (`table` and `table_*`) that do not exist, and storing as rows the windows a
    /// collector of the first layout stored as bodies only.
    pub fn open(url: &str, table: &str) -> Result<Self, StoreError> {
        if !table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') || table.is_empty() {
            return Err(StoreError::Backend(format!(
                "`{table}` is not a plain table name"
            )));
        }
        let http = Http::new(url);
        schema::create(&http, table)?;
        let stored = Arc::new(Stored::default());
        let writer = write::Writer::new(http.clone(), table, stored.clone());
        write::migrate(&http, table, &writer)?;
        let batches = Batcher::spawn("clickhouse-insert", BATCH_ROWS, INSERT_SPACING, move |b| {
            writer.write(b)
        })?;
        Ok(ClickHouseStore {
            stored,
            http,
            table: table.to_string(),
            batches,
        })
    }
}

impl Store for ClickHouseStore {
    fn stored(&self) -> &Stored {
        &self.stored
    }

    fn insert(&self, w: NewWindow) -> Result<Inserted, StoreError> {
        self.batches.submit(w)
    }

    fn windows(&self, sel: &Selector) -> Result<Vec<WindowInfo>, StoreError> {
        read::windows(&self.http, &self.table, sel)
    }

    fn label_sets(&self, sel: &Selector) -> Result<Vec<LabelSet>, StoreError> {
        read::label_sets(&self.http, &self.table, sel)
    }

    fn body(&self, id: i64) -> Result<Option<Vec<u8>>, StoreError> {
        read::body(&self.http, &self.table, id)
    }

    fn merged(&self, sel: &Selector) -> Result<Merged, StoreError> {
        read::merged(&self.http, &self.table, sel)
    }

    fn per_window(&self, sel: &Selector) -> Result<(Vec<Aggregate>, Dictionary), StoreError> {
        read::per_window(&self.http, &self.table, sel)
    }

    /// Counts, then deletes with mutations, which ClickHouse applies in the background (18.16
    /// has no way to wait for them).
    fn retain(&self, before_ns: u64) -> Result<usize, StoreError> {
        schema::retain(&self.http, &self.table, before_ns)
    }

    fn count(&self) -> Result<u64, StoreError> {
        self.http
            .number(&format!("SELECT count() FROM {}", self.table))
    }

    fn footprint(&self) -> Result<Footprint, StoreError> {
        schema::footprint(&self.http, &self.table)
    }
}
