//! The collector's HTTP app: `POST /api/v1/windows` (ingest), and queries over what is stored.
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use phaseprof_model::summary::Summary;
use phaseprof_model::Profile;
use phaseprof_view::web::server::ConnectionCounters;
use phaseprof_view::web::{auth, WebError};
use serde::Deserialize;
use tokio::sync::Semaphore;

use crate::merged::{digest_bodies, merge_bodies};
use crate::store::{Selector, Store, StoreError};
use crate::tokens::Tokens;

/// Counters for `/metrics`.
#[derive(Default)]
pub struct Metrics {
    pub windows_received: AtomicU64,
    pub windows_duplicate: AtomicU64,
    pub bytes_received: AtomicU64,
    pub rejected_unauthorized: AtomicU64,
    pub rejected_forbidden: AtomicU64,
    pub rejected_malformed: AtomicU64,
    pub rejected_too_large: AtomicU64,
    pub rejected_rate_limited: AtomicU64,
    pub rejected_busy: AtomicU64,
    pub rejected_timeout: AtomicU64,
    /// Windows in the store: counted at start and after each retention pass, and raised by
    /// each new window this collector stores (other collectors sharing a ClickHouse table show
    /// up at the next recount).
    pub windows_stored: AtomicU64,
    /// The accept loop's (`web::server`).
    pub connections: Arc<ConnectionCounters>,
}

/// What one upload may cost, and how many run at once.
#[derive(Clone)]
pub struct IngestLimits {
    /// Largest body, in bytes as sent (gzip): `--max-body`.
    pub max_body: usize,
    /// Largest window once inflated, in bytes (gzip bombs stop there): `--max-inflated`.
    pub max_inflated: u64,
    /// The whole body must arrive within this (a slow sender holds an upload slot no longer).
    pub body_timeout: Duration,
    /// Uploads read and decoded at once (`--max-uploads`); others wait up to `UPLOAD_WAIT`,
    /// then get 503. Bodies in memory: at most this many times `max_body`.
    pub uploads: Arc<Semaphore>,
    /// Decodes at once (the cores): each may hold up to `max_inflated`.
    pub decoders: Arc<Semaphore>,
    pub rate: Arc<RateLimit>,
}

/// How long an upload waits for a slot before 503 (the agent spools and retries).
const UPLOAD_WAIT: Duration = Duration::from_secs(5);
/// How far a window's end may lie in the future (clock skew): further, and retention, which
/// goes by end time, would never remove it.
const MAX_CLOCK_AHEAD: Duration = Duration::from_secs(600);

impl IngestLimits {
    pub fn new(
        max_body: usize,
        max_inflated: u64,
        max_uploads: usize,
        body_timeout: Duration,
        rate: RateLimit,
    ) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        IngestLimits {
            max_body,
            max_inflated,
            body_timeout,
            uploads: Arc::new(Semaphore::new(max_uploads.max(1))),
            decoders: Arc::new(Semaphore::new(cores)),
            rate: Arc::new(rate),
        }
    }
}

/// Windows per second per agent (token bucket): an agent pushes one window per `window`
/// interval, so a burst means a spool being flushed; far beyond that is a runaway or a stolen
/// token.
pub struct RateLimit {
    per_second: f64,
    burst: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

impl RateLimit {
    pub fn new(per_second: f64, burst: f64) -> Self {
        RateLimit {
            per_second,
            burst: burst.max(1.0),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one upload from `agent`'s bucket; Err: seconds until one is free.
    fn take(&self, agent: &str) -> Result<(), u64> {
        let mut b = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let (tokens, at) = b.entry(agent.to_string()).or_insert((self.burst, now));
        *tokens =
            (*tokens + now.duration_since(*at).as_secs_f64() * self.per_second).min(self.burst);
        *at = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - *tokens) / self.per_second).ceil().max(1.0) as u64)
        }
    }
}

