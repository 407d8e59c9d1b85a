//! Storage behind a trait: the embedded SQLite store by default; ClickHouse for fleets.
//! A window is stored whole, in the `.phaseprof` encoding it arrived in, with its labels and
//! time range as columns to select by.
use std::collections::BTreeMap;

use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("storage: {0}")]
    Backend(String),
    #[error("a stored window does not decode: {0}")]
    Corrupt(String),
}

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

    pub fn matches(&self, labels: &BTreeMap<String, String>, start_ns: u64) -> bool {
        start_ns >= self.from_ns
            && (self.to_ns == 0 || start_ns < self.to_ns)
            && self.labels.iter().all(|(k, v)| labels.get(k) == Some(v))
    }
}

/// A stored window, without its body.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct WindowInfo {
    pub id: i64,
    pub agent: String,
    pub labels: BTreeMap<String, String>,
    pub start_ns: u64,
    pub end_ns: u64,
    pub bytes: usize,
}

/// What `Store::insert` did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Inserted {
    pub id: i64,
    /// The agent had already stored a window under this idempotency key: `id` is that one's,
    /// and nothing was stored.
    pub duplicate: bool,
}

pub trait Store: Send + Sync + 'static {
    /// Stores one window (all of it or nothing), unless `agent` stored one under the same `key`
    /// before.
    fn insert(
        &self,
        agent: &str,
        key: Option<&str>,
        labels: &BTreeMap<String, String>,
        start_ns: u64,
        end_ns: u64,
        body: &[u8],
    ) -> Result<Inserted, StoreError>;
    /// The windows `sel` selects, oldest first.
    fn windows(&self, sel: &Selector) -> Result<Vec<WindowInfo>, StoreError>;
    /// Their bodies, in the same order.
    fn bodies(&self, sel: &Selector) -> Result<Vec<Vec<u8>>, StoreError>;
    /// Deletes windows that ended before `before_ns`; returns how many.
    fn retain(&self, before_ns: u64) -> Result<usize, StoreError>;
    fn count(&self) -> Result<u64, StoreError>;
}
