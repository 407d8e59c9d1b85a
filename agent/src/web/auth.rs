//! The token rule: with `--token`, every request must carry it — as `Authorization: Bearer`,
//! as `?token=` (which also sets a cookie, so a browser's later requests carry it), or as that
//! cookie. Compared in constant time.
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;

const COOKIE: &str = "phaseprof_token";

fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

fn query_token(req: &Request) -> Option<String> {
    req.uri().query()?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == "token").then(|| v.to_string())
    })
}

pub async fn require_token(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(token) = state.token.clone() else {
        return next.run(req).await;
    };
    let headers = req.headers();
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| same(t, &token));
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .any(|(k, v)| k == COOKIE && same(v, &token));
    let query = query_token(&req).is_some_and(|t| same(&t, &token));
    if !(bearer || cookie || query) {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            axum::Json(serde_json::json!({
                "error": "this server needs its token: `Authorization: Bearer TOKEN`, or ?token=TOKEN once in a browser"
            })),
        )
            .into_response();
    }
    let mut resp = next.run(req).await;
    if query {
        let cookie = format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/");
        if let Ok(v) = cookie.parse() {
            resp.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    resp
}
