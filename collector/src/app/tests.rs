//! The app end to end through its router, on an in-memory SQLite store.
use super::ingest::now;
use super::*;
use axum::body::Body;
use axum::http::Request;
use axum::http::StatusCode;
use http_body_util::BodyExt;
use phaseprof_model::*;
use std::time::Duration;
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
        limits: IngestLimits::new(
            max_body,
            8 << 20,
            4,
            Duration::from_secs(5),
            RateLimit::new(1000.0, 1000.0),
        ),
        queries: Arc::new(Semaphore::new(2)),
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
    b.add(Sample::new(SampleKind::Cpu, (7, 7), PhaseAt::NONE, vec![samples]).on(s));
    let mut out = Vec::new();
    write_profile(&b.finish(), &mut out).unwrap();
    out
}

async fn request(
    s: &AppState,
    method: &str,
    uri: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> (StatusCode, serde_json::Value) {
    let mut req = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
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

async fn call(
    s: &AppState,
    method: &str,
    uri: &str,
    token: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, serde_json::Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("authorization", a.as_str())).collect();
    request(s, method, uri, &headers, body).await
}

/// An upload as an agent sends it, with its Idempotency-Key.
async fn upload(
    s: &AppState,
    token: &str,
    key: Option<&str>,
    body: Vec<u8>,
) -> (StatusCode, serde_json::Value) {
    let auth = format!("Bearer {token}");
    let mut headers = vec![("authorization", auth.as_str())];
    headers.extend(key.map(|k| ("idempotency-key", k)));
    request(s, "POST", "/api/v1/windows", &headers, body).await
}

// Checks the edges of ingest: a retry under the same Idempotency-Key gets the first copy's
// id and stores nothing (another agent's same key is its own); a token whose line pins
// host=a cannot write as host b (403); a window ending a day ahead is refused (retention
// could never remove it); an agent over its rate gets 429 with Retry-After.
#[tokio::test]
async fn retries_pins_clocks_and_rates() {
    let mut s = state(1 << 20);
    s.tokens = Arc::new(
        Tokens::parse("t", &format!("host-a {TOKEN_A} host=a\nhost-b {TOKEN_B}\n")).unwrap(),
    );
    let w = window("a", 5, 100);
    let (st, first) = upload(&s, TOKEN_A, Some("k-1"), w.clone()).await;
    assert_eq!(st, StatusCode::CREATED, "{first}");
    let (st, again) = upload(&s, TOKEN_A, Some("k-1"), w.clone()).await;
    assert_eq!(st, StatusCode::OK, "{again}");
    assert_eq!(
        (again["id"].clone(), again["duplicate"].clone()),
        (first["id"].clone(), true.into())
    );
    let (st, _) = upload(&s, TOKEN_B, Some("k-1"), window("b", 1, 100)).await;
    assert_eq!(st, StatusCode::CREATED, "keys are per agent");
    assert_eq!(s.store.count().unwrap(), 2);
    assert_eq!(s.metrics.windows_duplicate.load(Ordering::Relaxed), 1);
    let (st, body) = upload(&s, TOKEN_A, None, window("b", 5, 100)).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{body}");
    assert!(body["error"].as_str().unwrap().contains("host=a"), "{body}");
    let (st, body) = upload(&s, TOKEN_A, Some("bad key!"), w.clone()).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{body}");
    let day_ahead = (now() + Duration::from_secs(86400)).as_nanos() as u64;
    let (st, body) = upload(&s, TOKEN_A, None, window("a", 5, day_ahead)).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"].as_str().unwrap().contains("future"), "{body}");
    assert_eq!(s.store.count().unwrap(), 2, "nothing stored from refusals");
    s.limits.rate = Arc::new(RateLimit::new(0.001, 2.0));
    let mut statuses = Vec::new();
    for i in 0..3 {
        let (st, _) = upload(&s, TOKEN_B, None, window("b", 1, 200 + i)).await;
        statuses.push(st.as_u16());
    }
    assert_eq!(statuses, [201, 201, 429]);
    let req = Request::builder()
        .method("POST")
        .uri("/api/v1/windows")
        .header("authorization", format!("Bearer {TOKEN_B}"))
        .body(Body::from(window("b", 1, 300)))
        .unwrap();
    let resp = app(s.clone()).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(resp.headers().contains_key(header::RETRY_AFTER));
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
    bad_index.samples[0].stack = Some(99);
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
