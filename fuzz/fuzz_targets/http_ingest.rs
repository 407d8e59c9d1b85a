//! The collector's HTTP app on arbitrary requests: whatever an attacker sends to
//! `POST /api/v1/windows`, `POST /ingest` (Pyroscope's push: pprof), `POST
//! /v1development/profiles` (OTLP) or any other route — method, path, headers, token,
//! Idempotency-Key, body — must get a status, never a panic, and must store only windows that
//! decode and validate. Runs the real router over an in-memory store.
//!
//! Input layout: byte 0 picks the method and route, byte 1 the token (none, an agent's, a
//! wrong one, empty), whether an Idempotency-Key is sent and whether a pprof push is multipart,
//! then a length-prefixed header value (the key, or a Host; a push's name), then the body; odd
//! byte 0 gzips the body (behind a valid header for a window), so that the fuzzer reaches
//! decoding and validation.
#![no_main]

use std::io::Write;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use libfuzzer_sys::fuzz_target;
use phaseprof_collector::app::{AppState, IngestLimits, Metrics, RateLimit};
use phaseprof_collector::sqlite::SqliteStore;
use phaseprof_collector::tokens::Tokens;
use tower::ServiceExt;

const TOKEN: &str = "fuzz-agent-token-0123456789";

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    })
}

fn state() -> AppState {
    AppState {
        store: Arc::new(SqliteStore::memory().unwrap()),
        tokens: Arc::new(Tokens::parse("fuzz", &format!("a {TOKEN} host=h\n")).unwrap()),
        read_token: None,
        limits: IngestLimits::new(
            1 << 20,
            4 << 20,
            2,
            Duration::from_secs(5),
            RateLimit::new(1e9, 1e9),
        ),
        queries: Arc::new(tokio::sync::Semaphore::new(1)),
        metrics: Arc::new(Metrics::default()),
    }
}

fuzz_target!(|data: &[u8]| {
    let [route, auth, len, rest @ ..] = data else {
        return;
    };
    let (value, body) = rest.split_at((*len as usize).min(rest.len()));
    let value = String::from_utf8_lossy(value).into_owned();
    let which = (route >> 1) % 8;
    let pushed = which >= 6;
    let body = if route & 1 == 1 {
        let mut b = Vec::new();
        if !pushed {
            b.extend_from_slice(b"PHASEPROF\n");
            b.extend_from_slice(&1u32.to_le_bytes());
        }
        let mut gz = flate2::write::GzEncoder::new(b, flate2::Compression::fast());
        gz.write_all(body).unwrap();
        gz.finish().unwrap()
    } else {
        body.to_vec()
    };
    let name: String = value.bytes().map(|b| format!("%{b:02X}")).collect();
    let (method, uri) = match which {
        0 | 1 => ("POST", "/api/v1/windows".to_string()),
        2 => (
            "GET",
            format!("/api/v1/merged?sel={}", value.escape_default()),
        ),
        3 => ("GET", "/api/v1/windows".to_string()),
        4 => ("GET", "/metrics".to_string()),
        5 => ("GET", "/api/v1/diff?a=host%3Dh&b=host%3Dh".to_string()),
        6 => ("POST", format!("/ingest?name={name}&from=1&until=2")),
        _ => ("POST", "/v1development/profiles".to_string()),
    };
    let mut req = Request::builder().method(method);
    let Ok(uri) = uri.parse::<axum::http::Uri>() else {
        return;
    };
    req = req.uri(uri);
    match auth % 4 {
        0 => {}
        1 => req = req.header("authorization", format!("Bearer {TOKEN}")),
        2 => req = req.header("authorization", "Bearer wrong-token-0123456789"),
        _ => req = req.header("authorization", "Bearer "),
    }
    if which == 7 {
        req = req.header("content-type", "application/x-protobuf");
    } else if which == 6 && auth & 16 != 0 {
        req = req.header("content-type", "multipart/form-data; boundary=b");
    }
    if auth & 4 != 0 {
        req = req.header("idempotency-key", value.as_bytes());
    } else if auth & 8 != 0 && !pushed {
        req = req.header("host", value.as_bytes());
    }
    let Ok(req) = req.body(Body::from(body)) else {
        return; // a header value HTTP does not allow: never reaches a server
    };
    let s = state();
    let resp = runtime().block_on(phaseprof_collector::app(s.clone()).oneshot(req));
    let status = resp.unwrap().status().as_u16();
    assert!((200..600).contains(&status));
    // Stored only when accepted (an OTLP push stores a window per resource), and what is
    // stored decodes and validates.
    let stored = s.store.count().unwrap();
    assert!(stored <= 1 || which == 7);
    if stored > 0 {
        assert_eq!(status, if pushed { 200 } else { 201 });
        for w in s.store.windows(&Default::default()).unwrap() {
            let body = s.store.body(w.id).unwrap().unwrap();
            let p = phaseprof_model::read_profile(&body[..]).unwrap();
            p.validate().unwrap();
        }
        // Their rows sum back into a profile that validates too.
        let m = s.store.merged(&Default::default()).unwrap();
        phaseprof_collector::rows::rebuild(&m.agg, &m.dict)
            .validate()
            .unwrap();
    }
});