#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub tokens: Arc<Tokens>,
    /// Bearer token for queries; None: queries are open (loopback deployments).
    pub read_token: Option<Arc<str>>,
    pub limits: IngestLimits,
    /// Queries merging or comparing windows at once (`--max-queries`).
    pub queries: Arc<Semaphore>,
    pub metrics: Arc<Metrics>,
}

/// Why an upload's window was refused after reading it.
enum Rejected {
    TooLarge(String),
    Malformed(String),
    Forbidden(String),
}

/// A store failure is the server's (500), with the store's reason (credentials redacted).
impl From<StoreError> for WebError {
    fn from(e: StoreError) -> Self {
        WebError::internal(e)
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
}

pub fn app(state: AppState) -> Router {
    Router::new()
        .route(
            "/api/v1/windows",
            // The limit is enforced by `ingest` itself (after the token, with its own 413).
            post(ingest).layer(DefaultBodyLimit::disable()).get(windows),
        )
        .route("/api/v1/merged", get(merged))
        .route("/api/v1/merged.phaseprof", get(merged_download))
        .route("/api/v1/labels", get(labels))
        .route("/api/v1/diff", get(diff))
        .route("/metrics", get(metrics))
        .layer(axum::middleware::from_fn(auth::security_headers))
        .with_state(state)
}

/// The `Idempotency-Key` of an upload: the agent names each window once and sends the same
/// name on every retry, so a window stored but not acknowledged is not stored twice.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, WebError> {
    let Some(v) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = v.to_str().unwrap_or("");
    let ok = !key.is_empty()
        && key.len() <= 128
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b));
    if !ok {
        return Err(WebError::new(
            StatusCode::BAD_REQUEST,
            "Idempotency-Key: 1 to 128 characters of A-Z a-z 0-9 - _ . :".into(),
        ));
    }
    Ok(Some(key.to_string()))
}

