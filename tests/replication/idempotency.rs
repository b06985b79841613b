//! `IdempotencyLayer` on a store that waits for replicas: a reservation the frozen replica did
//! not acknowledge is refused with `503` and freed, and a completion it did not acknowledge is
//! answered but not counted as stored.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::{Method, StatusCode};
use tower_lease::store::{Begin, Completion, LeaseRef, LockRef, Mode, Secret};
use tower_lease::{Error, Idempotency, IdempotencyLayer};

use crate::replicated;
use crate::support::Endpoint;
use crate::support::http::{Http, count, serve};
use crate::support::sentinel::{Link, Topology, freeze};

const ORDERS: Idempotency = Idempotency::new("orders", Duration::from_secs(60));
const FP: [u8; 16] = *b"fingerprint-0001";

#[tokio::test]
async fn a_reservation_the_replica_did_not_acknowledge_gets_503_and_frees_the_key() {
    let topology = Topology::start(Link::Direct).await;
    let store = replicated(&topology.primary).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/orders", post(count))
        .route_layer(IdempotencyLayer::new(store.clone(), ORDERS))
        .with_state(runs.clone());
    let addr = serve(app).await;
    let http = Http::new();
    let key: [(&str, &[u8]); 1] = [("idempotency-key", b"warm")];
    let warm = http.send(addr, Method::POST, "/orders", &key).await;
    assert_eq!(warm.status, StatusCode::OK, "{warm:?}");

    let frozen = freeze(&topology.replica);
    let key: [(&str, &[u8]); 1] = [("idempotency-key", b"cold")];
    let reply = http.send(addr, Method::POST, "/orders", &key).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(reply.problem()["type"], "urn:tower-lease:not-replicated");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "ran without a replicated reservation"
    );
    // The refused reservation was released: the key is not left in flight.
    let mut raw = topology.primary.connection().await;
    let left: Vec<String> = redis::cmd("KEYS")
        .arg("*idem*cold*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(
        left.is_empty(),
        "the refused reservation was left behind: {left:?}"
    );
    drop(frozen);
    let retry = http.send(addr, Method::POST, "/orders", &key).await;
    assert_eq!(retry.status, StatusCode::OK, "{retry:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_completion_the_replica_did_not_acknowledge_is_not_replicated() {
    let topology = Topology::start(Link::Direct).await;
    let store = replicated(&topology.primary).await;
    let backend = store.backend();
    let secret = Secret::random();
    let lease = LeaseRef::new(
        LockRef::new("orders", b"k", Duration::from_secs(2)),
        Mode::Reservation,
        &secret,
    );
    // The replica may still be catching up with the primary at first.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match backend.idempotency_begin(lease, &FP).await {
            Ok(begun) => break assert_eq!(begun, Begin::Reserved { fence: None }),
            Err(Error::NotReplicated { .. }) if std::time::Instant::now() < deadline => {}
            Err(error) => panic!("{error}"),
        }
    }
    let _frozen = freeze(&topology.replica);
    let completion = Completion::new(&FP, b"receipt", Duration::from_secs(60));
    let completed = backend.idempotency_complete(lease, completion).await;
    assert!(
        matches!(
            completed,
            Err(Error::NotReplicated {
                acked: 0,
                wanted: 1
            })
        ),
        "{completed:?}"
    );
}
