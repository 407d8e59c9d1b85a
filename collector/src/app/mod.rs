//! The collector's HTTP app: `POST /api/v1/windows` (ingest, in `ingest`), `POST /ingest`
//! (Pyroscope's push API: `pyroscope_push`), `POST /v1development/profiles` (OTLP profiles:
//! `otlp_push`), queries over what is stored (`queries`; Pyroscope's query API:
//! `pyroscope_query`), and `/metrics`.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use phaseprof_view::web::server::ConnectionCounters;
use phaseprof_view::web::{auth, WebError};
use tokio::sync::Semaphore;

use crate::store::{Store, StoreError};
use crate::tokens::Tokens;

mod ingest;
mod multipart;
mod otlp_push;
mod pyroscope_push;
mod pyroscope_query;
mod queries;
#[cfg(test)]
mod tests;

use ingest::ingest;
pub use ingest::{IngestLimits, RateLimit};
use queries::{diff, labels, merged, merged_download, store_footprint, window_download, windows};

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

/// A store failure is the server's (500), with the store's reason (credentials redacted).
impl From<StoreError> for WebError {
    fn from(e: StoreError) -> Self {
        // Logged too: the operator reads the journal, not the agents' retries. (Not eprintln:
        // a closed stderr must not turn a store error into a panic.)
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "phaseprof-collector: store error: {e}");
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
        .route(
            "/ingest",
            post(pyroscope_push::pyroscope_push).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/v1development/profiles",
            post(otlp_push::otlp_push).layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/querier.v1.QuerierService/{method}",
            post(pyroscope_query::pyroscope_query),
        )
        .route("/api/v1/windows/{id}", get(window_download))
        .route("/api/v1/merged", get(merged))
        .route("/api/v1/merged.phaseprof", get(merged_download))
        .route("/api/v1/labels", get(labels))
        .route("/api/v1/store", get(store_footprint))
        .route("/api/v1/diff", get(diff))
        .route("/metrics", get(metrics))
        .layer(axum::middleware::from_fn(auth::security_headers))
        .with_state(state)
}

/// Prometheus text. Reads counters only, never the store, so it answers at once whatever the
/// store or the uploads are doing.
async fn metrics(State(s): State<AppState>, headers: HeaderMap) -> Result<Response, WebError> {
    // As the queries: the read token where one is set, else a loopback Host (DNS rebinding).
    queries::check_read(&s, &headers)?;
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
         # TYPE phaseprof_collector_connections_refused_per_address_total counter\n\
         phaseprof_collector_connections_refused_per_address_total {}\n\
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
        g(&c.refused_per_address),
        g(&c.timed_out),
        g(&m.windows_stored),
    );
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}
