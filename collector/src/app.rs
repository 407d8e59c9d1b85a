//! The collector's HTTP app: `POST /api/v1/windows` (ingest), and queries over what is stored.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use phaseprof_model::summary::Summary;
use phaseprof_model::Profile;
use serde::Deserialize;

use crate::merged::{decode, merge_bodies};
use crate::store::{Selector, Store, StoreError};
use crate::tokens::Tokens;

/// Counters for `/metrics`.
#[derive(Default)]
pub struct Metrics {
    pub windows_received: AtomicU64,
    pub bytes_received: AtomicU64,
    pub rejected_unauthorized: AtomicU64,
    pub rejected_malformed: AtomicU64,
    pub rejected_too_large: AtomicU64,
}

#[derive(Clone)]
pub struct AppState {
    pub store: Arc<dyn Store>,
    pub tokens: Arc<Tokens>,
    /// Bearer token for queries; None: queries are open (loopback deployments).
    pub read_token: Option<Arc<str>>,
    pub max_body: usize,
    /// Largest window accepted once inflated, in bytes (gzip bombs stop there).
    pub max_inflated: u64,
    pub metrics: Arc<Metrics>,
}

/// Why an upload's window was refused after reading it.
enum Rejected {
    TooLarge(String),
    Malformed(String),
}

/// The one error type: a status and a reason, as JSON.
#[derive(Debug)]
pub struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(serde_json::json!({"error": self.1}))).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
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
    let max_body = state.max_body;
    Router::new()
        .route(
            "/api/v1/windows",
            post(ingest)
                .layer(DefaultBodyLimit::max(max_body))
                .get(windows),
        )
        .route("/api/v1/merged", get(merged))
        .route("/api/v1/merged.phaseprof", get(merged_download))
        .route("/api/v1/labels", get(labels))
        .route("/api/v1/diff", get(diff))
        .route("/metrics", get(metrics))
        .layer(axum::middleware::from_fn(
            phaseprof::web::auth::security_headers,
        ))
        .with_state(state)
}

/// Stores one window: the agent is named by its token (401 otherwise, before a byte of the body
/// is read); the body is a whole `.phaseprof` that decodes and validates (400 with the reason
/// otherwise); too large is 413, compressed (`--max-body`) or inflated (`--max-inflated`).
/// Decoding runs on the blocking pool, not on the async workers that answer other requests.
/// Nothing is stored unless all of that holds.
async fn ingest(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let Some(agent) = bearer(&headers)
        .and_then(|t| s.tokens.agent(t))
        .map(String::from)
    else {
        s.metrics
            .rejected_unauthorized
            .fetch_add(1, Ordering::Relaxed);
        return Err(ApiError(
            StatusCode::UNAUTHORIZED,
            "unknown or missing agent token".into(),
        ));
    };
    let too_large = |what: String| {
        s.metrics.rejected_too_large.fetch_add(1, Ordering::Relaxed);
        ApiError(StatusCode::PAYLOAD_TOO_LARGE, what)
    };
    let body: Bytes = axum::body::to_bytes(body, s.max_body).await.map_err(|_| {
        too_large(format!(
            "the body is larger than {} bytes (--max-body) or was cut off",
            s.max_body
        ))
    })?;
    let store = s.store.clone();
    let agent2 = agent.clone();
    let (raw, max_inflated) = (body.clone(), s.max_inflated);
    let stored =
        tokio::task::spawn_blocking(move || -> Result<Result<i64, Rejected>, StoreError> {
            let profile = match phaseprof_model::read_profile_limited(&raw[..], max_inflated) {
                Ok(p) => p,
                Err(e @ phaseprof_model::FormatError::TooLarge { .. }) => {
                    return Ok(Err(Rejected::TooLarge(format!("{e} (--max-inflated)"))))
                }
                Err(e) => {
                    return Ok(Err(Rejected::Malformed(format!(
                        "not a phaseprof window: {e}"
                    ))))
                }
            };
            if let Err(e) = profile.validate() {
                return Ok(Err(Rejected::Malformed(format!("invalid window: {e}"))));
            }
            let m = &profile.meta;
            if !m.labels.contains_key("host") {
                return Ok(Err(Rejected::Malformed(
                    "the window has no `host` label".into(),
                )));
            }
            store
                .insert(&agent2, &m.labels, m.start_unix_ns, m.end_unix_ns, &raw)
                .map(Ok)
        })
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    let id = match stored {
        Ok(id) => id,
        Err(Rejected::TooLarge(why)) => return Err(too_large(why)),
        Err(Rejected::Malformed(why)) => {
            s.metrics.rejected_malformed.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError(StatusCode::BAD_REQUEST, why));
        }
    };
    s.metrics.windows_received.fetch_add(1, Ordering::Relaxed);
    s.metrics
        .bytes_received
        .fetch_add(body.len() as u64, Ordering::Relaxed);
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({"id": id, "agent": agent})),
    )
        .into_response())
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

