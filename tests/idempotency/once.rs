//! `Idempotency::at_most_once` and the handler's `IdempotencyKey`, on Redis, the cluster and in
//! memory: a key whose holder died is never run again (`409` outcome unknown), a `5xx` still
//! frees it, and the handler sees the key, scope and fence it runs under.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Extension, Router};
use http::{Method, StatusCode};
use tower_lease::{Idempotency, IdempotencyKey, IdempotencyLayer, extract};

use tower_lease_harness::Backing;
use tower_lease_harness::http::{Http, Reply, serve};

const ONCE: Idempotency = Idempotency::new("once", Duration::from_secs(60)).at_most_once();

tower_lease_harness::store_tests!(
    Layer: [
        at_most_once_a_holder_that_died_leaves_its_key_409_outcome_unknown,
        at_most_once_a_5xx_still_frees_the_key,
        the_handler_gets_its_key_scope_and_fence,
    ]
);

type Runs = Arc<AtomicUsize>;

/// The handler dies mid-request the first time (it panics), after the effect may have
/// happened.
async fn crash(State(runs): State<Runs>) -> (StatusCode, String) {
    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
    if n == 1 {
        panic!("the replica died mid-request");
    }
    (StatusCode::CREATED, format!("charge {n}"))
}

async fn fail(State(runs): State<Runs>) -> (StatusCode, String) {
    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
    match n {
        1 => (StatusCode::BAD_GATEWAY, "provider down".to_owned()),
        _ => (StatusCode::CREATED, format!("charge {n}")),
    }
}

async fn key(Extension(key): Extension<IdempotencyKey>) -> String {
    let scope = key.scope().map(String::from_utf8_lossy);
    format!("{} {scope:?} {}", key.key(), key.fence().is_some())
}

async fn replica(layer: IdempotencyLayer, runs: &Runs) -> SocketAddr {
    let router = Router::new()
        .route("/crash", post(crash))
        .route("/fail", post(fail))
        .route_layer(layer)
        .with_state(runs.clone());
    serve(router).await
}

async fn post_key(http: &Http, addr: SocketAddr, path: &str, key: &str) -> Reply {
    let headers: [(&str, &[u8]); 1] = [("idempotency-key", key.as_bytes())];
    http.send(addr, Method::POST, path, &headers).await
}

async fn at_most_once_a_holder_that_died_leaves_its_key_409_outcome_unknown(env: Backing) {
    let runs = Runs::default();
    let addr = replica(IdempotencyLayer::new(env.store.clone(), ONCE), &runs).await;
    let http = Http::new();
    let first = post_key(&http, addr, "/crash", "k").await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR, "{first:?}");
    assert_eq!(first.problem()["type"], "urn:tower-lease:handler-failed");
    // A replica that really dies releases nothing: until its reservation's release lands (or
    // its lease ends), `409` in flight.
    let settled =
        tower_lease_harness::poll(Duration::from_millis(20), Duration::from_secs(3), || {
            let http = http.clone();
            async move {
                let retry = post_key(&http, addr, "/crash", "k").await;
                let in_flight = retry.status == StatusCode::CONFLICT
                    && retry.problem()["type"] == "urn:tower-lease:idempotency-in-flight";
                (!in_flight).then_some(())
            }
        })
        .await;
    assert!(settled.is_some(), "the reservation stayed in flight");
    for _ in 0..2 {
        let retry = post_key(&http, addr, "/crash", "k").await;
        assert_eq!(retry.status, StatusCode::CONFLICT, "{retry:?}");
        let problem = retry.problem();
        assert_eq!(
            problem["type"],
            "urn:tower-lease:idempotency-outcome-unknown"
        );
        assert_eq!(retry.retry_after(), None, "{retry:?}");
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "ran a second time");
}

async fn at_most_once_a_5xx_still_frees_the_key(env: Backing) {
    let runs = Runs::default();
    let addr = replica(IdempotencyLayer::new(env.store.clone(), ONCE), &runs).await;
    let http = Http::new();
    let first = post_key(&http, addr, "/fail", "k").await;
    assert_eq!(first.status, StatusCode::BAD_GATEWAY, "{first:?}");
    let retry = post_key(&http, addr, "/fail", "k").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    let again = post_key(&http, addr, "/fail", "k").await;
    assert_eq!(again.text(), "charge 2");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

async fn the_handler_gets_its_key_scope_and_fence(env: Backing) {
    let layer = IdempotencyLayer::new(env.store.clone(), ONCE.fenced());
    let router = Router::new()
        .route("/key", post(key))
        .route_layer(layer.scope(extract::header("x-tenant")));
    let addr = serve(router).await;
    let http = Http::new();
    let headers: [(&str, &[u8]); 2] = [("idempotency-key", b"\"order 7\""), ("x-tenant", b"acme")];
    let reply = http.send(addr, Method::POST, "/key", &headers).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.text(), "order 7 Some(\"acme\") true");
    let unscoped = Router::new()
        .route("/key", post(key))
        .route_layer(IdempotencyLayer::new(env.store.clone(), ONCE));
    let addr = serve(unscoped).await;
    let reply = post_key(&http, addr, "/key", "k").await;
    assert_eq!(reply.text(), "k None false");
}
