//! Bounded waits through a Redis restart: 50 requests waiting behind a held lock when Redis
//! restarts each answer within their wait (plus the store's timeout), none hangs, and waiting
//! works again afterwards.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use tower_lease::{Lock, LockLayer, RedisStore, Store, extract};

use tower_lease_harness::http::{Http, count, serve};
use tower_lease_harness::{Endpoint, RedisServer, STORE_TIMEOUT};

const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(5));
const WAIT: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_through_a_redis_restart_answer_within_their_wait_and_waiting_works_after() {
    let mut server = RedisServer::start();
    let store: Store = RedisStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(STORE_TIMEOUT)
        .into();
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = LockLayer::new(store.clone(), JOBS, extract::path_segment(1)).max_wait(WAIT);
    let app = Router::new()
        .route("/jobs/{id}", post(count))
        .route_layer(layer)
        .with_state(runs);
    let addr = serve(app).await;

    // Held by another replica (another store handle) for longer than anyone waits.
    let elsewhere: Store = RedisStore::new(server.connection_manager().await).into();
    let _holder = JOBS.try_lock(&elsewhere, "1").await.unwrap().unwrap();
    let started = Instant::now();
    let mut waiting = Vec::new();
    for _ in 0..50 {
        waiting.push(tokio::spawn(async move {
            let reply = Http::new().post(addr, "/jobs/1").await;
            (reply.status, Instant::now())
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.restart();

    for request in waiting {
        let (status, answered) = request.await.unwrap();
        // The lease is gone with the restart: a waiter may get in (200), or find the lock held
        // until its wait ran out (409), or the store down (503). None waits past its bound.
        assert!(
            [
                StatusCode::OK,
                StatusCode::CONFLICT,
                StatusCode::SERVICE_UNAVAILABLE
            ]
            .contains(&status),
            "{status}"
        );
        let took = answered - started;
        assert!(
            took < WAIT + STORE_TIMEOUT + Duration::from_millis(500),
            "answered after {took:?}"
        );
    }

    // Waiting works again: a holder here releases after 200 ms and the waiter runs.
    let holder = JOBS.try_lock(&store, "2").await.unwrap().unwrap();
    let request = tokio::spawn(async move { Http::new().post(addr, "/jobs/2").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(holder.release().await.unwrap());
    assert_eq!(request.await.unwrap().status, StatusCode::OK);
}
