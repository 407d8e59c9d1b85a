//! `POST /ingest`: Pyroscope's push API, so that what Pyroscope's SDKs and Grafana Alloy send
//! lands in the same store as the agent's windows. The query names the application and its
//! labels (`name=app{k=v,…}`) and the time range (`from`, `until`); the body is a pprof profile
//! (multipart, as the SDKs send it, or bare). The token and the label rules are the agent's:
//! the bearer token names the sender, its pins must hold, and a profile without a `host` label
//! takes the pinned host or the token's name.
use std::collections::BTreeMap;

use axum::extract::{Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use phaseprof_model::Meta;
use phaseprof_view::web::WebError;
use serde::Deserialize;

use super::ingest::{receive, Upload};
use super::AppState;

#[derive(Deserialize)]
pub(super) struct PushQuery {
    name: String,
    #[serde(default)]
    from: Option<u64>,
    #[serde(default)]
    until: Option<u64>,
    #[serde(default)]
    format: Option<String>,
}

/// Labels one push may carry, and their longest key and value: what the agent's own labels
/// come to, with room.
const MAX_LABELS: usize = 32;
const MAX_LABEL_LEN: usize = 200;

pub(super) async fn pyroscope_push(
    State(s): State<AppState>,
    Query(q): Query<PushQuery>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, WebError> {
    let bad = |why: String| WebError::new(StatusCode::BAD_REQUEST, why);
    if let Some(f) = q.format.as_deref().filter(|f| *f != "pprof") {
        return Err(bad(format!(
            "format `{f}`: the collector takes pprof only (Pyroscope's SDKs send it)"
        )));
    }
    let labels = labels_of(&q.name).map_err(bad)?;
    let (start, end) = (unix_ns(q.from), unix_ns(q.until));
    let meta = Meta {
        comm: labels["service"].clone(),
        start_unix_ns: start,
        end_unix_ns: end.max(start),
        labels,
        ..Meta::default()
    };
    let content_type = (headers.get(header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let upload = Upload::Pprof {
        meta: Box::new(meta),
        content_type,
    };
    let stored = receive(&s, &headers, body, upload).await?;
    // 200, as Pyroscope answers: its SDKs take anything else for a failure.
    Ok(Json(serde_json::json!({
        "id": stored.ids.first(),
        "agent": stored.agent,
        "duplicate": stored.duplicate,
        "ignored_sample_types": stored.ignored,
    }))
    .into_response())
}

/// The labels of a push's `name`, `app.name{key=value,…}`: `service` is the application's
/// name (or its `service_name` label); Pyroscope's own (`__session_id__` …) are left out.
fn labels_of(name: &str) -> Result<BTreeMap<String, String>, String> {
    let (app, rest) = name.split_once('{').unwrap_or((name, "}"));
    let inner = (rest.strip_suffix('}'))
        .ok_or_else(|| format!("name `{name}`: the labels must end in `}}`"))?;
    let mut labels = BTreeMap::new();
    for pair in inner.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = (pair.split_once('='))
            .ok_or_else(|| format!("name `{name}`: label `{pair}` is not key=value"))?;
        let (k, v) = (k.trim(), v.trim().trim_matches('"'));
        if k.starts_with("__") {
            continue;
        }
        let key_ok =
            !k.is_empty() && (k.bytes()).all(|b| b.is_ascii_alphanumeric() || b"_.".contains(&b));
        let value_ok = !v.is_empty() && !v.contains([',', '=', '\n']);
        if !key_ok || !value_ok || k.len() > MAX_LABEL_LEN || v.len() > MAX_LABEL_LEN {
            return Err(format!(
                "name `{name}`: label `{pair}` (keys are letters, digits, _ and .; values are not \
                 empty and hold no `,` or `=`; at most {MAX_LABEL_LEN} bytes each)"
            ));
        }
        labels.insert(k.to_string(), v.to_string());
    }
    let app = app.trim();
    let service = labels
        .remove("service_name")
        .unwrap_or_else(|| app.to_string());
    if service.is_empty() || service.len() > MAX_LABEL_LEN {
        return Err(format!("name `{name}`: no application name"));
    }
    labels.insert("service".into(), service);
    if let Some(h) = labels.remove("hostname") {
        labels.entry("host".into()).or_insert(h);
    }
    if labels.len() > MAX_LABELS {
        return Err(format!("name `{name}`: more than {MAX_LABELS} labels"));
    }
    Ok(labels)
}

/// A push's time in ns since the epoch: Pyroscope's SDKs send ns, older ones seconds.
fn unix_ns(t: Option<u64>) -> u64 {
    match t {
        Some(t) if t < 100_000_000_000 => t.saturating_mul(1_000_000_000),
        Some(t) => t,
        None => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Checks the name: the application is `service`, labels kept but Pyroscope's own,
    // `hostname` taken as `host`, and what is refused.
    #[test]
    fn a_push_name_gives_the_labels() {
        let name = "relay{__session_id__=ab12,otel.scope.name=x/go,version=1.2.3,hostname=n1}";
        let l = labels_of(name).unwrap();
        let want: BTreeMap<String, String> = [
            ("service", "relay"),
            ("otel.scope.name", "x/go"),
            ("version", "1.2.3"),
            ("host", "n1"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
        assert_eq!(l, want);
        assert_eq!(labels_of("relay").unwrap().len(), 1);
        assert_eq!(
            labels_of("x{service_name=relay}").unwrap()["service"],
            "relay"
        );
        assert!(labels_of("relay{version=1").is_err());
        assert!(labels_of("relay{a b=1}").is_err());
        assert!(labels_of("{}").is_err());
        assert_eq!(unix_ns(Some(1_700_000_000)), 1_700_000_000_000_000_000);
        assert_eq!(
            unix_ns(Some(1_700_000_000_123_456_789)),
            1_700_000_000_123_456_789
        );
    }
}
