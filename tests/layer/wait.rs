//! `.max_wait(..)` and `.max_waiters(..)` over real TCP: a request waits for a held lock and runs
//! when it is released, gets 409 with `Retry-After` when its wait runs out, is answered at once
//! beyond the cap, and leaves nothing behind when its client goes away.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use tower_lease::{Lock, LockLayer, extract};

use tower_lease_harness::Backing;
use tower_lease_harness::http::{Http, count, serve};

const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(5));

tower_lease_harness::store_tests!(
    Layer: [
        a_waiting_request_runs_once_the_holder_releases,
        a_wait_that_runs_out_answers_409_with_retry_after,
        beyond_max_waiters_a_request_is_answered_at_once,
        a_client_gone_while_waiting_leaves_nothing_behind,
    ]
);

fn app(layer: LockLayer<extract::PathSegment>, runs: &Arc<AtomicUsize>) -> Router {
    Router::new()
        .route("/jobs/{id}", post(count))
        .route_layer(layer)
        .with_state(runs.clone())
}

fn layer(env: &Backing) -> LockLayer<extract::PathSegment> {
    LockLayer::new(env.store.clone(), JOBS, extract::path_segment(1))
}

async fn a_waiting_request_runs_once_the_holder_releases(env: Backing) {
    // Woken by the release, a waiter answers within a few round trips of it. A poller finds
    // it only at its next poll: 75-125 ms apart once backed off (1 s with release
    // notifications), about 50 ms after the release on average. One round could not tell the
    // two apart; the mean of ten can, with room for a loaded machine's pauses.
    const ROUNDS: u32 = 10;
    let runs = Arc::new(AtomicUsize::new(0));
    let addr = serve(app(layer(&env).max_wait(Duration::from_secs(2)), &runs)).await;
    let mut afters = Vec::new();
    for round in 0..ROUNDS {
        let name = format!("w{round}");
        let holder = JOBS.try_lock(&env.store, &name).await.unwrap().unwrap();
        let path = format!("/jobs/{name}");
        let request = tokio::spawn(async move {
            let reply = Http::new().post(addr, &path).await;
            (reply, Instant::now())
        });
        // Past the first polls, which come 5, 10, 20 and 40 ms apart.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let released = Instant::now();
        assert!(holder.release().await.unwrap());
        let (reply, answered) = request.await.unwrap();
        assert_eq!(reply.status, StatusCode::OK, "round {round}: {reply:?}");
        afters.push(answered.saturating_duration_since(released));
    }
    assert_eq!(runs.load(Ordering::SeqCst), ROUNDS as usize);
    let mean = afters.iter().sum::<Duration>() / ROUNDS;
    assert!(
        mean < Duration::from_millis(25),
        "answered {mean:?} after the release on average: {afters:?}"
    );
}

async fn a_wait_that_runs_out_answers_409_with_retry_after(env: Backing) {
    let runs = Arc::new(AtomicUsize::new(0));
    let addr = serve(app(layer(&env).max_wait(Duration::from_millis(150)), &runs)).await;
    let _holder = JOBS.try_lock(&env.store, "2").await.unwrap().unwrap();
    let started = Instant::now();
    let reply = Http::new().post(addr, "/jobs/2").await;
    let took = started.elapsed();
    assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
    assert_eq!(reply.retry_after(), Some(5), "the holder's remaining lease");
    assert!(
        took >= Duration::from_millis(150),
        "answered after {took:?}"
    );
    assert!(took < Duration::from_millis(600), "answered after {took:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

async fn beyond_max_waiters_a_request_is_answered_at_once(env: Backing) {
    let runs = Arc::new(AtomicUsize::new(0));
    let capped = layer(&env).max_wait(Duration::from_secs(1)).max_waiters(1);
    let addr = serve(app(capped, &runs)).await;
    let holder = JOBS.try_lock(&env.store, "3").await.unwrap().unwrap();
    let waiting = tokio::spawn(async move { Http::new().post(addr, "/jobs/3").await });
    tokio::time::sleep(Duration::from_millis(100)).await;

    let started = Instant::now();
    let reply = Http::new().post(addr, "/jobs/3").await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(300),
        "the second waited {took:?}"
    );

    assert!(holder.release().await.unwrap());
    assert_eq!(waiting.await.unwrap().status, StatusCode::OK);
}

async fn a_client_gone_while_waiting_leaves_nothing_behind(env: Backing) {
    let runs = Arc::new(AtomicUsize::new(0));
    let capped = layer(&env).max_wait(Duration::from_secs(2)).max_waiters(1);
    let addr = serve(app(capped, &runs)).await;
    let holder = JOBS.try_lock(&env.store, "4").await.unwrap().unwrap();
    let http = Http::new();
    let gone = http.post(addr, "/jobs/4");
    assert!(
        tokio::time::timeout(Duration::from_millis(200), gone)
            .await
            .is_err()
    );
    // hyper drops the request's future when it notices the connection closed.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(holder.release().await.unwrap());
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The lock is free (the gone waiter took nothing), its handler never ran, and its place
    // among the waiters is free again: the one waiter the cap allows waits and runs.
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let holder = JOBS.try_lock(&env.store, "4").await.unwrap();
    let holder = holder.expect("free after the waiter left");
    let waiting = tokio::spawn(async move { Http::new().post(addr, "/jobs/4").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(holder.release().await.unwrap());
    assert_eq!(waiting.await.unwrap().status, StatusCode::OK);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
