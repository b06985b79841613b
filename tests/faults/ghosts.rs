//! No ghosts from timed-out calls: a call that timed out on a paused Redis (`CLIENT PAUSE ms
//! WRITE`) still runs when the pause ends, and what it took (a lease, a reader or permit
//! member, an idempotency reservation) is given back with its secret as soon as Redis answers
//! again. A retry 0.6 s after the store recovered gets in, where it used to be refused for the
//! rest of a lease nobody held. On a single server and on the cluster; over HTTP for
//! `LockLayer` and `IdempotencyLayer`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::{Method, StatusCode};
use tokio::time::{Instant, sleep_until};
use tower_lease::{
    Error, Idempotency, IdempotencyLayer, Lock, LockLayer, RwLock, Semaphore, extract,
};

use tower_lease_harness::http::{Http, count, serve};
use tower_lease_harness::{Backing, Setup};

/// Leases far longer than the test: a ghost would still hold when the retry comes.
const TTL: Duration = Duration::from_secs(8);
const JOBS: Lock<str> = Lock::new("ghost-jobs", TTL);
const DOCS: RwLock<str> = RwLock::new("ghost-docs", TTL);
const SLOTS: Semaphore<str> = Semaphore::new("ghost-slots", 1, TTL);

/// How long Redis holds the writes back: well past the store's 500 ms timeout.
const PAUSE_MS: u64 = 1_200;
/// When the retry comes, after the pause ended.
const AFTER_RECOVERY: Duration = Duration::from_millis(600);

tower_lease_harness::store_tests!(
    Layer: [],
    redis: [
        a_lock_that_timed_out_is_free_soon_after_the_store_recovers,
        a_bounded_wait_that_timed_out_leaves_no_lease,
        a_reader_that_timed_out_does_not_keep_writers_out,
        a_writer_that_timed_out_does_not_keep_readers_out,
        a_permit_that_timed_out_is_given_back,
    ]
);

/// Pauses the writes behind `env`'s store and runs `call`, which must fail by the store's
/// timeout; answers when the pause ends, plus [`AFTER_RECOVERY`]: when the retry is due.
///
/// The scenarios of scripts run one call of the kind first: a script Redis has not cached
/// answers `NOSCRIPT` when the pause ends, and a call that timed out sends no `EVAL` after it,
/// so it would take nothing.
async fn timed_out<T: std::fmt::Debug>(
    env: &Backing,
    call: impl Future<Output = tower_lease::Result<T>>,
) -> Instant {
    let paused = Instant::now();
    env.pause_writes(PAUSE_MS).await;
    let answer = call.await;
    assert!(
        matches!(answer, Err(Error::Timeout(_) | Error::Redis(_))),
        "the call timed out on the paused store: {answer:?}"
    );
    assert!(
        paused.elapsed() < Duration::from_millis(PAUSE_MS),
        "it failed before the pause ended"
    );
    paused + Duration::from_millis(PAUSE_MS) + AFTER_RECOVERY
}

async fn a_lock_that_timed_out_is_free_soon_after_the_store_recovers(env: Backing) {
    let retry = timed_out(&env, JOBS.try_lock(&env.store, "a")).await;
    sleep_until(retry).await;
    let token = JOBS.try_lock(&env.store, "a").await.unwrap();
    let token = token.expect("free: the queued acquisition was given back");
    assert!(token.release().await.unwrap());
}

async fn a_bounded_wait_that_timed_out_leaves_no_lease(env: Backing) {
    let wait = Duration::from_secs(3);
    let retry = timed_out(&env, JOBS.try_lock_for(&env.store, "b", wait)).await;
    sleep_until(retry).await;
    let token = JOBS.try_lock(&env.store, "b").await.unwrap();
    assert!(token.expect("free").release().await.unwrap());
}

async fn a_reader_that_timed_out_does_not_keep_writers_out(env: Backing) {
    let warm = DOCS.try_read(&env.store, "c").await.unwrap().unwrap();
    assert!(warm.release().await.unwrap());
    let retry = timed_out(&env, DOCS.try_read(&env.store, "c")).await;
    sleep_until(retry).await;
    let writer = DOCS.try_write(&env.store, "c").await.unwrap();
    let writer = writer.expect("no reader left: the queued one was given back");
    assert!(writer.release().await.unwrap());
}

