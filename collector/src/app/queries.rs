//! Queries over stored windows (read token, or loopback Host without one): window lists,
//! merged views and downloads, diffs of two selections, label values.
use std::collections::{BTreeMap, BTreeSet};

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use phaseprof_model::summary::Summary;
use phaseprof_model::Profile;
use phaseprof_view::web::{auth, WebError};
use serde::Deserialize;

use super::AppState;
use crate::merged::{digests, merged_profile};
use crate::store::Selector;

#[derive(Deserialize, Default)]
pub(super) struct SelectorQuery {
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
pub(super) fn check_read(s: &AppState, headers: &HeaderMap) -> Result<(), WebError> {
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

pub(super) async fn windows(
    State(s): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<SelectorQuery>,
) -> Result<Response, WebError> {
    check_read(&s, &headers)?;
    Ok(Json(s.store.windows(&selector(&q)?)?).into_response())
}

fn none_match(q: &SelectorQuery) -> WebError {
    WebError::new(
        StatusCode::NOT_FOUND,
        format!("no windows match `{}`", q.sel),
    )
}

/// Every selected window merged into one profile, summed by the store (404 when none
/// matches).
fn merge_selected(s: &AppState, q: &SelectorQuery) -> Result<Profile, WebError> {
    merged_profile(s.store.as_ref(), &selector(q)?)?.ok_or_else(|| none_match(q))
}

/// One stored window as received (`GET /api/v1/windows/{id}.phaseprof`).
pub(super) async fn window_download(
    State(s): State<AppState>,
    headers: HeaderMap,
    axum::extract::Path(name): axum::extract::Path<String>,
) -> Result<Response, WebError> {
    check_read(&s, &headers)?;
    let id: i64 = (name.strip_suffix(".phaseprof").unwrap_or(&name).parse()).map_err(|_| {
        WebError::new(
            StatusCode::BAD_REQUEST,
            format!("`{name}` is not a window id"),
        )
    })?;
    let store = s.store.clone();
    let body = blocking(&s, move || Ok(store.body(id)?)).await?;
    let body =
        body.ok_or_else(|| WebError::new(StatusCode::NOT_FOUND, format!("no window has id {id}")))?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], body).into_response())
}

/// Runs a query's store and merge work off the async workers, as many at once as
/// `AppState::queries` allows (each merge already uses every core; more at once would only
/// multiply the memory).
pub(super) async fn blocking<T: Send + 'static>(
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

pub(super) async fn merged(
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

pub(super) async fn merged_download(
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
pub(super) struct DiffQuery {
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
/// `phaseprof diff` across the fleet, from each window's sums in the store.
pub(super) async fn diff(
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
            let d = digests(s.store.as_ref(), &selector(&query)?)?;
            if d.is_empty() {
                return Err(none_match(&query));
            }
            Ok(d)
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

/// What the store holds: windows, rows and bytes per table, bytes per window
/// (`GET /api/v1/store`).
pub(super) async fn store_footprint(
    State(s): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, WebError> {
    check_read(&s, &headers)?;
    let store = s.store.clone();
    let (windows, f) = blocking(&s, move || Ok((store.count()?, store.footprint()?))).await?;
    let per = |bytes: u64| (windows > 0).then(|| bytes as f64 / windows as f64);
    Ok(Json(serde_json::json!({
        "windows": windows,
        "tables": f.tables,
        "bytes": f.total_bytes,
        "body_bytes": f.body_bytes,
        "bytes_per_window": per(f.total_bytes),
        "body_bytes_per_window": per(f.body_bytes),
        // Null where the store cannot tell the bodies' bytes from the rest (ClickHouse).
        "rows_bytes_per_window": f
            .body_stored_bytes
            .and_then(|b| per(f.total_bytes.saturating_sub(b))),
    }))
    .into_response())
}

/// Every label key with the values seen (the pages' label pickers).
pub(super) async fn labels(
    State(s): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, WebError> {
    check_read(&s, &headers)?;
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for set in s.store.label_sets(&Selector::default())? {
        for (k, v) in set.labels {
            out.entry(k).or_default().insert(v);
        }
    }
    Ok(Json(out).into_response())
}