/// Stores one window. In order, each before any further cost: the agent is named by its token
/// (401, before a byte of the body is read); its rate (429); a declared length over
/// `--max-body` (413); an upload slot (503 after `UPLOAD_WAIT`); the body within
/// `body_timeout` (408) and `--max-body` (413); then, on the blocking pool under a decoder slot,
/// the window must decode within `--max-inflated` (413), validate (400), carry a `host` label,
/// agree with the labels the tokens file pins to this agent (403), and not end in the future
/// (400). Nothing is stored unless all of that holds; a retry with the same Idempotency-Key
/// gets the first copy's id (200) instead of a second copy.
async fn ingest(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, WebError> {
    let Some(entry) = bearer(&headers).and_then(|t| s.tokens.agent(t)).cloned() else {
        s.metrics
            .rejected_unauthorized
            .fetch_add(1, Ordering::Relaxed);
        return Err(WebError::new(
            StatusCode::UNAUTHORIZED,
            "unknown or missing agent token".into(),
        ));
    };
    let agent = entry.name.clone();
    let key = idempotency_key(&headers)?;
    if let Err(wait) = s.limits.rate.take(&agent) {
        s.metrics
            .rejected_rate_limited
            .fetch_add(1, Ordering::Relaxed);
        return Err(WebError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("agent `{agent}` is over its upload rate (--agent-rate); retry in {wait} s"),
        ));
    }
    let l = &s.limits;
    let too_large = |what: String| {
        s.metrics.rejected_too_large.fetch_add(1, Ordering::Relaxed);
        WebError::new(StatusCode::PAYLOAD_TOO_LARGE, what)
    };
    let over_body = || {
        too_large(format!(
            "the body is larger than {} bytes (--max-body)",
            l.max_body
        ))
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > l.max_body as u64) {
        return Err(over_body());
    }
    let Ok(Ok(_slot)) = tokio::time::timeout(UPLOAD_WAIT, l.uploads.clone().acquire_owned()).await
    else {
        s.metrics.rejected_busy.fetch_add(1, Ordering::Relaxed);
        return Err(WebError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the collector is busy with other uploads (--max-uploads); retry".into(),
        ));
    };
    let body: Bytes =
        match tokio::time::timeout(l.body_timeout, axum::body::to_bytes(body, l.max_body)).await {
            Ok(Ok(b)) => b,
            Ok(Err(_)) => return Err(over_body()),
            Err(_) => {
                s.metrics.rejected_timeout.fetch_add(1, Ordering::Relaxed);
                return Err(WebError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    format!(
                        "the body did not arrive within {} s (--body-timeout)",
                        l.body_timeout.as_secs()
                    ),
                ));
            }
        };
    // Decoding under a decoder slot (its memory is bounded by their number); the insert after
    // it, so that a slot is never held waiting for the store.
    let decoder = l
        .decoders
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| WebError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let (raw, max_inflated) = (body.clone(), l.max_inflated);
    let checked = tokio::task::spawn_blocking(move || check_window(&raw, max_inflated, &entry))
        .await
        .map_err(|e| WebError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    drop(decoder);
    let meta = match checked {
        Ok(m) => m,
        Err(Rejected::TooLarge(why)) => return Err(too_large(why)),
        Err(Rejected::Malformed(why)) => {
            s.metrics.rejected_malformed.fetch_add(1, Ordering::Relaxed);
            return Err(WebError::new(StatusCode::BAD_REQUEST, why));
        }
        Err(Rejected::Forbidden(why)) => {
            s.metrics.rejected_forbidden.fetch_add(1, Ordering::Relaxed);
            return Err(WebError::new(StatusCode::FORBIDDEN, why));
        }
    };
    let (store, raw, name) = (s.store.clone(), body.clone(), agent.clone());
    let inserted = tokio::task::spawn_blocking(move || {
        store.insert(
            &name,
            key.as_deref(),
            &meta.labels,
            meta.start_unix_ns,
            meta.end_unix_ns,
            &raw,
        )
    })
    .await
    .map_err(|e| WebError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    if inserted.duplicate {
        s.metrics.windows_duplicate.fetch_add(1, Ordering::Relaxed);
        return Ok(
            Json(serde_json::json!({"id": inserted.id, "agent": agent, "duplicate": true}))
                .into_response(),
        );
    }
    s.metrics.windows_received.fetch_add(1, Ordering::Relaxed);
    s.metrics.windows_stored.fetch_add(1, Ordering::Relaxed);
    s.metrics
        .bytes_received
        .fetch_add(body.len() as u64, Ordering::Relaxed);
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({"id": inserted.id, "agent": agent})),
    )
        .into_response())
}

/// Whether an upload's bytes are a window this agent may store: it decodes within
/// `max_inflated`, validates, has a `host` label, carries the labels the agent's token pins,
/// and does not end in the future. Its metadata, or why not.
fn check_window(
    raw: &[u8],
    max_inflated: u64,
    agent: &crate::tokens::Agent,
) -> Result<phaseprof_model::Meta, Rejected> {
    let profile = match phaseprof_model::read_profile_limited(raw, max_inflated) {
        Ok(p) => p,
        Err(e @ phaseprof_model::FormatError::TooLarge { .. }) => {
            return Err(Rejected::TooLarge(format!("{e} (--max-inflated)")))
        }
        Err(e) => return Err(Rejected::Malformed(format!("not a phaseprof window: {e}"))),
    };
    if let Err(e) = profile.validate() {
        return Err(Rejected::Malformed(format!("invalid window: {e}")));
    }
    let m = profile.meta;
    if !m.labels.contains_key("host") {
        return Err(Rejected::Malformed("the window has no `host` label".into()));
    }
    if let Some((k, v)) = (agent.pins.iter()).find(|(k, v)| m.labels.get(*k) != Some(*v)) {
        return Err(Rejected::Forbidden(format!(
            "agent `{}` may only send windows labelled {k}={v} (the tokens file pins it)",
            agent.name
        )));
    }
    let ahead = Duration::from_nanos(m.end_unix_ns).saturating_sub(now());
    if m.start_unix_ns > m.end_unix_ns || ahead > MAX_CLOCK_AHEAD {
        return Err(Rejected::Malformed(format!(
            "the window's time range is impossible (start {}, end {}: ends {} s in the future; is the agent's clock right?)",
            m.start_unix_ns,
            m.end_unix_ns,
            ahead.as_secs()
        )));
    }
    Ok(m)
}

