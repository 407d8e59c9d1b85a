//! The token rule: with `--token`, every request must carry it — as `Authorization: Bearer`,
//! as `?token=` (which also sets a cookie, so a browser's later requests carry it), or as that
//! cookie. Compared in constant time.
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{AppState, WebError};

const COOKIE: &str = "phaseprof_token";

/// Whether two tokens are equal, in time that does not depend on where they differ.
pub fn same(a: &str, b: &str) -> bool {
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

/// Whether a request's Host names this machine's loopback: a server without a token listens
/// only there, and a page of another site that resolves its own name to 127.0.0.1 (DNS
/// rebinding) sends its own name.
fn loopback_host(req: &Request) -> bool {
    let host = req.headers().get(header::HOST);
    if host.is_none() && req.uri().host().is_some() {
        return false;
    }
    is_loopback_host(host)
}

/// `loopback_host` on a Host header (None: HTTP/1.0 without Host, a local tool).
pub fn is_loopback_host(host: Option<&header::HeaderValue>) -> bool {
    let Some(host) = host else {
        return true;
    };
    let Ok(host) = host.to_str() else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(n, _)| n),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Headers every response carries: no sniffing, no framing by other sites, no referrer, and a
/// content policy that allows only this server's own resources (inline scripts and styles are
/// the flamegraph SVGs' and the pages').
pub async fn security_headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    for (name, value) in [
        ("x-content-type-options", "nosniff"),
        ("x-frame-options", "SAMEORIGIN"),
        ("referrer-policy", "no-referrer"),
        (
            "content-security-policy",
            "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; \
             img-src 'self' data:; frame-ancestors 'self'; form-action 'self'; base-uri 'none'",
        ),
    ] {
        if let Ok(v) = value.parse() {
            h.insert(name, v);
        }
    }
    resp
}

/// The one token check of every phaseprof server (`serve`, `attach --listen`, the collector's
/// queries and pages): with a token, a request must carry it as a bearer token, the session
/// cookie, or (`query`) `?token=` once from a browser; without one, it must name a loopback host.
/// Ok(true) when the token came in the query, so the caller sets the cookie.
pub fn authorize(
    token: Option<&str>,
    headers: &header::HeaderMap,
    loopback: bool,
    query: Option<&str>,
) -> Result<bool, WebError> {
    let Some(token) = token else {
        return match loopback {
            true => Ok(false),
            false => Err(WebError::new(
                StatusCode::FORBIDDEN,
                "this server has no token, so it answers only requests for localhost or a loopback address (Host header)".into(),
            )),
        };
    };
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| same(t, token));
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .any(|(k, v)| k == COOKIE && same(v, token));
    let by_query = query.is_some_and(|t| same(t, token));
    match bearer || cookie || by_query {
        true => Ok(by_query && !bearer && !cookie),
        false => Err(WebError::new(
            StatusCode::UNAUTHORIZED,
            "this server needs its token: `Authorization: Bearer TOKEN`, or ?token=TOKEN once in a browser".into(),
        )),
    }
}

pub async fn require_token(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let query = query_token(&req);
    let token = state.token.as_deref();
    let query = match authorize(token, req.headers(), loopback_host(&req), query.as_deref()) {
        Ok(q) => q,
        Err(e) => return e.into_response(),
    };
    let Some(token) = state.token.clone() else {
        return next.run(req).await;
    };
    let mut resp = next.run(req).await;
    if query {
        let secure = if state.tls { "; Secure" } else { "" };
        let cookie = format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/{secure}");
        if let Ok(v) = cookie.parse() {
            resp.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    resp
}
