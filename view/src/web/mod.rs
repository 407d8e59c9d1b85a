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
pub mod auth;
mod pages;
pub mod server;

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
    /// Label keys with their values, for a source whose profiles are label selections (the
    /// collector): the index page shows a picker, `/select?KEY=VALUE…` opens the selection.
    fn pickers(&self) -> Vec<LabelPicker> {
        Vec::new()
    }
    /// The profile id of a selection made with the pickers (`(key, value)` pairs, `last`: the
    /// time range); None when the source has no pickers.
    fn select(&self, _labels: &[(String, String)], _last: &str) -> Option<String> {
        None
    }
}

/// One label key and the values seen.
#[derive(Clone, Debug, Serialize)]
pub struct LabelPicker {
    pub key: String,
    pub values: Vec<String>,
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
    /// Served over HTTPS (the collector's `--tls-cert`): the token cookie is `Secure`.
    pub tls: bool,
}

/// The one error type of the app: a status and a message, as JSON under `/api/`, as text
/// elsewhere.
#[derive(Debug)]
pub struct WebError {
    pub status: StatusCode,
    pub message: String,
}

impl WebError {
    pub fn new(status: StatusCode, message: String) -> Self {
        WebError { status, message }
    }
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
    /// The message as JSON, with the headers its status calls for: when to retry a refusal
    /// for load, and how to authenticate.
    fn into_response(self) -> Response {
        let body = serde_json::json!({"error": self.message});
        let mut resp = (self.status, axum::Json(body)).into_response();
        let extra = match self.status {
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS => {
                Some((header::RETRY_AFTER, "1"))
            }
            StatusCode::UNAUTHORIZED => Some((header::WWW_AUTHENTICATE, "Bearer")),
            _ => None,
        };
        if let Some((name, value)) = extra {
            resp.headers_mut()
                .insert(name, header::HeaderValue::from_static(value));
        }
        resp
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
        .route(
            "/range/{from}/{to}/download.phaseprof",
            get(api::range_download),
        )
        .route("/select", get(pages::select))
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
        .layer(axum::middleware::from_fn(auth::security_headers))
        .with_state(state)
}

/// Listening beyond loopback exposes symbol names, command lines and host details to whoever
/// can reach the port: it needs a token.
pub fn check_listen(addr: SocketAddr, token: Option<&str>) -> anyhow::Result<()> {
    if token.is_some_and(|t| t.trim().is_empty()) {
        anyhow::bail!("--token is empty: an empty token would let anyone in; give a real one");
    }
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
    let listener =
        server::listen(addr).map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    eprintln!("phaseprof: serving on http://{}/", listener.local_addr()?);
    let limits = server::Limits {
        max_connections: server::fit_connections(server::MAX_CONNECTIONS),
        ..server::Limits::default()
    };
    let counters = Arc::new(server::ConnectionCounters::default());
    server::serve(listener, app(state), limits, counters, server::plain, stop).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use phaseprof_model::*;
    use tower::ServiceExt;

    use crate::fixture::two_phases as fixture;

    fn state(token: Option<&str>) -> AppState {
        AppState {
            source: Arc::new(SavedProfiles::new(vec![
                ("a.phaseprof".into(), fixture(100)),
                ("b.phaseprof".into(), fixture(25)),
            ])),
            token: token.map(Into::into),
            tls: false,
        }
    }

    async fn get(
        state: AppState,
        uri: &str,
        headers: &[(&str, &str)],
    ) -> (StatusCode, String, Response) {
        let mut req = Request::builder().uri(uri);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = app(state)
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = resp.status();
        let (parts, body) = resp.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        (
            status,
            text.clone(),
            Response::from_parts(parts, axum::body::Body::from(text)),
        )
    }

    // Checks the DNS-rebinding guard and the security headers: a tokenless server answers
    // requests for localhost and loopback addresses only, and every response forbids sniffing
    // and framing by other sites.
    #[tokio::test]
    async fn tokenless_servers_answer_loopback_hosts_only() {
        for host in [
            "127.0.0.1:7070",
            "localhost:7070",
            "[::1]:7070",
            "LOCALHOST",
        ] {
            let (st, _, resp) = get(state(None), "/api/profiles", &[("host", host)]).await;
            assert_eq!(st, StatusCode::OK, "{host}");
            let h = resp.headers();
            assert_eq!(h["x-content-type-options"], "nosniff");
            assert_eq!(h["x-frame-options"], "SAMEORIGIN");
            assert!(h["content-security-policy"]
                .to_str()
                .unwrap()
                .contains("default-src 'self'"));
        }
        let (st, body, _) = get(
            state(None),
            "/api/profiles",
            &[("host", "rebind.example:7070")],
        )
        .await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{body}");
        // With a token, the token is the guard: any Host may ask.
        let (st, _, _) = get(
            state(Some("s3cret-token-value")),
            "/api/profiles",
            &[
                ("host", "node.example:7070"),
                ("authorization", "Bearer s3cret-token-value"),
            ],
        )
        .await;
        assert_eq!(st, StatusCode::OK);
    }

    fn json(text: &str) -> serde_json::Value {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
    }

    // Checks every API route: status codes and the JSON members the pages rely on.
    #[tokio::test]
    async fn api_routes_answer_with_their_shapes() {
        let s = state(None);
        let (st, body, _) = get(s.clone(), "/api/profiles", &[]).await;
        assert_eq!(st, StatusCode::OK);
        let list = json(&body);
        assert_eq!(list.as_array().unwrap().len(), 2);
        assert_eq!(list[0]["id"], "0");
        assert_eq!(list[1]["name"], "b.phaseprof");
        assert_eq!(list[0]["pids"][0], 42);

        let (st, body, _) = get(s.clone(), "/api/profiles/0", &[]).await;
        assert_eq!(st, StatusCode::OK);
        let sum = json(&body);
        assert_eq!(sum["events"]["cpu"]["samples"], 100);
        assert_eq!(sum["phases"][1]["name"], "finalize");

        let (st, body, _) = get(s.clone(), "/api/profiles/0/phases", &[]).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(json(&body)[1]["costs"]["flush_syscalls"], 1000);

        let (st, body, _) = get(
            s.clone(),
            "/api/profiles/0/top?event=cpu&phase=propose&n=2",
            &[],
        )
        .await;
        assert_eq!(st, StatusCode::OK);
        let top = json(&body);
        assert_eq!(top["total"], 90);
        assert_eq!(top["functions"][0]["name"], "burn");
        assert_eq!(top["functions"].as_array().unwrap().len(), 2);

        let (st, body, _) = get(s.clone(), "/api/profiles/1/syscalls?phase=finalize", &[]).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(json(&body)[0]["count"], 250);

        let (st, body, _) = get(s.clone(), "/api/diff?a=0&b=1", &[]).await;
        assert_eq!(st, StatusCode::OK);
        let d = json(&body);
        assert_eq!(
            (d["a_runs"].as_u64(), d["b_runs"].as_u64()),
            (Some(1), Some(1))
        );
        let flush = d["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["phase"] == "finalize" && m["metric"] == "flush_syscalls")
            .unwrap();
        assert_eq!(flush["diff"]["delta"], -75.0);

        for (uri, want) in [
            ("/api/profiles/7", StatusCode::NOT_FOUND),
            ("/api/profiles/0/top?event=alloc", StatusCode::NOT_FOUND),
            ("/api/profiles/0/top?event=bogus", StatusCode::BAD_REQUEST),
            ("/api/profiles/0/top?phase=nosuch", StatusCode::BAD_REQUEST),
            ("/api/diff?a=0", StatusCode::BAD_REQUEST),
        ] {
            let (st, body, _) = get(s.clone(), uri, &[]).await;
            assert_eq!(st, want, "{uri}: {body}");
            assert!(json(&body)["error"].as_str().is_some(), "{uri}");
        }
    }

    // Checks the pages and downloads: HTML with the phase table and graphs, SVGs, folded text,
    // pprof and the .phaseprof itself (which reads back).
    #[tokio::test]
    async fn pages_and_downloads() {
        let s = state(None);
        let (st, body, _) = get(s.clone(), "/", &[]).await;
        assert_eq!(st, StatusCode::OK);
        assert!(body.contains("href=\"/profile/1\""));
        let (st, body, _) = get(s.clone(), "/profile/0?phase=propose", &[]).await;
        assert_eq!(st, StatusCode::OK);
        assert!(body.contains("data-phase=\"finalize\""));
        assert!(body.contains("cpu.svg?phase=propose"));
        assert!(body.contains("phase <b>propose</b> only"));
        let (st, body, _) = get(
            s.clone(),
            "/profile/0/flamegraph/cpu.svg?phase=finalize",
            &[],
        )
        .await;
        assert_eq!(st, StatusCode::OK);
        assert!(body.contains("<svg") && body.contains("write") && !body.contains(">burn<"));
        let (st, body, _) = get(s.clone(), "/profile/0/download.folded?event=syscall", &[]).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(body.trim(), "main;finalize;write;syscall:write 1000");
        let (st, _, resp) = get(s.clone(), "/profile/0/download.phaseprof", &[]).await;
        assert_eq!(st, StatusCode::OK);
        assert!(resp.headers()[header::CONTENT_DISPOSITION]
            .to_str()
            .unwrap()
            .contains(".phaseprof"));
        let resp = app(s.clone())
            .oneshot(
                Request::builder()
                    .uri("/profile/0/download.phaseprof")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(read_profile(&bytes[..]).unwrap(), fixture(100));
        let (st, _, _) = get(s.clone(), "/profile/0/download.pb.gz?event=cpu", &[]).await;
        assert_eq!(st, StatusCode::OK);
        let (st, body, _) = get(s.clone(), "/diff?a=0&b=1&event=syscall", &[]).await;
        assert_eq!(st, StatusCode::OK);
        assert!(
            body.contains("id=\"verdicts\"") && body.contains("diff.svg?a=0"),
            "{body}"
        );
        assert!(
            body.contains("n/a (one run per side)"),
            "one run per side: deltas, no verdict"
        );
        let (st, body, _) = get(s.clone(), "/diff.svg?a=0&b=1&event=syscall", &[]).await;
        assert_eq!(st, StatusCode::OK);
        assert!(body.contains("red: grew"));
        let (st, _, _) = get(s.clone(), "/assets/app.css", &[]).await;
        assert_eq!(st, StatusCode::OK);
        let (st, _, _) = get(s.clone(), "/profile/0/download.exe", &[]).await;
        assert_eq!(st, StatusCode::NOT_FOUND);
        let resp = app(s.clone())
            .oneshot(
                Request::builder()
                    .uri("/range/0/1/download.phaseprof")
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let merged = read_profile(&bytes[..]).unwrap();
        assert_eq!(merged.total(phaseprof_model::SampleKind::Cpu, 0), 200);
        assert_eq!(merged.phase_stats[2].costs["flush_syscalls"], 1250);
        let (st, _, _) = get(s, "/range/5/9/download.phaseprof", &[]).await;
        assert_eq!(st, StatusCode::NOT_FOUND);
    }

    // Checks the token rule: without the token 401; with the bearer header, the query (which
    // sets a cookie) or that cookie 200; and non-loopback listening needs a token.
    #[tokio::test]
    async fn token_rule() {
        let s = state(Some("s3cret"));
        for uri in [
            "/",
            "/api/profiles",
            "/assets/app.js",
            "/profile/0/download.phaseprof",
        ] {
            let (st, _, _) = get(s.clone(), uri, &[]).await;
            assert_eq!(st, StatusCode::UNAUTHORIZED, "{uri}");
        }
        let (st, _, _) = get(
            s.clone(),
            "/api/profiles",
            &[("authorization", "Bearer wrong")],
        )
        .await;
        assert_eq!(st, StatusCode::UNAUTHORIZED);
        let (st, _, _) = get(
            s.clone(),
            "/api/profiles",
            &[("authorization", "Bearer s3cret")],
        )
        .await;
        assert_eq!(st, StatusCode::OK);
        let (st, _, resp) = get(s.clone(), "/?token=s3cret", &[]).await;
        assert_eq!(st, StatusCode::OK);
        let cookie = resp.headers()[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .to_string();
        assert!(cookie.starts_with("phaseprof_token=s3cret") && cookie.contains("HttpOnly"));
        assert!(!cookie.contains("Secure"), "{cookie}");
        let tls = AppState {
            tls: true,
            ..s.clone()
        };
        let (_, _, resp) = get(tls, "/?token=s3cret", &[]).await;
        let cookie = resp.headers()[header::SET_COOKIE].to_str().unwrap();
        assert!(
            cookie.contains("; Secure"),
            "under TLS the cookie is Secure: {cookie}"
        );
        let (st, _, _) = get(
            s,
            "/api/profiles",
            &[("cookie", "a=b; phaseprof_token=s3cret")],
        )
        .await;
        assert_eq!(st, StatusCode::OK);
        let any: SocketAddr = "0.0.0.0:7070".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:7070".parse().unwrap();
        assert!(check_listen(any, None)
            .unwrap_err()
            .to_string()
            .contains("--token"));
        assert!(check_listen(any, Some("")).is_err());
        assert!(check_listen(any, Some("t")).is_ok());
        assert!(check_listen(lo, None).is_ok());
        // An empty token is refused everywhere, loopback too (it would let anyone in).
        assert!(check_listen(lo, Some("")).is_err());
        assert!(check_listen(lo, Some("  ")).is_err());
    }
}