fn now() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

#[derive(Deserialize, Default)]
struct SelectorQuery {
    /// `host=a,service=relay`
    #[serde(default)]
    sel: String,
    #[serde(default)]
    from: u64,
    #[serde(default)]
    to: u64,
}

/// Queries need the read token; without one (a loopback collector), a request must name a
/// loopback host, as the pages require (DNS rebinding).
fn check_read(s: &AppState, headers: &HeaderMap) -> Result<(), WebError> {
    let loopback = auth::is_loopback_host(headers.get(header::HOST));
    auth::authorize(s.read_token.as_deref(), headers, loopback, None).map(|_| ())
}

fn selector(q: &SelectorQuery) -> Result<Selector, WebError> {
    Ok(Selector {
        labels: Selector::parse_labels(&q.sel)
            .map_err(|e| WebError::new(StatusCode::BAD_REQUEST, e))?,
        from_ns: q.from,
        to_ns: q.to,
    })
}

async fn windows(
    State(s): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<SelectorQuery>,
) -> Result<Response, WebError> {
    check_read(&s, &headers)?;
    Ok(Json(s.store.windows(&selector(&q)?)?).into_response())
}

/// The bodies of the windows `q` selects (404 when none matches).
fn selected_bodies(s: &AppState, q: &SelectorQuery) -> Result<Vec<Vec<u8>>, WebError> {
    let bodies = s.store.bodies(&selector(q)?)?;
    if bodies.is_empty() {
        return Err(WebError::new(
            StatusCode::NOT_FOUND,
            format!("no windows match `{}`", q.sel),
        ));
    }
    Ok(bodies)
}

/// Every selected window merged into one profile.
fn merge_selected(s: &AppState, q: &SelectorQuery) -> Result<Profile, WebError> {
    Ok(merge_bodies(&selected_bodies(s, q)?)?)
}

/// Runs a query's store and merge work off the async workers, as many at once as
/// `AppState::queries` allows (each merge already uses every core; more at once would only
/// multiply the memory).
async fn blocking<T: Send + 'static>(
    s: &AppState,
    f: impl FnOnce() -> Result<T, WebError> + Send + 'static,
) -> Result<T, WebError> {
    let internal = |e: String| WebError::new(StatusCode::INTERNAL_SERVER_ERROR, e);
    let _turn = s
        .queries
        .clone()
        .acquire_owned()
        .await
        .map_err(|e| internal(e.to_string()))?;
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| internal(e.to_string()))?
}

