//! The collector's HTML pages and their JSON API: `serve`'s web app (the `phaseprof` crate's
//! `web`) over label selections. Each profile is a selection — the windows of a label set over
//! a recent range (`host=a,version=1.5@1h`) — merged on demand; the index lists the label sets
//! seen in the last day and offers label pickers.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use phaseprof_model::Profile;
use phaseprof_view::web::{LabelPicker, ProfileEntry, ProfileSource};

use crate::merged::merged_profile;
use crate::store::{LabelSet, Selector, Store};
use phaseprof_model::units::parse_duration;

/// A merged selection is reused this long: one page view fetches its profile several times
/// (the page, each flamegraph, the downloads).
const CACHE_FOR: Duration = Duration::from_secs(30);
/// Merged selections kept at most (the oldest goes first): memory stays bounded whatever
/// selections clients ask for.
const CACHE_ENTRIES: usize = 8;
/// The index lists label sets with windows this recent.
const LISTED: Duration = Duration::from_secs(24 * 3600);
/// How long one scan of the listed windows serves the index.
const LISTED_FOR: Duration = Duration::from_secs(5);
/// The range of a listed label set's profile.
const DEFAULT_LAST: &str = "1h";

/// A selection's merge, once computed (None: it selects nothing).
type Merged = std::sync::OnceLock<Option<Arc<Profile>>>;

pub struct Selections {
    store: Arc<dyn Store>,
    /// The API's query turns (`--max-queries`): a page's merge takes one like a query does.
    turns: Arc<tokio::sync::Semaphore>,
    /// Selection → its merge, computed once by whichever request came first. The lock is held
    /// only to find or add an entry, never while merging: other selections are not held up.
    cache: Mutex<Vec<(String, Instant, Arc<Merged>)>>,
    /// The last day's label sets (one GROUP BY in the store): the index lists them and builds
    /// its pickers from them.
    listed: Mutex<Option<(Instant, Arc<Vec<LabelSet>>)>>,
}

impl Selections {
    pub fn new(store: Arc<dyn Store>, turns: Arc<tokio::sync::Semaphore>) -> Self {
        Selections {
            store,
            turns,
            cache: Mutex::new(Vec::new()),
            listed: Mutex::new(None),
        }
    }

    fn listed(&self) -> Arc<Vec<LabelSet>> {
        let mut listed = self.listed.lock().unwrap_or_else(|e| e.into_inner());
        match &*listed {
            Some((at, w)) if at.elapsed() < LISTED_FOR => w.clone(),
            _ => {
                let w = Arc::new(
                    blocking(|| self.store.label_sets(&self.recent(LISTED))).unwrap_or_default(),
                );
                *listed = Some((Instant::now(), w.clone()));
                w
            }
        }
    }

    fn recent(&self, age: Duration) -> Selector {
        Selector {
            labels: BTreeMap::new(),
            from_ns: now_ns().saturating_sub(age.as_nanos() as u64),
            to_ns: 0,
        }
    }

