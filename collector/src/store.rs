//! Storage behind a trait: the embedded SQLite store by default; ClickHouse for fleets. A
//! window is stored as rows (`rows`: stacks once, samples, phase totals, counters) with
//! minute and hour rollups written at ingest, so merged views are sums the store computes;
//! its body, as received, is kept for download.
use std::collections::BTreeMap;

use serde::Serialize;

use crate::rows::{Aggregate, Dictionary, Merged, Stored, WindowRows};

pub use crate::store_error::StoreError;

/// Which windows a query wants: every label given must match, and the window must start in
/// `[from_ns, to_ns)`.
#[derive(Clone, Debug, Default)]
pub struct Selector {
    pub labels: BTreeMap<String, String>,
    pub from_ns: u64,
    pub to_ns: u64,
}

impl Selector {
    /// Parses `host=a,service=relay` (empty: everything).
    pub fn parse_labels(s: &str) -> Result<BTreeMap<String, String>, String> {
        let mut out = BTreeMap::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| format!("label selector `{part}` is not key=value"))?;
            out.insert(k.trim().to_string(), v.trim().to_string());
        }
        Ok(out)
    }

    pub fn matches_labels(&self, labels: &BTreeMap<String, String>) -> bool {
        self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
    }

    /// The end of the range, `u64::MAX` when open (kept below 2^63: SQLite's integers).
    pub fn to(&self) -> u64 {
        if self.to_ns == 0 {
            i64::MAX as u64
        } else {
            self.to_ns.min(i64::MAX as u64)
        }
    }

    /// The ids of the label sets (id, labels as JSON) this selector matches.
    pub fn matching_labelsets(&self, sets: &[(u64, String)]) -> Result<Vec<u64>, StoreError> {
        let mut out = Vec::new();
        for (id, json) in sets {
            let labels: BTreeMap<String, String> =
                serde_json::from_str(json).map_err(|e| StoreError::Corrupt(e.to_string()))?;
            if self.matches_labels(&labels) {
                out.push(*id);
            }
        }
        Ok(out)
    }
}

/// A stored window, without its rows or body.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct WindowInfo {
    pub id: i64,
    pub agent: String,
    pub labels: BTreeMap<String, String>,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Its body as received (gzip JSON), kept for download.
    pub bytes: usize,
}

/// The selected windows of one label set: how many, and their span.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LabelSet {
    pub labels: BTreeMap<String, String>,
    pub windows: u64,
    pub start_ns: u64,
    pub end_ns: u64,
}

/// What `Store::insert` did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Inserted {
    pub id: i64,
    /// The agent had already stored a window under this idempotency key: `id` is that one's,
    /// and nothing was stored.
    pub duplicate: bool,
}

/// A window to store: who sent it, its idempotency key, its rows and its body.
pub struct NewWindow {
    pub agent: String,
    pub key: Option<String>,
    pub rows: WindowRows,
    pub body: Vec<u8>,
}

impl NewWindow {
    /// A window from its body as received (decoded and split here: tests, migrations).
    pub fn from_body(
        agent: &str,
        key: Option<&str>,
        body: Vec<u8>,
        stored: &Stored,
    ) -> Result<Self, StoreError> {
        let p = phaseprof_model::read_profile(&body[..])
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        Ok(NewWindow {
            agent: agent.to_string(),
            key: key.map(str::to_string),
            rows: crate::rows::split(&p, stored),
            body,
        })
    }
}

/// What a store holds, by table: rows and bytes (on disk where the store can say).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Footprint {
    pub tables: Vec<TableSize>,
    /// Everything, and the part that is windows' bodies as received.
    pub total_bytes: u64,
    pub body_bytes: u64,
    /// What the bodies take in the store, where it can say (ClickHouse compresses them with
    /// the rest of their table's columns: no figure of their own).
    pub body_stored_bytes: Option<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TableSize {
    pub table: String,
    pub rows: u64,
    pub bytes: u64,
}

pub trait Store: Send + Sync + 'static {
    /// The dictionary rows known to be stored (splits leave them out).
    fn stored(&self) -> &Stored;
    /// Stores one window (all of it or nothing), unless its agent stored one under the same
    /// key before.
    fn insert(&self, w: NewWindow) -> Result<Inserted, StoreError>;
    /// The windows `sel` selects, oldest first.
    fn windows(&self, sel: &Selector) -> Result<Vec<WindowInfo>, StoreError>;
    /// The selected windows by label set (the index and the label pickers).
    fn label_sets(&self, sel: &Selector) -> Result<Vec<LabelSet>, StoreError>;
    /// One window's body as received.
    fn body(&self, id: i64) -> Result<Option<Vec<u8>>, StoreError>;
    /// The windows `sel` selects summed in the store (rollups where whole buckets fit), with
    /// the stacks, names and phase sets the sums refer to.
    fn merged(&self, sel: &Selector) -> Result<Merged, StoreError>;
    /// Each selected window's own sums (a diff's replicates), oldest first, with what they
    /// all refer to.
    fn per_window(&self, sel: &Selector) -> Result<(Vec<Aggregate>, Dictionary), StoreError>;
    /// Deletes the windows (and rollups) of whole hours before `before_ns`; returns how many
    /// windows.
    fn retain(&self, before_ns: u64) -> Result<usize, StoreError>;
    fn count(&self) -> Result<u64, StoreError>;
    fn footprint(&self) -> Result<Footprint, StoreError>;
}
