//! Ingest: one window per upload, checked in order of cost before anything is stored.
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use phaseprof_view::web::WebError;
use tokio::sync::Semaphore;

use phaseprof_model::{FrameFields, Meta, Profile};

use super::{bearer, AppState};
use crate::tokens::Agent;

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
    /// Upload slots per agent: a quarter of `uploads` (at least 1), so one token's slow bodies
    /// leave the other agents three quarters.
    pub per_agent: Arc<AgentSlots>,
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
            per_agent: Arc::new(AgentSlots {
                max: (max_uploads / 4).max(1),
                taken: Mutex::new(HashMap::new()),
            }),
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

/// Upload slots taken per agent.
pub struct AgentSlots {
    max: usize,
    taken: Mutex<HashMap<String, usize>>,
}

/// One upload's place in its agent's count, given back when dropped.
struct AgentSlot {
    slots: Arc<AgentSlots>,
    agent: String,
}

impl AgentSlots {
    fn take(slots: &Arc<AgentSlots>, agent: &str) -> Option<AgentSlot> {
        let mut taken = slots.taken.lock().unwrap_or_else(|e| e.into_inner());
        let n = taken.entry(agent.to_string()).or_default();
        if *n >= slots.max {
            return None;
        }
        *n += 1;
        Some(AgentSlot {
            slots: slots.clone(),
            agent: agent.to_string(),
        })
    }
}

impl Drop for AgentSlot {
    fn drop(&mut self) {
        let mut taken = self.slots.taken.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = taken.get_mut(&self.agent) {
            *n -= 1;
            if *n == 0 {
                taken.remove(&self.agent);
            }
        }
    }
}

/// Why an upload's window was refused after reading it.
enum Rejected {
    TooLarge(String),
    Malformed(String),
    Forbidden(String),
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

/// The first checks of an upload, from its headers alone: the agent its token names (401), a
/// well-formed Idempotency-Key (400), the agent's rate (429).
fn admit(s: &AppState, headers: &HeaderMap) -> Result<(Agent, Option<String>), WebError> {
    let Some(entry) = bearer(headers).and_then(|t| s.tokens.agent(t)).cloned() else {
        s.metrics
            .rejected_unauthorized
            .fetch_add(1, Ordering::Relaxed);
        return Err(WebError::new(
            StatusCode::UNAUTHORIZED,
            "unknown or missing agent token".into(),
        ));
    };
    let key = idempotency_key(headers)?;
    let agent = &entry.name;
    if let Err(wait) = s.limits.rate.take(agent) {
        s.metrics
            .rejected_rate_limited
            .fetch_add(1, Ordering::Relaxed);
        return Err(WebError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("agent `{agent}` is over its upload rate (--agent-rate); retry in {wait} s"),
        ));
    }
    Ok((entry, key))
}

