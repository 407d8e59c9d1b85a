//! `POST /v1development/profiles`: OTLP profiles over HTTP, as the OpenTelemetry Collector's
//! exporters and the OpenTelemetry eBPF profiler send them (protobuf, gzipped or not): a window
//! per resource, labelled by its attributes (`service.name`, `service.version`, `host.name`).
//! The token and label rules are the agent's: the bearer token names the sender, its pins must
//! hold, and a resource without `host.name` takes the pinned host or the token's name.
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use phaseprof_view::web::WebError;
use prost::Message;

use super::ingest::{receive, Upload};
use super::AppState;

pub(super) async fn otlp_push(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, WebError> {
    let content_type = (headers.get(header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !content_type.starts_with("application/x-protobuf") {
        return Err(WebError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "Content-Type `{content_type}`: the collector takes OTLP as protobuf \
                 (application/x-protobuf), not JSON"
            ),
        ));
    }
    let stored = receive(&s, &headers, body, Upload::Otlp).await?;
    // An empty ExportProfilesServiceResponse where everything was stored; else a partial
    // success naming the profiles' sample types left out.
    let answer = if stored.ignored.is_empty() {
        ExportResponse::default()
    } else {
        ExportResponse {
            partial_success: Some(PartialSuccess {
                rejected_profiles: stored.ignored.len() as i64,
                error_message: format!(
                    "sample types the collector does not store: {}",
                    stored.ignored.join(", ")
                ),
            }),
        }
    };
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        answer.encode_to_vec(),
    )
        .into_response())
}

#[derive(Clone, PartialEq, prost::Message)]
struct ExportResponse {
    #[prost(message, optional, tag = "1")]
    partial_success: Option<PartialSuccess>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PartialSuccess {
    #[prost(int64, tag = "1")]
    rejected_profiles: i64,
    #[prost(string, tag = "2")]
    error_message: String,
}
