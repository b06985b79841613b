//! A Redis restart while a request is in flight: the reservation is gone with the data, the
//! first request's heartbeat finds it lost and drops the work (storing nothing), and its retry
//! runs, instead of being told `409` for good.

use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use http::{Method, StatusCode};
use tower_lease::{Idempotency, IdempotencyLayer};

use crate::support::http::{Http, serve};
use crate::support::{Env, Gate, RedisServer, Setup};

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
    let mut env = Env::redis(Setup::Layer).await;
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
