//! Faults around a request in flight: a Redis restart (the reservation is gone with the data,
//! the first request's heartbeat finds it lost and drops the work, storing nothing, and its
//! retry runs instead of being told `409` for good), a client cut while its key is looked up,
//! and an at-most-once replica cut off from Redis mid-request (its retry is told `409`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use http::{Method, StatusCode};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tower_lease::{Idempotency, IdempotencyLayer, RedisStore, Store};

use tower_lease_harness::http::{Http, serve};
use tower_lease_harness::proxy::{Fault, Proxy};
use tower_lease_harness::{Backing, Endpoint, Gate, RedisServer, Setup};

const SHORT: Idempotency =
    Idempotency::new("restart", Duration::from_secs(60)).lease(Duration::from_millis(600));

async fn slow(State(gate): State<Gate>) -> &'static str {
    gate.pass().await;
    "charged"
}

async fn restart(server: RedisServer) -> RedisServer {
    tokio::task::spawn_blocking(move || {
        let mut server = server;
        server.restart();
        server
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_in_flight_drops_the_work_and_the_retry_runs() {
    let mut env = Backing::redis(Setup::Layer).await;
    let (opener, gate) = Gate::new();
    let router = Router::new()
        .route("/pay", post(slow))
        .route_layer(IdempotencyLayer::new(env.store.clone(), SHORT))
        .with_state(gate.clone());
    let addr = serve(router).await;
    let http = Http::new();
    let key: [(&str, &[u8]); 1] = [("idempotency-key", b"restarted")];
    let first = tokio::spawn({
        let http = http.clone();
        async move { http.send(addr, Method::POST, "/pay", &key).await }
    });
    gate.until_inside(1).await;
    let server = env.server.take().unwrap();
    env.server = Some(restart(server).await);
    let restarted = Instant::now();
    let first = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .expect("the first request outlived its lost reservation")
        .unwrap();
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE, "{first:?}");
    assert_eq!(first.problem()["type"], "urn:tower-lease:lease-lost");
    assert!(
        restarted.elapsed() < Duration::from_secs(3),
        "{:?}",
        restarted.elapsed()
    );
    assert_eq!(gate.inside(), 0, "the work was not dropped");
    opener.send_replace(true);
    let retry = http.send(addr, Method::POST, "/pay", &key).await;
    assert_eq!(retry.status, StatusCode::OK, "{retry:?}");
    assert_eq!(retry.text(), "charged");
    assert!(retry.headers.get("idempotent-replayed").is_none());
}

async fn charge(State(runs): State<Arc<AtomicUsize>>) -> String {
    let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
    format!("charge {n}")
}

/// A client cut while its key's look-up is on the wire (Redis 120 ms away each way, behind a proxy):
/// the request is the layer's task's by then, so it is reserved, run and stored, and the retry
/// replays it instead of finding a reservation nobody runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cut_during_the_look_up_leaves_no_orphaned_reservation() {
    let server = RedisServer::start();
    let proxy = Proxy::to(&server).await;
    let store: Store = RedisStore::new(proxy.connection_manager().await)
        .timeout(Duration::from_secs(3))
        .into();
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = IdempotencyLayer::new(store, SHORT.lease(Duration::from_secs(10)));
    let router = Router::new()
        .route("/pay", post(charge))
        .route_layer(layer.max_wait(Duration::from_secs(3)))
        .with_state(runs.clone());
    let addr = serve(router).await;
    let http = Http::new();
    // The scripts cached first, so the cut request's look-up is one round trip.
    let warm: [(&str, &[u8]); 1] = [("idempotency-key", b"warm")];
    assert_eq!(
        http.send(addr, Method::POST, "/pay", &warm).await.text(),
        "charge 1"
    );
    proxy.set(Fault::Delay(Duration::from_millis(120)));
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request =
        "POST /pay HTTP/1.1\r\nhost: x\r\nidempotency-key: cut\r\ncontent-length: 0\r\n\r\n";
    stream.write_all(request.as_bytes()).await.unwrap();
    // The look-up takes 240 ms on the wire; the client leaves in the middle of it.
    tokio::time::sleep(Duration::from_millis(120)).await;
    drop(stream);
    let key: [(&str, &[u8]); 1] = [("idempotency-key", b"cut")];
    let retry = http.send(addr, Method::POST, "/pay", &key).await;
    assert_eq!(retry.status, StatusCode::OK, "{retry:?}");
    assert_eq!(retry.text(), "charge 2");
    assert!(
        retry.headers.get("idempotent-replayed").is_some(),
        "{retry:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// At most once, for a replica that dies mid-request on Redis: its store blackholed, its
/// reservation runs out unextended; a retry on another replica is told `409` outcome unknown
/// instead of running the request again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_once_a_replica_cut_off_mid_request_leaves_409_outcome_unknown() {
    const ONCE: Idempotency = SHORT.at_most_once();
    let env = Backing::redis(Setup::Layer).await;
    let proxy = Proxy::to(env.server.as_ref().unwrap()).await;
    let doomed: Store = RedisStore::new(proxy.connection_manager().await)
        .timeout(Duration::from_millis(300))
        .into();
    let (_opener, gate) = Gate::new();
    let dying = Router::new()
        .route("/pay", post(slow))
        .route_layer(IdempotencyLayer::new(doomed, ONCE))
        .with_state(gate.clone());
    let dying = serve(dying).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let other = Router::new()
        .route("/pay", post(charge))
        .route_layer(IdempotencyLayer::new(env.store.clone(), ONCE))
        .with_state(runs.clone());
    let other = serve(other).await;
    let http = Http::new();
    let key: [(&str, &[u8]); 1] = [("idempotency-key", b"cut-off")];
    let first = tokio::spawn({
        let http = http.clone();
        async move { http.send(dying, Method::POST, "/pay", &key).await }
    });
    gate.until_inside(1).await;
    proxy.set(Fault::Blackhole);
    let first = tokio::time::timeout(Duration::from_secs(5), first)
        .await
        .expect("the cut-off replica kept its lost reservation")
        .unwrap();
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE, "{first:?}");
    // The reservation ran out on the server by now (600 ms from its last extension).
    tokio::time::sleep(Duration::from_millis(700)).await;
    for _ in 0..2 {
        let retry = http.send(other, Method::POST, "/pay", &key).await;
        assert_eq!(retry.status, StatusCode::CONFLICT, "{retry:?}");
        assert_eq!(
            retry.problem()["type"],
            "urn:tower-lease:idempotency-outcome-unknown"
        );
        assert_eq!(retry.retry_after(), None);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "ran a second time");
}
