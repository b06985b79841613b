//! `tower_lease_idempotency_total`: each outcome of a keyed request increments exactly its
//! counter, and the reservations' held gauge returns to 0.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use http::{Method, StatusCode};
use tower_lease::{Idempotency, IdempotencyLayer};

use super::{moved, one, recorded, turn};
use tower_lease_harness::http::{Http, serve};
use tower_lease_harness::{Backing, Gate, Setup};

const NAME: &str = "tower_lease_idempotency_total";
const ORDERS: Idempotency = Idempotency::new("orders", Duration::from_secs(60));

async fn slow(State(gate): State<Gate>) -> &'static str {
    gate.pass().await;
    "slow"
}

async fn fail() -> StatusCode {
    StatusCode::BAD_GATEWAY
}

async fn ok() -> &'static str {
    "ok"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_idempotency_outcome_increments_exactly_its_counter() {
    let _turn = turn().await;
    let env = Backing::redis(Setup::Layer).await;
    let (opener, gate) = Gate::new();
    let app = Router::new()
        .route("/ok", post(ok))
        .route("/slow", post(slow))
        .route("/fail", post(fail))
        .route_layer(IdempotencyLayer::new(env.store.clone(), ORDERS))
        .with_state(gate.clone());
    let addr = serve(app).await;
    let http = Http::new();
    let send = |path: &'static str, key: &'static str| {
        let http = http.clone();
        async move {
            let headers: [(&str, &[u8]); 1] = [("idempotency-key", key.as_bytes())];
            http.send(addr, Method::POST, path, &headers).await.status
        }
    };
    let counted = |outcome: &str| one(NAME, &format!("namespace=orders,outcome={outcome}"));
    let idempotency = || moved(&recorded(), NAME);

    assert_eq!(send("/ok", "a").await, StatusCode::OK);
    assert_eq!(idempotency(), counted("stored"));
    assert_eq!(send("/ok", "a").await, StatusCode::OK);
    assert_eq!(idempotency(), counted("replayed"));
    assert_eq!(send("/fail", "a").await, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(idempotency(), counted("mismatch"));
    assert_eq!(send("/ok", "\"open").await, StatusCode::BAD_REQUEST);
    assert_eq!(idempotency(), counted("invalid_key"));
    assert_eq!(send("/fail", "b").await, StatusCode::BAD_GATEWAY);
    assert_eq!(idempotency(), counted("not_stored"));
    let first = tokio::spawn(send("/slow", "c"));
    gate.until_inside(1).await;
    assert_eq!(send("/slow", "c").await, StatusCode::CONFLICT);
    assert_eq!(idempotency(), counted("in_flight"));
    opener.send_replace(true);
    assert_eq!(first.await.unwrap(), StatusCode::OK);
    assert_eq!(idempotency(), counted("stored"));

    let held: BTreeMap<_, _> = recorded()
        .into_iter()
        .filter(|(name, _)| name.starts_with("tower_lease_held{mode=reservation"))
        .collect();
    let zero = BTreeMap::from([(
        "tower_lease_held{mode=reservation,namespace=orders}".to_owned(),
        0.0,
    )]);
    assert_eq!(held, zero);
}

async fn crash() -> StatusCode {
    panic!("the replica died mid-request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_holder_died_counts_outcome_unknown() {
    let _turn = turn().await;
    let env = Backing::redis(Setup::Layer).await;
    const ONCE: Idempotency = ORDERS.at_most_once();
    let app = Router::new()
        .route("/crash", post(crash))
        .route_layer(IdempotencyLayer::new(env.store.clone(), ONCE));
    let addr = serve(app).await;
    let http = Http::new();
    let headers: [(&str, &[u8]); 1] = [("idempotency-key", b"died")];
    let first = http.send(addr, Method::POST, "/crash", &headers).await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR, "{first:?}");
    // The panicked run's reservation was let go before its `500` went out, leaving the
    // at-most-once marker: the first retry is told outcome unknown, and counted so.
    let _ = moved(&recorded(), NAME);
    let retry = http.send(addr, Method::POST, "/crash", &headers).await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{retry:?}");
    let outcome_unknown = "urn:tower-lease:idempotency-outcome-unknown";
    assert_eq!(retry.problem()["type"], outcome_unknown, "{retry:?}");
    let counted = one(NAME, "namespace=orders,outcome=outcome_unknown");
    assert_eq!(moved(&recorded(), NAME), counted);
}
