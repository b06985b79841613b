//! Acknowledged means stored, on a real `redis-server` killed while the handler ends: no
//! response goes out before its record is stored; past `complete_within` the client gets
//! `503` outcome unknown, and the record is stored in the background once Redis is back, so
//! the retry replays the one run instead of running again.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use http::{Method, StatusCode};
use tower_lease::store::KeyRole;
use tower_lease::{Idempotency, IdempotencyLayer};

use tower_lease_harness::http::{Http, serve};
use tower_lease_harness::{Backing, Endpoint, Gate, RedisServer, Setup};

/// A lease much longer than Redis is down here, so the reservation is not lost to its TTL.
const STORED: Idempotency =
    Idempotency::new("stored", Duration::from_secs(60)).lease(Duration::from_secs(3));

#[derive(Clone)]
struct App {
    runs: Arc<AtomicUsize>,
    gate: Gate,
}

async fn charge(State(app): State<App>) -> (StatusCode, String) {
    app.gate.pass().await;
    let n = app.runs.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::CREATED, format!("charge {n}"))
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

async fn stop(env: &mut Backing) -> RedisServer {
    let mut server = env.server.take().unwrap();
    blocking(move || {
        server.stop();
        server
    })
    .await
}

async fn restart(env: &mut Backing, server: RedisServer) {
    let server = blocking(move || {
        let mut server = server;
        server.restart();
        server
    })
    .await;
    env.server = Some(server);
}

const KEY: [(&str, &[u8]); 1] = [("idempotency-key", b"k")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_down_when_the_handler_ends_gets_no_2xx_until_the_response_is_stored() {
    let mut env = Backing::redis(Setup::Layer).await;
    let (opener, gate) = Gate::new();
    let app = App {
        runs: Arc::default(),
        gate: gate.clone(),
    };
    let router = Router::new()
        .route("/pay", post(charge))
        .route_layer(IdempotencyLayer::new(env.store.clone(), STORED))
        .with_state(app.clone());
    let addr = serve(router).await;
    let http = Http::new();
    let first = tokio::spawn({
        let http = http.clone();
        async move { http.send(addr, Method::POST, "/pay", &KEY).await }
    });
    gate.until_inside(1).await;
    let server = stop(&mut env).await;
    // The charge happens while Redis is down: its record cannot be stored yet.
    opener.send_replace(true);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !first.is_finished(),
        "answered before its record was stored: {:?}",
        first.await
    );
    restart(&mut env, server).await;
    let first = tokio::time::timeout(Duration::from_secs(8), first)
        .await
        .expect("no answer once Redis was back")
        .unwrap();
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(first.text(), "charge 1");
    let retry = http.send(addr, Method::POST, "/pay", &KEY).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert_eq!(retry.text(), "charge 1", "every 2xx is the one response");
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_complete_within_503_outcome_unknown_then_the_background_stores_it() {
    let mut env = Backing::redis(Setup::Layer).await;
    let (opener, gate) = Gate::new();
    let app = App {
        runs: Arc::default(),
        gate: gate.clone(),
    };
    let layer = IdempotencyLayer::new(env.store.clone(), STORED)
        .complete_within(Duration::from_millis(500));
    let router = Router::new()
        .route("/pay", post(charge))
        .route_layer(layer)
        .with_state(app.clone());
    let addr = serve(router).await;
    let http = Http::new();
    let first = tokio::spawn({
        let http = http.clone();
        async move { http.send(addr, Method::POST, "/pay", &KEY).await }
    });
    gate.until_inside(1).await;
    let server = stop(&mut env).await;
    let ended = Instant::now();
    opener.send_replace(true);
    let first = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .expect("no answer within complete_within")
        .unwrap();
    let took = ended.elapsed();
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE, "{first:?}");
    let problem = first.problem();
    assert_eq!(
        problem["type"],
        "urn:tower-lease:idempotency-outcome-unknown"
    );
    assert!(first.retry_after().is_some(), "{first:?}");
    assert!(took >= Duration::from_millis(450), "{took:?}");
    restart(&mut env, server).await;
    // The record lands in the background once Redis answers again.
    let key = env.raw().key(KeyRole::Idempotency, "stored", b":k");
    let conn = env.server.as_ref().unwrap().connection().await;
    let stored =
        tower_lease_harness::poll(Duration::from_millis(50), Duration::from_secs(5), || {
            let (key, mut conn) = (key.clone(), conn.clone());
            async move {
                let exists: bool = redis::cmd("EXISTS")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .ok()?;
                exists.then_some(())
            }
        })
        .await;
    assert!(stored.is_some(), "the background never stored the record");
    let retry = http.send(addr, Method::POST, "/pay", &KEY).await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert_eq!(retry.text(), "charge 1");
    assert!(retry.headers.contains_key("idempotent-replayed"));
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}