async fn a_writer_that_timed_out_does_not_keep_readers_out(env: Backing) {
    let warm = DOCS.try_write(&env.store, "d").await.unwrap().unwrap();
    assert!(warm.release().await.unwrap());
    let retry = timed_out(&env, DOCS.try_write(&env.store, "d")).await;
    sleep_until(retry).await;
    let reader = DOCS.try_read(&env.store, "d").await.unwrap();
    assert!(reader.expect("no writer left").release().await.unwrap());
    let writer = DOCS.try_write(&env.store, "d").await.unwrap();
    assert!(writer.expect("no writer left").release().await.unwrap());
}

async fn a_permit_that_timed_out_is_given_back(env: Backing) {
    let warm = SLOTS.try_acquire(&env.store, "e").await.unwrap().unwrap();
    assert!(warm.release().await.unwrap());
    let retry = timed_out(&env, SLOTS.try_acquire(&env.store, "e")).await;
    sleep_until(retry).await;
    let permit = SLOTS.try_acquire(&env.store, "e").await.unwrap();
    assert!(
        permit
            .expect("the one permit is free")
            .release()
            .await
            .unwrap()
    );
    assert_eq!(SLOTS.in_use(&env.store, "e").await.unwrap(), 0);
}

/// The acceptance check over HTTP: a locked request on a paused store answers `503` by the
/// store's timeout, and a retry 0.6 s after the store recovered runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_layer_a_retry_after_a_timed_out_request_runs() {
    let env = Backing::redis(Setup::Layer).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/jobs/{id}", post(count))
        .route_layer(LockLayer::new(
            env.store.clone(),
            JOBS,
            extract::path_segment(1),
        ))
        .with_state(runs.clone());
    let addr = serve(app).await;
    let http = Http::new();
    let paused = Instant::now();
    env.pause_writes(PAUSE_MS).await;
    let first = http.post(addr, "/jobs/http").await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE, "{first:?}");
    assert!(paused.elapsed() < Duration::from_millis(PAUSE_MS));
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    sleep_until(paused + Duration::from_millis(PAUSE_MS) + AFTER_RECOVERY).await;
    let retry = http.post(addr, "/jobs/http").await;
    assert_eq!(retry.status, StatusCode::OK, "{retry:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The same for an idempotency key: the retry runs, rather than `409 idempotency-in-flight`
/// for a reservation nobody holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotency_layer_a_retry_after_a_timed_out_request_runs() {
    const PAYMENTS: Idempotency =
        Idempotency::new("ghost-payments", Duration::from_secs(60)).lease(TTL);
    a_retry_after_a_timed_out_idempotent_request_runs(PAYMENTS).await;
}

/// Under `at_most_once` too: the marker a timed-out reservation may leave is given back with
/// it, so the retry runs rather than meeting `409 idempotency-outcome-unknown` for a request
/// that never reached a handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_once_idempotency_layer_a_retry_after_a_timed_out_request_runs() {
    const PAYMENTS: Idempotency = Idempotency::new("ghost-once", Duration::from_secs(60))
        .lease(TTL)
        .at_most_once();
    a_retry_after_a_timed_out_idempotent_request_runs(PAYMENTS).await;
}

async fn a_retry_after_a_timed_out_idempotent_request_runs(idempotency: Idempotency) {
    let env = Backing::redis(Setup::Layer).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/pay", post(count))
        .route_layer(IdempotencyLayer::new(env.store.clone(), idempotency))
        .with_state(runs.clone());
    let addr = serve(app).await;
    let http = Http::new();
    let key: [(&str, &[u8]); 1] = [("idempotency-key", b"ghost-1")];
    // A first look warms the script cache (an at-most-once begin is a script): a queued
    // EVALSHA the server does not know yet answers NOSCRIPT and takes nothing.
    let warm: [(&str, &[u8]); 1] = [("idempotency-key", b"warm")];
    let warmed = http.send(addr, Method::POST, "/pay", &warm).await;
    assert_eq!(warmed.status, StatusCode::OK, "{warmed:?}");
    let paused = Instant::now();
    env.pause_writes(PAUSE_MS).await;
    let first = http.send(addr, Method::POST, "/pay", &key).await;
    assert_eq!(first.status, StatusCode::SERVICE_UNAVAILABLE, "{first:?}");
    assert!(paused.elapsed() < Duration::from_millis(PAUSE_MS));

    sleep_until(paused + Duration::from_millis(PAUSE_MS) + AFTER_RECOVERY).await;
    let retry = http.send(addr, Method::POST, "/pay", &key).await;
    assert_eq!(retry.status, StatusCode::OK, "{retry:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the warm-up and the retry ran"
    );
    let replay = http.send(addr, Method::POST, "/pay", &key).await;
    assert_eq!(replay.status, StatusCode::OK, "{replay:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the retry's response is replayed"
    );
}
