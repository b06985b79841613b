//! `IdempotencyLayer::fingerprint(Fingerprint::Json)` over TCP: a retry whose client
//! re-serialised the same JSON is replayed; another meaning, `422`; a body that is not JSON
//! counts by its bytes; the default counts bytes. The fingerprint is the layer's, the same on
//! every store: these run on `Store::memory()`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use http::{Method, StatusCode};
use tower_lease::{Fingerprint, Idempotency, IdempotencyLayer, Store};
use tower_lease_harness::http::{Http, Reply, serve};

const ORDERS: Idempotency = Idempotency::new("orders", Duration::from_secs(60));

/// Answers the run's number and the body exactly as the handler got it.
async fn order(State(runs): State<Arc<AtomicUsize>>, body: Bytes) -> (StatusCode, String) {
    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
    let body = String::from_utf8_lossy(&body);
    (StatusCode::CREATED, format!("order {n}: {body}"))
}

async fn replica(fingerprint: Option<Fingerprint>) -> (SocketAddr, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(Store::memory(), ORDERS);
    let layer = match fingerprint {
        Some(fingerprint) => layer.fingerprint(fingerprint),
        None => layer,
    };
    let router = Router::new()
        .route("/orders", post(order))
        .route_layer(layer)
        .with_state(runs.clone());
    (serve(router).await, runs)
}

async fn post_json(http: &Http, addr: SocketAddr, key: &str, body: &'static str) -> Reply {
    let headers: [(&str, &[u8]); 2] = [
        ("idempotency-key", key.as_bytes()),
        ("content-type", b"application/json"),
    ];
    let body = Bytes::from_static(body.as_bytes());
    http.send_body(addr, Method::POST, "/orders", &headers, body)
        .await
}

fn replayed(reply: &Reply) -> bool {
    reply
        .headers
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

fn problem_type(reply: &Reply) -> String {
    reply.problem()["type"].as_str().unwrap().to_owned()
}

const FIRST: &str = r#"{"amount": 10, "to": {"name": "Ada", "iban": "DE02"}, "tags": ["a", "b"]}"#;

#[tokio::test]
async fn the_same_json_spaced_and_ordered_differently_is_replayed() {
    let (addr, runs) = replica(Some(Fingerprint::Json)).await;
    let http = Http::new();
    let first = post_json(&http, addr, "o-1", FIRST).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    // The handler got the body as sent, not a canonical form.
    assert_eq!(first.text(), format!("order 1: {FIRST}"));
    let retries = [
        // Compact, members in another order, a name escaped.
        r#"{"tags":["a","b"],"to":{"iban":"DE02","\u006eame":"Ada"},"amount":10}"#,
        // Spread over lines, with tabs.
        "{\n\t\"to\" : { \"name\" : \"Ada\" ,\r\n \"iban\" : \"DE02\" },\n\t\"amount\" : 10 ,\n\t\"tags\" : [ \"a\" , \"b\" ]\n}\n",
    ];
    for retry in retries {
        let reply = post_json(&http, addr, "o-1", retry).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{retry}: {reply:?}");
        assert_eq!(reply.text(), first.text(), "{retry}");
        assert!(replayed(&reply), "{retry}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn json_that_means_something_else_is_another_request() {
    let (addr, runs) = replica(Some(Fingerprint::Json)).await;
    let http = Http::new();
    let first = post_json(&http, addr, "o-2", FIRST).await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    let others = [
        // Another value.
        r#"{"amount": 11, "to": {"name": "Ada", "iban": "DE02"}, "tags": ["a", "b"]}"#,
        // A number written otherwise: numbers count as written.
        r#"{"amount": 10.0, "to": {"name": "Ada", "iban": "DE02"}, "tags": ["a", "b"]}"#,
        // Array items in another order.
        r#"{"amount": 10, "to": {"name": "Ada", "iban": "DE02"}, "tags": ["b", "a"]}"#,
        // A member more.
        r#"{"amount": 10, "to": {"name": "Ada", "iban": "DE02"}, "tags": ["a", "b"], "x": null}"#,
        // Whitespace inside a string is part of it.
        r#"{"amount": 10, "to": {"name": "Ada ", "iban": "DE02"}, "tags": ["a", "b"]}"#,
    ];
    for other in others {
        let reply = post_json(&http, addr, "o-2", other).await;
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{other}");
        assert_eq!(
            problem_type(&reply),
            "urn:tower-lease:idempotency-key-reused"
        );
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_body_that_is_not_json_counts_by_its_bytes() {
    let (addr, runs) = replica(Some(Fingerprint::Json)).await;
    let http = Http::new();
    for (key, body) in [("o-3", "amount=10&to=Ada"), ("o-4", "{\"amount\": 10,}")] {
        let first = post_json(&http, addr, key, body).await;
        assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
        assert_eq!(
            first.text(),
            format!("order {}: {body}", runs.load(Ordering::SeqCst))
        );
        let retry = post_json(&http, addr, key, body).await;
        assert_eq!(retry.text(), first.text());
        assert!(replayed(&retry), "{body}");
    }
    let spaced = post_json(&http, addr, "o-4", "{\"amount\": 10 ,}").await;
    assert_eq!(
        spaced.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{spaced:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn by_default_every_byte_counts() {
    for fingerprint in [None, Some(Fingerprint::Bytes)] {
        let (addr, runs) = replica(fingerprint).await;
        let http = Http::new();
        let first = post_json(&http, addr, "o-5", r#"{"amount":10,"to":"Ada"}"#).await;
        assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
        let same = post_json(&http, addr, "o-5", r#"{"amount":10,"to":"Ada"}"#).await;
        assert!(replayed(&same));
        let spaced = post_json(&http, addr, "o-5", r#"{"amount": 10, "to": "Ada"}"#).await;
        assert_eq!(
            spaced.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{spaced:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }
}
