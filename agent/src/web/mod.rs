//! phaseprof over HTTP: `serve` (saved profiles) and `attach` (live windows) share this app.
//! Pages are askama templates with their CSS and script compiled into the binary (no CDN: the
//! page works offline); every page's data is also under `/api/`.
use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use phaseprof_model::{EventKind, Profile};
use serde::Serialize;

mod api;
mod auth;
mod pages;

/// Where the app's profiles come from: saved files, or the rolling windows of a live attach.
pub trait ProfileSource: Send + Sync + 'static {
    /// Every profile, in display order.
    fn list(&self) -> Vec<ProfileEntry>;
    fn get(&self, id: &str) -> Option<Arc<Profile>>;
    /// Pages listing profiles reload themselves this often (seconds; 0: never).
    fn refresh_s(&self) -> u32 {
        0
    }
    /// The heading of the index page.
    fn heading(&self) -> String {
        "Profiles".into()
    }
}

/// One profile as listed.
#[derive(Clone, Debug, Serialize)]
pub struct ProfileEntry {
    pub id: String,
    pub name: String,
    pub comm: String,
    pub pids: Vec<u32>,
    pub start_unix_ns: u64,
    pub duration_ns: u64,
    pub events: Vec<EventKind>,
}

impl ProfileEntry {
    pub fn of(id: String, name: String, p: &Profile) -> Self {
        ProfileEntry {
            id,
            name,
            comm: p.meta.comm.clone(),
            pids: p.meta.pids.clone(),
            start_unix_ns: p.meta.start_unix_ns,
            duration_ns: p.duration_ns(),
            events: p.meta.events.clone(),
        }
    }
}

/// Saved profiles (`serve FILE...`), ids are their positions.
pub struct SavedProfiles {
    entries: Vec<(ProfileEntry, Arc<Profile>)>,
}

impl SavedProfiles {
    /// `(display name, profile)` pairs.
    pub fn new(profiles: Vec<(String, Profile)>) -> Self {
        SavedProfiles {
            entries: profiles
                .into_iter()
                .enumerate()
                .map(|(i, (name, p))| (ProfileEntry::of(i.to_string(), name, &p), Arc::new(p)))
                .collect(),
        }
    }
}

impl ProfileSource for SavedProfiles {
    fn list(&self) -> Vec<ProfileEntry> {
        self.entries.iter().map(|(e, _)| e.clone()).collect()
    }
    fn get(&self, id: &str) -> Option<Arc<Profile>> {
        self.entries
            .iter()
            .find(|(e, _)| e.id == id)
            .map(|(_, p)| p.clone())
    }
}

#[derive(Clone)]
pub struct AppState {
    pub source: Arc<dyn ProfileSource>,
    /// Required on every request when set (bearer header, `?token=`, or the cookie the latter
    /// sets).
    pub token: Option<Arc<str>>,
}

/// The one error type of the app: a status and a message, as JSON under `/api/`, as text
/// elsewhere.
#[derive(Debug)]
pub struct WebError {
    pub status: StatusCode,
    pub message: String,
}

impl WebError {
    pub fn not_found(what: impl Into<String>) -> Self {
        WebError {
            status: StatusCode::NOT_FOUND,
            message: what.into(),
        }
    }
    pub fn bad_request(what: impl Into<String>) -> Self {
        WebError {
            status: StatusCode::BAD_REQUEST,
            message: what.into(),
        }
    }
    pub fn internal(what: impl std::fmt::Display) -> Self {
        WebError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: what.to_string(),
        }
    }
}

impl IntoResponse for WebError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": self.message});
        (self.status, axum::Json(body)).into_response()
    }
}

const CSS: &str = include_str!("../../assets/app.css");
const JS: &str = include_str!("../../assets/app.js");

/// The router: pages, downloads, the JSON API and the embedded assets, behind the token check.
pub fn app(state: AppState) -> Router {
    Router::new()
        .route("/", get(pages::index))
        .route("/profile/{id}", get(pages::profile))
        .route("/profile/{id}/flamegraph/{file}", get(api::flamegraph))
        .route("/profile/{id}/{file}", get(api::download))
        .route("/diff", get(pages::diff))
        .route("/diff.svg", get(api::diff_svg))
        .route("/api/profiles", get(api::profiles))
        .route("/api/profiles/{id}", get(api::summary))
        .route("/api/profiles/{id}/top", get(api::top))
        .route("/api/profiles/{id}/syscalls", get(api::syscalls))
        .route("/api/profiles/{id}/phases", get(api::phases))
        .route("/api/diff", get(api::diff))
        .route(
            "/assets/app.css",
            get(|| async { ([(header::CONTENT_TYPE, "text/css")], CSS) }),
        )
        .route(
            "/assets/app.js",
            get(|| async { ([(header::CONTENT_TYPE, "text/javascript")], JS) }),
        )
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_token,
        ))
        .with_state(state)
}

/// Listening beyond loopback exposes symbol names, command lines and host details to whoever
/// can reach the port: it needs a token.
pub fn check_listen(addr: SocketAddr, token: Option<&str>) -> anyhow::Result<()> {
    if !addr.ip().is_loopback() && token.is_none_or(str::is_empty) {
        anyhow::bail!(
            "refusing to listen on {addr} without --token: profiles show function names, command lines \
             and host details to anyone who can reach the port. Pass --token SECRET (clients then send \
             `Authorization: Bearer SECRET`, or open the page once with ?token=SECRET), or listen on \
             127.0.0.1"
        );
    }
    Ok(())
}

/// Serves `state` on `addr` until Ctrl-C (or `stop` resolves).
pub async fn serve(
    addr: SocketAddr,
    state: AppState,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    eprintln!("phaseprof: serving on http://{}/", listener.local_addr()?);
    axum::serve(listener, app(state))
        .with_graceful_shutdown(stop)
        .await?;
    Ok(())
}
