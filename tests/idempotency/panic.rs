//! A handler that panics behind `IdempotencyLayer`, on Redis, the cluster and in memory: its
//! client is told the handler failed (`500`), not that the store did, and the key is freed
//! before that answer goes out, so the retry runs at once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use http::{Method, StatusCode};
use tower_lease::{Idempotency, IdempotencyLayer};

use tower_lease_harness::Backing;
use tower_lease_harness::http::{Http, Reply, serve};

const PAYMENTS: Idempotency = Idempotency::new("panics", Duration::from_secs(60));

tower_lease_harness::store_tests!(Layer: [a_panicking_handler_gets_500_handler_failed_and_the_retry_runs]);

type Runs = Arc<AtomicUsize>;

/// Panics the first time, after the effect may have happened; then succeeds.
async fn flaky(State(runs): State<Runs>) -> (StatusCode, String) {
    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
    if n == 1 {
        panic!("the handler failed");
    }
    (StatusCode::CREATED, format!("charge {n}"))
}

async fn replica(runs: &Runs, env: &Backing) -> SocketAddr {
    let layer = IdempotencyLayer::new(env.store.clone(), PAYMENTS);
    let router = Router::new()
        .route("/pay", post(flaky))
        .route_layer(layer)
        .with_state(runs.clone());
    serve(router).await
}

async fn post_key(http: &Http, addr: SocketAddr) -> Reply {
    let headers: [(&str, &[u8]); 1] = [("idempotency-key", b"k")];
    http.send(addr, Method::POST, "/pay", &headers).await
}

async fn a_panicking_handler_gets_500_handler_failed_and_the_retry_runs(env: Backing) {
    let runs = Runs::default();
    let addr = replica(&runs, &env).await;
    let http = Http::new();
    let first = post_key(&http, addr).await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR, "{first:?}");
    assert_eq!(first.problem()["type"], "urn:tower-lease:handler-failed");
    assert_eq!(first.problem()["status"], 500);
    // No waiting: the key was freed before the `500` went out.
    let retry = post_key(&http, addr).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert_eq!(retry.text(), "charge 2");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