/// `POST /api/v1/windows`: stores one window. In order, each before any further cost: the
/// agent is named by its token (401, before a byte of the body is read); its rate (429); a
/// declared length over
/// `--max-body` (413); an upload slot (503 after `UPLOAD_WAIT`); the body within
/// `body_timeout` (408) and `--max-body` (413); then, on the blocking pool under a decoder slot,
/// the window must decode within `--max-inflated` (413), validate (400), carry a `host` label,
/// agree with the labels the tokens file pins to this agent (403), and not end in the future
/// (400). Nothing is stored unless all of that holds; a retry with the same Idempotency-Key
/// gets the first copy's id (200) instead of a second copy.
pub(super) async fn ingest(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, WebError> {
    let stored = receive(&s, &headers, body, Upload::Window).await?;
    let mut answer = serde_json::json!({"id": stored.ids.first(), "agent": stored.agent});
    if stored.duplicate {
        answer["duplicate"] = true.into();
        return Ok(Json(answer).into_response());
    }
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// What an upload's body holds.
pub(super) enum Upload {
    /// A phaseprof window, stored as sent.
    Window,
    /// A pprof profile (another agent's push) to store as a window with these labels and time
    /// range (`host` added from the token where it has none).
    Pprof {
        meta: Box<Meta>,
        content_type: String,
    },
    /// An OTLP profiles export request (protobuf): a window per resource, labelled by its
    /// attributes.
    Otlp,
}

/// An upload stored (or found stored already: `duplicate`).
pub(super) struct Received {
    /// The windows stored, one per upload but for OTLP (one per resource).
    pub ids: Vec<i64>,
    pub agent: String,
    pub duplicate: bool,
    /// Sample types another agent's profile had that nothing stores.
    pub ignored: Vec<String>,
}

/// Receives one upload (see `ingest` for the checks, in order) and stores it.
pub(super) async fn receive(
    s: &AppState,
    headers: &HeaderMap,
    body: axum::body::Body,
    upload: Upload,
) -> Result<Received, WebError> {
    let (entry, key) = admit(s, headers)?;
    let agent = entry.name.clone();
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
    let Some(_agent_slot) = AgentSlots::take(&l.per_agent, &agent) else {
        s.metrics.rejected_busy.fetch_add(1, Ordering::Relaxed);
        return Err(WebError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "agent `{agent}` has {} uploads in progress already (a quarter of --max-uploads); retry",
                l.per_agent.max
            ),
        ));
    };
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
    let (raw, max_inflated, store) = (body.clone(), l.max_inflated, s.store.clone());
    let checked = tokio::task::spawn_blocking(move || {
        let d = decode(&raw, max_inflated, upload, &entry, store.stored())?;
        Ok((d.windows, d.ignored))
    })
    .await
    .map_err(|e| WebError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    drop(decoder);
    let (windows, ignored) = match checked {
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
    let mut received = store_windows(s, agent, key, windows, &body).await?;
    received.ignored = ignored;
    Ok(received)
}

/// Stores an upload's windows (`body` as received, for those stored as sent) under `key`.
async fn store_windows(
    s: &AppState,
    agent: String,
    key: Option<String>,
    windows: Vec<(crate::rows::WindowRows, Option<Vec<u8>>)>,
    body: &Bytes,
) -> Result<Received, WebError> {
    let mut received = Received {
        ids: Vec::with_capacity(windows.len()),
        agent: agent.clone(),
        duplicate: false,
        ignored: Vec::new(),
    };
    let several = windows.len() > 1;
    for (i, (rows, stored)) in windows.into_iter().enumerate() {
        // Each window of an upload that made several is its own under the key.
        let key = key.as_ref().map(|k| {
            if several {
                format!("{k}:{i}")
            } else {
                k.clone()
            }
        });
        let window = crate::store::NewWindow {
            agent: agent.clone(),
            key,
            rows,
            body: stored.unwrap_or_else(|| body.to_vec()),
        };
        let store = s.store.clone();
        let inserted = tokio::task::spawn_blocking(move || store.insert(window))
            .await
            .map_err(|e| WebError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
        received.ids.push(inserted.id);
        if inserted.duplicate {
            s.metrics.windows_duplicate.fetch_add(1, Ordering::Relaxed);
            received.duplicate = true;
        } else {
            s.metrics.windows_received.fetch_add(1, Ordering::Relaxed);
            s.metrics.windows_stored.fetch_add(1, Ordering::Relaxed);
        }
    }
    if !received.duplicate {
        s.metrics
            .bytes_received
            .fetch_add(body.len() as u64, Ordering::Relaxed);
    }
    Ok(received)
}

/// An upload's body as windows' rows.
struct Decoded {
    /// Each window's rows, and what to store of it: None for the body as sent (a phaseprof
    /// window), else the window another agent's profile made.
    windows: Vec<(crate::rows::WindowRows, Option<Vec<u8>>)>,
    /// The sample types another agent's profile had that nothing stores.
    ignored: Vec<String>,
}

/// An upload's body as windows, within `max_inflated`, each checked (`check_window`) and split
/// into rows: a phaseprof window as sent (its names never copied but those not `stored` yet), or
/// those another agent's profile made (one for pprof, one per resource for OTLP), each without a
/// `host` label given the token's pinned host, else its name.
fn decode(
    raw: &[u8],
    max_inflated: u64,
    upload: Upload,
    agent: &Agent,
    stored: &crate::rows::Stored,
) -> Result<Decoded, Rejected> {
    use phaseprof_view::import::{otlp::windows_from_otlp, pprof::window_from_pprof, ImportError};
    let refused = |e: ImportError| match e {
        ImportError::TooLarge(_) => Rejected::TooLarge(format!("{e} (--max-inflated)")),
        e => Rejected::Malformed(e.to_string()),
    };
    let imported = match upload {
        Upload::Window => {
            let rows = match phaseprof_model::read_window_limited(raw, max_inflated, |p| {
                check_window(&p, agent, stored)
            }) {
                Ok(rows) => rows?,
                Err(e @ phaseprof_model::FormatError::TooLarge { .. }) => {
                    return Err(Rejected::TooLarge(format!("{e} (--max-inflated)")))
                }
                Err(e @ phaseprof_model::FormatError::OverLimit(_)) => {
                    return Err(Rejected::Malformed(e.to_string()))
                }
                Err(e) => return Err(Rejected::Malformed(format!("not a phaseprof window: {e}"))),
            };
            return Ok(Decoded {
                windows: vec![(rows, None)],
                ignored: Vec::new(),
            });
        }
        Upload::Pprof { meta, content_type } => {
            let pprof =
                super::multipart::profile_part(raw, &content_type).map_err(Rejected::Malformed)?;
            vec![window_from_pprof(pprof, max_inflated, *meta).map_err(refused)?]
        }
        Upload::Otlp => windows_from_otlp(raw, max_inflated, &Meta::default()).map_err(refused)?,
    };
    let mut decoded = Decoded {
        windows: Vec::with_capacity(imported.len()),
        ignored: Vec::new(),
    };
    for mut w in imported {
        let labels = &mut w.profile.meta.labels;
        if !labels.contains_key("host") {
            let host = agent.pins.get("host").unwrap_or(&agent.name);
            labels.insert("host".into(), host.clone());
        }
        let mut body = Vec::new();
        phaseprof_model::write_profile(&w.profile, &mut body)
            .map_err(|e| Rejected::Malformed(format!("the profile could not be stored: {e}")))?;
        let rows = check_window(&w.profile, agent, stored)?;
        decoded.windows.push((rows, Some(body)));
        decoded.ignored.extend(w.ignored);
    }
    Ok(decoded)
}

/// Whether a window is one this agent may store: it validates, has a `host` label, carries
/// the labels the agent's token pins, and does not end in the future. Its rows (split here, on
/// the decoding worker), or why not.
fn check_window<F: FrameFields>(
    profile: &Profile<F>,
    agent: &Agent,
    stored: &crate::rows::Stored,
) -> Result<crate::rows::WindowRows, Rejected> {
    if let Err(e) = profile.validate() {
        return Err(Rejected::Malformed(format!("invalid window: {e}")));
    }
    let m = &profile.meta;
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
    Ok(crate::rows::split(profile, stored))
}

pub(super) fn now() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}
