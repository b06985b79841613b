//! `IdempotencyLayer` on a store that waits for replicas: a reservation the frozen replica did
//! not acknowledge is refused with `503` and freed; a completion it did not acknowledge sends
//! no `2xx`, then `503` outcome unknown, and is stored in the background; and under Sentinel
//! a primary killed mid-request leaves one run.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use http::{Method, StatusCode};
use tower_lease::backend::{Begin, Completion, LeaseRef, LockRef, Mode, Secret};
use tower_lease::{Error, Idempotency, IdempotencyLayer, Store};

use crate::replicated;
use crate::support::http::{Http, count, serve};
use crate::support::sentinel::{Link, Topology, freeze};
use crate::support::{Endpoint, Gate};

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

/// Waits at the gate, then charges: the n-th run answers `charge n`.
async fn charge(State(app): State<(Gate, Arc<AtomicUsize>)>) -> (StatusCode, String) {
    let (gate, runs) = app;
    gate.pass().await;
    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::CREATED, format!("charge {n}"))
}

const KEY: [(&str, &[u8]); 1] = [("idempotency-key", b"cold")];

#[tokio::test]
async fn a_completion_the_replica_did_not_acknowledge_answers_no_2xx_then_503_then_replays() {
    let topology = Topology::start(Link::Direct).await;
    let store = replicated(&topology.primary).await;
    let (opener, gate) = Gate::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(store, ORDERS).complete_within(Duration::from_secs(1));
    let app = Router::new()
        .route("/orders", post(charge))
        .route_layer(layer)
        .with_state((gate.clone(), runs.clone()));
    let addr = serve(app).await;
    let http = Http::new();
    let first = tokio::spawn({
        let http = http.clone();
        async move { http.send(addr, Method::POST, "/orders", &KEY).await }
    });
    gate.until_inside(1).await;
    // Reserved and replicated; the charge ends while the replica cannot acknowledge.
    let frozen = freeze(&topology.replica);
    let ended = Instant::now();
    opener.send_replace(true);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !first.is_finished(),
        "answered before its record was replicated: {:?}",
        first.await
    );
    let first = first.await.unwrap();
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE, "{first:?}");
    assert_eq!(
        first.problem()["type"],
        "urn:tower-lease:idempotency-outcome-unknown"
    );
    assert!(first.retry_after().is_some(), "{first:?}");
    assert!(ended.elapsed() >= Duration::from_millis(900));
    drop(frozen);
    // Once the background completion is acknowledged, a retry replays the one run.
    let replayed =
        crate::support::poll(Duration::from_millis(200), Duration::from_secs(10), || {
            let http = http.clone();
            async move {
                let reply = http.send(addr, Method::POST, "/orders", &KEY).await;
                (reply.status == StatusCode::CREATED).then_some(reply)
            }
        })
        .await
        .expect("the retry never replayed")
        .0;
    assert_eq!(replayed.text(), "charge 1", "{replayed:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// `SIGKILL` of the primary while the handler ends: the completion is tried again until the
/// store follows the failover, and every `2xx` any client sees is the one run's.
#[tokio::test]
async fn a_primary_killed_under_sentinel_mid_request_runs_the_handler_once() {
    let mut topology = Topology::with_sentinels(Link::Direct).await;
    let store = topology.through_sentinels().await;
    runs_once_through_a_killed_primary(&mut topology, store.into()).await;
}

/// The same as the payments trial ran it: a primary, two replicas and three sentinels, the
/// store waiting for one replica (`wait_for_replicas(1, 300 ms)`), so the record that answers
/// the retry is on the promoted replica and one replica is left to acknowledge it.
#[tokio::test]
async fn a_primary_killed_mid_request_with_wait_for_replicas_runs_the_handler_once() {
    let mut topology = Topology::two_replicas(Duration::from_secs(1)).await;
    let store = topology
        .through_sentinels()
        .await
        .wait_for_replicas(1, Duration::from_millis(300));
    runs_once_through_a_killed_primary(&mut topology, store.into()).await;
}

/// A first request that is let out of its handler 200 ms after it came in, while the primary
/// is killed and the sentinels promote a replica; then retries until one succeeds.
async fn runs_once_through_a_killed_primary(topology: &mut Topology, store: Store) {
    let (opener, gate) = Gate::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(store, ORDERS.lease(Duration::from_secs(4)));
    let app = Router::new()
        .route("/orders", post(charge))
        .route_layer(layer)
        .with_state((gate.clone(), runs.clone()));
    let addr = serve(app).await;
    let http = Http::new();
    let first = tokio::spawn({
        let http = http.clone();
        async move { http.send(addr, Method::POST, "/orders", &KEY).await }
    });
    gate.until_inside(1).await;
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        opener.send_replace(true);
    });
    let killed = Instant::now();
    let old = topology.primary.port();
    topology.primary.stop();
    let promoted = topology.until_switched_from(old).await;
    eprintln!(
        "the sentinels switched to {promoted} {:?} after the kill",
        killed.elapsed()
    );
    let first = tokio::time::timeout(Duration::from_secs(20), first)
        .await
        .expect("no answer")
        .unwrap();
    let mut seen = Vec::new();
    if first.status.is_success() {
        seen.push(first.text().to_owned());
    }
    let last = crate::support::poll(Duration::from_millis(200), Duration::from_secs(15), || {
        let http = http.clone();
        async move {
            let reply = http.send(addr, Method::POST, "/orders", &KEY).await;
            reply.status.is_success().then_some(reply)
        }
    })
    .await
    .expect("no retry succeeded")
    .0;
    seen.push(last.text().to_owned());
    assert!(seen.iter().all(|text| text == "charge 1"), "{seen:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "{seen:?}");
}