fn check_read(s: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    match &s.read_token {
        Some(t) if !bearer(headers).is_some_and(|b| phaseprof::web::auth::same(b, t)) => {
            Err(ApiError(
                StatusCode::UNAUTHORIZED,
                "queries need the read token".into(),
            ))
        }
        _ => Ok(()),
    }
}

fn selector(q: &SelectorQuery) -> Result<Selector, ApiError> {
    Ok(Selector {
        labels: Selector::parse_labels(&q.sel).map_err(|e| ApiError(StatusCode::BAD_REQUEST, e))?,
        from_ns: q.from,
        to_ns: q.to,
    })
}

async fn windows(
    State(s): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<SelectorQuery>,
) -> Result<Response, ApiError> {
    check_read(&s, &headers)?;
    Ok(Json(s.store.windows(&selector(&q)?)?).into_response())
}

/// The bodies of the windows `q` selects (404 when none matches).
fn selected_bodies(s: &AppState, q: &SelectorQuery) -> Result<Vec<Vec<u8>>, ApiError> {
    let bodies = s.store.bodies(&selector(q)?)?;
    if bodies.is_empty() {
        return Err(ApiError(
            StatusCode::NOT_FOUND,
            format!("no windows match `{}`", q.sel),
        ));
    }
    Ok(bodies)
}

/// Every window `q` selects, decoded.
fn selected(s: &AppState, q: &SelectorQuery) -> Result<Vec<Profile>, ApiError> {
    Ok(selected_bodies(s, q)?
        .iter()
        .map(|b| decode(b))
        .collect::<Result<Vec<_>, _>>()?)
}

/// Every selected window merged into one profile.
fn merge_selected(s: &AppState, q: &SelectorQuery) -> Result<Profile, ApiError> {
    Ok(merge_bodies(&selected_bodies(s, q)?)?)
}

/// Runs a query's store and merge work off the async workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}

async fn merged(
    State(s): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<SelectorQuery>,
) -> Result<Response, ApiError> {
    check_read(&s, &headers)?;
    let p = blocking(move || merge_selected(&s, &q)).await?;
    let mut json = serde_json::to_value(Summary::of(&p))
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    json["labels"] = serde_json::to_value(&p.meta.labels).unwrap_or_default();
    Ok(Json(json).into_response())
}

async fn merged_download(
    State(s): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<SelectorQuery>,
) -> Result<Response, ApiError> {
    check_read(&s, &headers)?;
    let p = blocking(move || merge_selected(&s, &q)).await?;
    let mut body = Vec::new();
    phaseprof_model::write_profile(&p, &mut body)
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
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
/// `phaseprof diff` across the fleet.
async fn diff(
    State(s): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<DiffQuery>,
) -> Result<Response, ApiError> {
    check_read(&s, &headers)?;
    let report = blocking(move || {
        let side = |sel: &str| {
            let query = SelectorQuery {
                sel: sel.to_string(),
                from: q.from,
                to: q.to,
            };
            selected(&s, &query)
        };
        let (a, b) = (side(&q.a)?, side(&q.b)?);
        Ok(phaseprof_model::diff::diff(
            &a,
            &b,
            &phaseprof_model::diff::DiffOptions::default(),
        ))
    })
    .await?;
    Ok(Json(report).into_response())
}

/// Every label key with the values seen (the pages' label pickers).
async fn labels(State(s): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    check_read(&s, &headers)?;
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for w in s.store.windows(&Selector::default())? {
        for (k, v) in w.labels {
            out.entry(k).or_default().insert(v);
        }
    }
    Ok(Json(out).into_response())
}

async fn metrics(State(s): State<AppState>) -> Result<Response, ApiError> {
    let m = &s.metrics;
    let stored = s.store.count()?;
    let text = format!(
        "# TYPE phaseprof_collector_windows_received_total counter\n\
         phaseprof_collector_windows_received_total {}\n\
         # TYPE phaseprof_collector_bytes_received_total counter\n\
         phaseprof_collector_bytes_received_total {}\n\
         # TYPE phaseprof_collector_rejected_total counter\n\
         phaseprof_collector_rejected_total{{reason=\"unauthorized\"}} {}\n\
         phaseprof_collector_rejected_total{{reason=\"malformed\"}} {}\n\
         phaseprof_collector_rejected_total{{reason=\"too_large\"}} {}\n\
         # TYPE phaseprof_collector_windows_stored gauge\n\
         phaseprof_collector_windows_stored {stored}\n",
        m.windows_received.load(Ordering::Relaxed),
        m.bytes_received.load(Ordering::Relaxed),
        m.rejected_unauthorized.load(Ordering::Relaxed),
        m.rejected_malformed.load(Ordering::Relaxed),
        m.rejected_too_large.load(Ordering::Relaxed),
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
            max_body,
            max_inflated: 8 << 20,
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

    async fn call(
        s: &AppState,
        method: &str,
        uri: &str,
        token: Option<&str>,
        body: Vec<u8>,
    ) -> (StatusCode, serde_json::Value) {
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
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