    fn merge(&self, id: &str) -> Option<Profile> {
        let (labels, last) = parse_id(id)?;
        let sel = Selector {
            labels,
            ..self.recent(last)
        };
        // Waits its turn on this (blocking) thread: pages are served from `block_in_place`.
        let _turn = loop {
            match self.turns.try_acquire() {
                Ok(turn) => break turn,
                Err(tokio::sync::TryAcquireError::Closed) => return None,
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        merged_profile(self.store.as_ref(), &sel).ok().flatten()
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64
}

/// `k=v,k=v@AGE` (either part may be empty) → labels and age.
fn parse_id(id: &str) -> Option<(BTreeMap<String, String>, Duration)> {
    let (labels, last) = id.rsplit_once('@').unwrap_or((id, DEFAULT_LAST));
    Some((
        Selector::parse_labels(labels).ok()?,
        parse_duration(last).ok()?,
    ))
}

fn id_of<'a>(labels: impl IntoIterator<Item = (&'a String, &'a String)>, last: &str) -> String {
    let sel: Vec<String> = labels
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    format!("{}@{last}", sel.join(","))
}

/// Work that reads the store and decodes windows, called from the web app's async handlers:
/// moved off the async worker where the runtime allows it.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current() {
        Ok(h) if h.runtime_flavor() == RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

impl ProfileSource for Selections {
    fn list(&self) -> Vec<ProfileEntry> {
        let mut sets: BTreeMap<&BTreeMap<String, String>, (u64, u64)> = BTreeMap::new();
        let listed = self.listed();
        for w in listed.iter() {
            let range = sets.entry(&w.labels).or_insert((u64::MAX, 0));
            range.0 = range.0.min(w.start_ns);
            range.1 = range.1.max(w.end_ns);
        }
        sets.into_iter()
            .map(|(labels, (start, end))| {
                let id = id_of(labels, DEFAULT_LAST);
                ProfileEntry {
                    name: id.clone(),
                    id,
                    comm: labels.get("service").cloned().unwrap_or_default(),
                    pids: Vec::new(),
                    start_unix_ns: start,
                    duration_ns: end.saturating_sub(start),
                    events: Vec::new(),
                }
            })
            .collect()
    }

    fn get(&self, id: &str) -> Option<Arc<Profile>> {
        let slot = {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            cache.retain(|(_, at, _)| at.elapsed() < CACHE_FOR);
            match cache.iter().find(|(k, _, _)| k == id) {
                Some((_, _, slot)) => slot.clone(),
                None => {
                    if cache.len() >= CACHE_ENTRIES {
                        cache.remove(0);
                    }
                    let slot = Arc::new(Merged::default());
                    cache.push((id.to_string(), Instant::now(), slot.clone()));
                    slot
                }
            }
        };
        // Concurrent requests for this selection wait here for the one merge; others do not.
        let merged = slot
            .get_or_init(|| blocking(|| self.merge(id)).map(Arc::new))
            .clone();
        if merged.is_none() {
            // Nothing selected yet: the next request looks again rather than trust this.
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            cache.retain(|(_, _, s)| !Arc::ptr_eq(s, &slot));
        }
        merged
    }

    fn refresh_s(&self) -> u32 {
        60
    }

    fn heading(&self) -> String {
        "Fleet: label sets of the last 24 hours (each over its last hour)".into()
    }

    fn pickers(&self) -> Vec<LabelPicker> {
        let listed = self.listed();
        let mut keys: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for w in listed.iter() {
            for (k, v) in &w.labels {
                keys.entry(k).or_default().insert(v);
            }
        }
        keys.into_iter()
            .map(|(key, values)| LabelPicker {
                key: key.to_string(),
                values: values.into_iter().map(String::from).collect(),
            })
            .collect()
    }

    fn select(&self, labels: &[(String, String)], last: &str) -> Option<String> {
        parse_duration(last).ok()?;
        Some(id_of(labels.iter().map(|(k, v)| (k, v)), last))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::SqliteStore;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use phaseprof_model::*;
    use tower::ServiceExt;

    fn window(host: &str, version: &str, samples: u64) -> Profile {
        let start = now_ns() - 60_000_000_000;
        let mut b = ProfileBuilder::new(
            Meta {
                pids: vec![7],
                comm: "relay".into(),
                events: vec![EventKind::Cpu],
                frequency_hz: 99,
                start_unix_ns: start,
                end_unix_ns: start + 10_000_000_000,
                labels: [("host", host), ("version", version)]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Meta::default()
            },
            vec!["verify".into()],
        );
        let f = b.intern_frame(Frame {
            function: "verify_signatures".into(),
            module: "relay".into(),
            kind: FrameKind::User,
            inlined: false,
        });
        let s = b.intern_stack(vec![f]);
        b.add(
            Sample::new(
                SampleKind::Cpu,
                (7, 7),
                PhaseAt { phase: 1, mask: 2 },
                vec![samples],
            )
            .on(s),
        );
        b.finish()
    }

    async fn get(app: &axum::Router, uri: &str) -> (u16, String, String) {
        let resp = app
            .clone()
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let location = resp
            .headers()
            .get("location")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            location,
            String::from_utf8_lossy(&body).into_owned(),
        )
    }

    // Checks the pages over stored windows: the index lists each label set and offers a picker
    // per label; picking `version=1.5` opens the merge of both hosts' 1.5 windows; the summary
    // API of that selection counts exactly their samples.
    #[tokio::test]
    async fn pages_show_label_selections() {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::memory().unwrap());
        for (host, version, n) in [("a", "1.5", 3), ("b", "1.5", 4), ("a", "1.4", 10)] {
            let p = window(host, version, n);
            let mut body = Vec::new();
            write_profile(&p, &mut body).unwrap();
            store
                .insert(
                    crate::store::NewWindow::from_body(host, None, body, store.stored()).unwrap(),
                )
                .unwrap();
        }
        let app = phaseprof_view::web::app(phaseprof_view::web::AppState {
            source: Arc::new(Selections::new(
                store,
                Arc::new(tokio::sync::Semaphore::new(2)),
            )),
            token: None,
            tls: false,
        });
        let (status, _, index) = get(&app, "/").await;
        assert_eq!(status, 200);
        assert!(index.contains("id=\"pickers\""), "{index}");
        assert!(index.contains("<option>1.4</option>"));
        assert!(index.contains("host=a,version=1.5@1h"));
        let (status, location, _) = get(&app, "/select?host=&version=1.5&last=1h").await;
        assert_eq!(status, 303);
        assert_eq!(location, "/profile/version%3D1.5%401h");
        let (status, _, page) = get(&app, &location).await;
        assert_eq!(status, 200, "{page}");
        assert!(page.contains("verify"));
        let (status, _, json) = get(&app, "/api/profiles/version%3D1.5%401h").await;
        assert_eq!(status, 200, "{json}");
        let summary: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(summary["events"]["cpu"]["samples"], 7, "{summary}");
        let (status, _, _) = get(&app, "/profile/version%3D9.9%401h").await;
        assert_eq!(status, 404);
    }
}