async fn merged(
    State(s): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<SelectorQuery>,
) -> Result<Response, WebError> {
    check_read(&s, &headers)?;
    let p = blocking(&s.clone(), move || merge_selected(&s, &q)).await?;
    let mut json = serde_json::to_value(Summary::of(&p))
        .map_err(|e| WebError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    json["labels"] = serde_json::to_value(&p.meta.labels).unwrap_or_default();
    Ok(Json(json).into_response())
}

async fn merged_download(
    State(s): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<SelectorQuery>,
) -> Result<Response, WebError> {
    check_read(&s, &headers)?;
    let p = blocking(&s.clone(), move || merge_selected(&s, &q)).await?;
    let mut body = Vec::new();
    phaseprof_model::write_profile(&p, &mut body)
        .map_err(|e| WebError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response())
}

#[derive(Deserialize, Default)]
struct DiffQuery {
    /// Baseline selector, e.g. `version=1.4`.
    a: String,
    /// Compared selector, e.g. `version=1.5`.
    b: String,
    #[serde(default)]
    from: u64,
    #[serde(default)]
    to: u64,
}

/// Two selections compared with each stored (host, window) as a replicate: the verdicts of
/// `phaseprof diff` across the fleet. Windows are decoded one at a time per core and only
/// their digests kept.
async fn diff(
    State(s): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<DiffQuery>,
) -> Result<Response, WebError> {
    check_read(&s, &headers)?;
    let report = blocking(&s.clone(), move || {
        let side = |sel: &str| {
            let query = SelectorQuery {
                sel: sel.to_string(),
                from: q.from,
                to: q.to,
            };
            Ok::<_, WebError>(digest_bodies(&selected_bodies(&s, &query)?)?)
        };
        let (a, b) = (side(&q.a)?, side(&q.b)?);
        Ok(phaseprof_model::diff::diff_digests(
            &a,
            &b,
            &phaseprof_model::diff::DiffOptions::default(),
        ))
    })
    .await?;
    Ok(Json(report).into_response())
}

/// Every label key with the values seen (the pages' label pickers).
async fn labels(State(s): State<AppState>, headers: HeaderMap) -> Result<Response, WebError> {
    check_read(&s, &headers)?;
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for w in s.store.windows(&Selector::default())? {
        for (k, v) in w.labels {
            out.entry(k).or_default().insert(v);
        }
    }
    Ok(Json(out).into_response())
}

/// Prometheus text. Reads counters only, never the store, so it answers at once whatever the
/// store or the uploads are doing.
async fn metrics(State(s): State<AppState>) -> Result<Response, WebError> {
    let m = &s.metrics;
    let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let c = &m.connections;
    let text = format!(
        "# TYPE phaseprof_collector_windows_received_total counter\n\
         phaseprof_collector_windows_received_total {}\n\
         # TYPE phaseprof_collector_windows_duplicate_total counter\n\
         phaseprof_collector_windows_duplicate_total {}\n\
         # TYPE phaseprof_collector_bytes_received_total counter\n\
         phaseprof_collector_bytes_received_total {}\n\
         # TYPE phaseprof_collector_rejected_total counter\n\
         phaseprof_collector_rejected_total{{reason=\"unauthorized\"}} {}\n\
         phaseprof_collector_rejected_total{{reason=\"forbidden_labels\"}} {}\n\
         phaseprof_collector_rejected_total{{reason=\"malformed\"}} {}\n\
         phaseprof_collector_rejected_total{{reason=\"too_large\"}} {}\n\
         phaseprof_collector_rejected_total{{reason=\"rate_limited\"}} {}\n\
         phaseprof_collector_rejected_total{{reason=\"busy\"}} {}\n\
         phaseprof_collector_rejected_total{{reason=\"body_timeout\"}} {}\n\
         # TYPE phaseprof_collector_connections_open gauge\n\
         phaseprof_collector_connections_open {}\n\
         # TYPE phaseprof_collector_connections_refused_total counter\n\
         phaseprof_collector_connections_refused_total {}\n\
         # TYPE phaseprof_collector_connections_timed_out_total counter\n\
         phaseprof_collector_connections_timed_out_total {}\n\
         # TYPE phaseprof_collector_windows_stored gauge\n\
         phaseprof_collector_windows_stored {}\n",
        g(&m.windows_received),
        g(&m.windows_duplicate),
        g(&m.bytes_received),
        g(&m.rejected_unauthorized),
        g(&m.rejected_forbidden),
        g(&m.rejected_malformed),
        g(&m.rejected_too_large),
        g(&m.rejected_rate_limited),
        g(&m.rejected_busy),
        g(&m.rejected_timeout),
        g(&c.open),
        g(&c.refused),
        g(&c.timed_out),
        g(&m.windows_stored),
    );
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use phaseprof_model::*;
    use tower::ServiceExt;

    const TOKEN_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaa";
    const TOKEN_B: &str = "bbbbbbbbbbbbbbbbbbbbbbbb";

    fn state(max_body: usize) -> AppState {
        AppState {
            store: Arc::new(crate::sqlite::SqliteStore::memory().unwrap()),
            tokens: Arc::new(
                Tokens::parse("t", &format!("host-a {TOKEN_A}\nhost-b {TOKEN_B}\n")).unwrap(),
            ),
            read_token: None,
            limits: IngestLimits::new(
                max_body,
                8 << 20,
                4,
                Duration::from_secs(5),
                RateLimit::new(1000.0, 1000.0),
            ),
            queries: Arc::new(Semaphore::new(2)),
            metrics: Arc::new(Metrics::default()),
        }
    }

    /// One window of `host` with `samples` cpu samples in `burn`, starting at `start`.
    fn window(host: &str, samples: u64, start: u64) -> Vec<u8> {
        let mut b = ProfileBuilder::new(
            Meta {
                pids: vec![7],
                comm: "relay".into(),
                events: vec![EventKind::Cpu],
                start_unix_ns: start,
                end_unix_ns: start + 10,
                labels: [("host", host), ("service", "relay")]
                    .into_iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Meta::default()
            },
            vec![],
        );
        let f = b.intern_frame(Frame {
            function: "burn".into(),
            module: "relay".into(),
            kind: FrameKind::User,
            inlined: false,
        });
        let s = b.intern_stack(vec![f]);
        b.add_cpu(7, 7, PhaseAt::NONE, s, samples);
        let mut out = Vec::new();
        write_profile(&b.finish(), &mut out).unwrap();
        out
    }

    async fn request(
        s: &AppState,
        method: &str,
        uri: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> (StatusCode, serde_json::Value) {
        let mut req = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = app(s.clone())
            .oneshot(req.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
        )
    }

    async fn call(
        s: &AppState,
        method: &str,
        uri: &str,
        token: Option<&str>,
        body: Vec<u8>,
    ) -> (StatusCode, serde_json::Value) {
        let auth = token.map(|t| format!("Bearer {t}"));
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("authorization", a.as_str())).collect();
        request(s, method, uri, &headers, body).await
    }

    /// An upload as an agent sends it, with its Idempotency-Key.
    async fn upload(
        s: &AppState,
        token: &str,
        key: Option<&str>,
        body: Vec<u8>,
    ) -> (StatusCode, serde_json::Value) {
        let auth = format!("Bearer {token}");
        let mut headers = vec![("authorization", auth.as_str())];
        headers.extend(key.map(|k| ("idempotency-key", k)));
        request(s, "POST", "/api/v1/windows", &headers, body).await
    }

    // Checks the edges of ingest: a retry under the same Idempotency-Key gets the first copy's
    // id and stores nothing (another agent's same key is its own); a token whose line pins
    // host=a cannot write as host b (403); a window ending a day ahead is refused (retention
    // could never remove it); an agent over its rate gets 429 with Retry-After.
    #[tokio::test]
    async fn retries_pins_clocks_and_rates() {
        let mut s = state(1 << 20);
        s.tokens = Arc::new(
            Tokens::parse("t", &format!("host-a {TOKEN_A} host=a\nhost-b {TOKEN_B}\n")).unwrap(),
        );
        let w = window("a", 5, 100);
        let (st, first) = upload(&s, TOKEN_A, Some("k-1"), w.clone()).await;
        assert_eq!(st, StatusCode::CREATED, "{first}");
        let (st, again) = upload(&s, TOKEN_A, Some("k-1"), w.clone()).await;
        assert_eq!(st, StatusCode::OK, "{again}");
        assert_eq!(
            (again["id"].clone(), again["duplicate"].clone()),
            (first["id"].clone(), true.into())
        );
        let (st, _) = upload(&s, TOKEN_B, Some("k-1"), window("b", 1, 100)).await;
        assert_eq!(st, StatusCode::CREATED, "keys are per agent");
        assert_eq!(s.store.count().unwrap(), 2);
        assert_eq!(s.metrics.windows_duplicate.load(Ordering::Relaxed), 1);
        let (st, body) = upload(&s, TOKEN_A, None, window("b", 5, 100)).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{body}");
        assert!(body["error"].as_str().unwrap().contains("host=a"), "{body}");
        let (st, body) = upload(&s, TOKEN_A, Some("bad key!"), w.clone()).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{body}");
        let day_ahead = (now() + Duration::from_secs(86400)).as_nanos() as u64;
        let (st, body) = upload(&s, TOKEN_A, None, window("a", 5, day_ahead)).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{body}");
        assert!(body["error"].as_str().unwrap().contains("future"), "{body}");
        assert_eq!(s.store.count().unwrap(), 2, "nothing stored from refusals");
        s.limits.rate = Arc::new(RateLimit::new(0.001, 2.0));
        let mut statuses = Vec::new();
        for i in 0..3 {
            let (st, _) = upload(&s, TOKEN_B, None, window("b", 1, 200 + i)).await;
            statuses.push(st.as_u16());
        }
        assert_eq!(statuses, [201, 201, 429]);
        let req = Request::builder()
            .method("POST")
            .uri("/api/v1/windows")
            .header("authorization", format!("Bearer {TOKEN_B}"))
            .body(Body::from(window("b", 1, 300)))
            .unwrap();
        let resp = app(s.clone()).oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(resp.headers().contains_key(header::RETRY_AFTER));
    }

    // Checks a gzip bomb: 20 KiB that inflate to 64 MiB are refused with 413 once 8 MiB
    // (the test's --max-inflated) are inflated, nothing is stored, the refusal is counted, and
    // a real window still goes in.
    #[tokio::test]
    async fn gzip_bombs_are_refused_at_the_inflation_limit() {
        use std::io::Write;
        let s = state(1 << 20);
        let mut bomb = Vec::new();
        bomb.extend_from_slice(b"PHASEPROF\n");
        bomb.extend_from_slice(&1u32.to_le_bytes());
        let mut gz = flate2::write::GzEncoder::new(&mut bomb, flate2::Compression::best());
        let zeros = vec![b' '; 1 << 20];
        for _ in 0..64 {
            gz.write_all(&zeros).unwrap();
        }
        gz.finish().unwrap();
        assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
        let (st, body) = call(&s, "POST", "/api/v1/windows", Some(TOKEN_A), bomb).await;
        assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
        assert!(
            body["error"].as_str().unwrap().contains("--max-inflated"),
            "{body}"
        );
        assert_eq!(s.store.count().unwrap(), 0);
        assert_eq!(s.metrics.rejected_too_large.load(Ordering::Relaxed), 1);
        let (st, _) = call(
            &s,
            "POST",
            "/api/v1/windows",
            Some(TOKEN_A),
            window("a", 5, 100),
        )
        .await;
        assert_eq!(st, StatusCode::CREATED);
    }

    // Checks that malformed, truncated, oversized and unauthenticated uploads get 400/413/401
    // with a reason and leave the store unchanged, and that a good one is stored under the
    // token's agent.
    #[tokio::test]
    async fn bad_uploads_are_refused_and_store_nothing() {
        let s = state(64 * 1024);
        let good = window("a", 5, 100);
        let (st, body) = call(&s, "POST", "/api/v1/windows", None, good.clone()).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED, "{body}");
        let (st, _) = call(
            &s,
            "POST",
            "/api/v1/windows",
            Some("wrong-token-xxxxxxxxxx"),
            good.clone(),
        )
        .await;
        assert_eq!(st, StatusCode::UNAUTHORIZED);
        let (st, body) = call(
            &s,
            "POST",
            "/api/v1/windows",
            Some(TOKEN_A),
            b"garbage".to_vec(),
        )
        .await;
        assert_eq!(st, StatusCode::BAD_REQUEST);
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .contains("not a phaseprof window"),
            "{body}"
        );
        let truncated = good[..good.len() / 2].to_vec();
        let (st, body) = call(&s, "POST", "/api/v1/windows", Some(TOKEN_A), truncated).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{body}");
        let mut bad_index = read_profile(&good[..]).unwrap();
        bad_index.cpu[0].stack = 99;
        let mut bytes = Vec::new();
        write_profile(&bad_index, &mut bytes).unwrap();
        let (st, body) = call(&s, "POST", "/api/v1/windows", Some(TOKEN_A), bytes).await;
        assert_eq!(st, StatusCode::BAD_REQUEST);
        assert!(
            body["error"].as_str().unwrap().contains("stack 99"),
            "{body}"
        );
        let (st, _) = call(
            &s,
            "POST",
            "/api/v1/windows",
            Some(TOKEN_A),
            vec![0u8; 65 * 1024],
        )
        .await;
        assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(
            s.store.count().unwrap(),
            0,
            "nothing stored from bad uploads"
        );
        let (st, body) = call(&s, "POST", "/api/v1/windows", Some(TOKEN_A), good).await;
        assert_eq!(st, StatusCode::CREATED);
        assert_eq!(body["agent"], "host-a");
        assert_eq!(s.store.count().unwrap(), 1);
        assert_eq!(s.metrics.rejected_unauthorized.load(Ordering::Relaxed), 2);
        assert_eq!(s.metrics.rejected_malformed.load(Ordering::Relaxed), 3);
        assert_eq!(s.metrics.rejected_too_large.load(Ordering::Relaxed), 1);
    }

    // Checks queries: windows by label and time, the merged view equal to the sum of what was
    // uploaded, label pickers, and the read token when set.
    #[tokio::test]
    async fn merged_view_is_the_sum() {
        let s = state(1 << 20);
        for (host, token, samples, start) in [
            ("a", TOKEN_A, 5, 100),
            ("a", TOKEN_A, 7, 200),
            ("b", TOKEN_B, 11, 150),
        ] {
            let (st, _) = call(
                &s,
                "POST",
                "/api/v1/windows",
                Some(token),
                window(host, samples, start),
            )
            .await;
            assert_eq!(st, StatusCode::CREATED);
        }
        let (st, w) = call(&s, "GET", "/api/v1/windows?sel=host%3Da", None, vec![]).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(w.as_array().unwrap().len(), 2);
        let (_, all) = call(&s, "GET", "/api/v1/merged", None, vec![]).await;
        assert_eq!(all["events"]["cpu"]["samples"], 23);
        let (_, a) = call(
            &s,
            "GET",
            "/api/v1/merged?sel=host%3Da&from=150",
            None,
            vec![],
        )
        .await;
        assert_eq!(a["events"]["cpu"]["samples"], 7);
        let (st, _) = call(&s, "GET", "/api/v1/merged?sel=host%3Dz", None, vec![]).await;
        assert_eq!(st, StatusCode::NOT_FOUND);
        let (st, _) = call(&s, "GET", "/api/v1/merged?sel=oops", None, vec![]).await;
        assert_eq!(st, StatusCode::BAD_REQUEST);
        let (st, d) = call(
            &s,
            "GET",
            "/api/v1/diff?a=host%3Da&b=host%3Db",
            None,
            vec![],
        )
        .await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(
            (d["a_runs"].as_u64(), d["b_runs"].as_u64()),
            (Some(2), Some(1))
        );
        let (st, _) = call(
            &s,
            "GET",
            "/api/v1/diff?a=host%3Da&b=host%3Dz",
            None,
            vec![],
        )
        .await;
        assert_eq!(st, StatusCode::NOT_FOUND);
        let (_, labels) = call(&s, "GET", "/api/v1/labels", None, vec![]).await;
        assert_eq!(labels["host"], serde_json::json!(["a", "b"]));
        let mut locked = s.clone();
        locked.read_token = Some("r".repeat(20).into());
        let (st, _) = call(&locked, "GET", "/api/v1/merged", None, vec![]).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED);
        let (st, _) = call(
            &locked,
            "GET",
            "/api/v1/merged",
            Some(&"r".repeat(20)),
            vec![],
        )
        .await;
        assert_eq!(st, StatusCode::OK);
    }
}
