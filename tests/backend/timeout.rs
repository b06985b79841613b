//! A backend that stalls: every call through the [`Store`](tower_lease::Store) handle ends
//! within the backend's timeout (1 s by default) with `Error::Timeout`, the layer answers `503`
//! in that time, and what a timed-out acquisition takes when the server catches up is given
//! back, so the lock is free again without waiting out its TTL.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use tower_lease::{Error, Lock, LockLayer, extract};
use tower_lease_harness::http::{Http, serve};

use crate::relay::{Relay, STALL};

/// Longer than the stall, so that only a give-back frees the lock in time.
const LOCK: Lock<str> = Lock::new("relay-stall", Duration::from_secs(30));
/// The backend's default timeout, and what a loaded machine may add to it.
const TIMEOUT: Duration = Duration::from_secs(1);
const MARGIN: Duration = Duration::from_millis(400);

#[tokio::test]
async fn a_stalled_call_times_out_and_its_lease_is_given_back() {
    let relay = Relay::default();
    let (stalling, probe) = relay.store();
    let (other, _) = relay.store();
    probe.stalled.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let attempt = tokio::time::timeout(STALL * 2, LOCK.try_lock(&stalling, "invoice")).await;
    let took = started.elapsed();
    let attempt = attempt.expect("the handle bounds the call");
    assert!(
        matches!(attempt, Err(Error::Timeout(_))),
        "a stalled call answers a timeout, got {attempt:?}"
    );
    assert!(took < TIMEOUT + MARGIN, "the call took {took:?}");
    probe.stalled.store(false, Ordering::SeqCst);
    // The stalled acquisition reaches the server after `STALL` and takes the lock; the
    // give-back releases it at once. Before that the lock is free anyway: look after it.
    tokio::time::sleep_until((started + STALL + Duration::from_millis(100)).into()).await;
    let freed = tokio::time::timeout(Duration::from_secs(1), async {
        loop {
            if let Some(token) = LOCK.try_lock(&other, "invoice").await.unwrap() {
                return token;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the lease the stalled call took was given back");
    assert!(freed.release().await.unwrap());
}

#[tokio::test]
async fn a_stalled_backend_answers_503_within_its_timeout() {
    let relay = Relay::default();
    let (store, probe) = relay.store();
    let layer = LockLayer::new(store, LOCK, extract::path_segment(1));
    let app = Router::new()
        .route("/invoices/{id}", post(|| async { "finalized" }))
        .route_layer(layer);
    let addr = serve(app).await;
    let http = Http::new();
    probe.stalled.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let reply = tokio::time::timeout(STALL * 2, http.post(addr, "/invoices/7"))
        .await
        .expect("the layer answers");
    let took = started.elapsed();
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        reply.text()
    );
    assert_eq!(
        reply.problem()["type"],
        "urn:tower-lease:lock-store-unavailable"
    );
    assert!(took < TIMEOUT + MARGIN, "the answer took {took:?}");
}
