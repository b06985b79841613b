//! The layer when Redis misbehaves: a restart under held leases, `SCRIPT FLUSH` under load, a
//! partition that starts while a lease is held, acquire replies lost after Redis acted, a Redis
//! out of memory, stopped, blackholed or slow.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::{Extension, Router};
use http::{Method, StatusCode};
use tokio::sync::{Mutex, Notify};
use tower_lease::{Lease, LeaseLost, Lock, RedisStore, Store};

use super::{by_id, lock_keys, serve_jobs};
use tower_lease_harness::http::{Http, serve};
use tower_lease_harness::proxy::{Fault, Proxy};
use tower_lease_harness::server::{config_set, fill_until_full};
use tower_lease_harness::{Backing, Endpoint, RedisServer, STORE_TIMEOUT, Setup};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_under_held_leases_answers_503_and_the_service_recovers() {
    const JOBS: Lock<str> = Lock::new("jobs", Duration::from_millis(900));
    let server = RedisServer::start();
    let store: Store = RedisStore::new(server.connection_manager().await)
        .timeout(Duration::from_millis(300))
        .into();
    let runs = Arc::new(AtomicUsize::new(0));
    let addr = serve_jobs(by_id(store, JOBS), &runs).await;
    let http = Http::new();

    let mut held = Vec::new();
    for id in 0..5 {
        let http = http.clone();
        held.push(tokio::spawn(async move {
            let path = format!("/jobs/held-{id}");
            let reply = http
                .send(addr, Method::POST, &path, &[("x-work-ms", b"5000")])
                .await;
            (reply, Instant::now())
        }));
    }
    while lock_keys(&server).await.len() < 5 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _server = tokio::task::spawn_blocking(move || {
        let mut server = server;
        server.restart();
        server
    })
    .await
    .unwrap();
    let restarted = Instant::now();

    // Every holder's next heartbeat answers "not held": the handler is dropped and the client
    // gets 503 well before the 5 s handler would have finished.
    let mut slowest = Duration::ZERO;
    for request in held {
        let (reply, at) = request.await.unwrap();
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
        assert_eq!(reply.problem()["type"], "urn:tower-lease:lease-lost");
        slowest = slowest.max(at.saturating_duration_since(restarted));
    }
    assert!(
        slowest < JOBS.ttl() + Duration::from_millis(300),
        "{slowest:?}"
    );

    // The same service, never restarted, locks again.
    let mut recovered = None;
    for _ in 0..100 {
        if http.post(addr, "/jobs/after").await.status == StatusCode::OK {
            recovered = Some(restarted.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let recovered = recovered.expect("the service works again after the restart");
    eprintln!(
        "restart: held requests answered 503 within {slowest:?}; 200 again after {recovered:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_under_http_load_never_reaches_a_client() {
    const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(2));
    let server = RedisServer::start();
    let store = Store::from(RedisStore::new(server.connection_manager().await));
    let runs = Arc::new(AtomicUsize::new(0));
    let addr = serve_jobs(by_id(store, JOBS), &runs).await;
    let stop = Arc::new(AtomicBool::new(false));

    let mut clients = Vec::new();
    for client in 0..8 {
        let (stop, http) = (stop.clone(), Http::new());
        clients.push(tokio::spawn(async move {
            let mut statuses = Vec::new();
            // Two clients per name: some requests find the lock held.
            let path = format!("/jobs/flush-{}", client % 4);
            while !stop.load(Ordering::Relaxed) {
                statuses.push(
                    http.send(addr, Method::POST, &path, &[("x-work-ms", b"1")])
                        .await
                        .status,
                );
            }
            statuses
        }));
    }
    let flushes = server.flush_scripts_for(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let mut statuses = Vec::new();
    for client in clients {
        statuses.extend(client.await.unwrap());
    }
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    let bad: Vec<_> = statuses
        .iter()
        .filter(|s| !matches!(**s, StatusCode::OK | StatusCode::CONFLICT))
        .collect();
    eprintln!(
        "script flush over HTTP: {flushes} flushes, {} requests, {ok} × 200, {} errors",
        statuses.len(),
        bad.len()
    );
    assert!(
        flushes > 100 && ok > 200,
        "too little load: {flushes} flushes, {ok} × 200"
    );
    assert!(
        bad.is_empty(),
        "{} requests failed: {:?}",
        bad.len(),
        &bad[..bad.len().min(5)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_ends_the_lease_at_its_last_confirmed_end_not_later() {
    const JOBS: Lock<str> = Lock::new("jobs", Duration::from_millis(900));
    let heartbeat = Duration::from_millis(300);
    let server = RedisServer::start();
    let proxy = Proxy::to(&server).await;
    let store: Store = RedisStore::new(proxy.connection_manager().await)
        .timeout(Duration::from_millis(200))
        .into();
    let lost_at = Arc::new(Mutex::new(None));
    let handler = {
        let lost_at = lost_at.clone();
        move |Extension(lease): Extension<Lease>| async move {
            lease.lost().await;
            *lost_at.lock().await = Some(Instant::now());
            "noticed"
        }
    };
    let app = Router::new()
        .route("/jobs/{id}", post(handler))
        .route_layer(
            by_id(store, JOBS)
                .heartbeat(heartbeat)
                .on_lease_lost(LeaseLost::Continue),
        );
    let addr = serve(app).await;
    let request = tokio::spawn(async move { Http::new().post(addr, "/jobs/partitioned").await });
    // Let a few extensions succeed, then cut Redis off.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    proxy.set(Fault::Blackhole);
    let cut = Instant::now();
    let reply = request.await.unwrap();
    let lost_at = lost_at.lock().await.expect("the handler saw the loss");
    let cut_to_lost = lost_at.duration_since(cut);
    // The heartbeat waits for each reply before its next extend, so the last reply the proxy
    // passed on confirmed the last extension, sent just before it. The lease counts as lost one
    // TTL after that send, minus the drift margin (1 % of the TTL + 2 ms = 11 ms).
    let confirmed = proxy
        .last_reply()
        .expect("replies passed before the cut")
        .into_std();
    let after_confirmed = lost_at.duration_since(confirmed);
    eprintln!(
        "partition: lease declared lost {cut_to_lost:?} after the cut and {after_confirmed:?} after \
         the last confirmed extension (TTL 900 ms, heartbeat 300 ms)"
    );
    // Slack below: the extension's own round trip under load. An implementation that gave up
    // at the first failed extension would answer about 500 ms after the last reply instead.
    let margin = Duration::from_millis(11);
    assert!(
        after_confirmed >= JOBS.ttl() - margin - Duration::from_millis(100),
        "declared lost while the lease was still valid: {after_confirmed:?}"
    );
    assert!(
        after_confirmed <= JOBS.ttl() + Duration::from_millis(150),
        "declared lost later than the lease end: {after_confirmed:?}"
    );
    // Under `Continue` the layer only flags the lease; the handler decides what to answer.
    assert_eq!((reply.status, reply.text()), (StatusCode::OK, "noticed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_acquire_replies_never_run_a_handler_and_leave_no_key_once_answered() {
    const JOBS: Lock<str> = Lock::new("jobs", Duration::from_millis(600));
    let server = RedisServer::start();
    let proxy = Proxy::to(&server).await;
    let store: Store = RedisStore::new(proxy.connection_manager().await)
        .timeout(Duration::from_millis(200))
        .into();
    let runs = Arc::new(AtomicUsize::new(0));
    let addr = serve_jobs(by_id(store, JOBS), &runs).await;
    let http = Http::new();
    assert_eq!(http.post(addr, "/jobs/warm").await.status, StatusCode::OK);
    assert_eq!(runs.swap(0, Ordering::SeqCst), 1);

    proxy.set(Fault::DropReplies);
    let sent = Instant::now();
    let mut requests = Vec::new();
    for id in 0..20 {
        let http = http.clone();
        requests.push(tokio::spawn(async move {
            http.post(addr, &format!("/jobs/lost-{id}")).await
        }));
    }
    for request in requests {
        let reply = request.await.unwrap();
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
        assert_eq!(
            reply.problem()["type"],
            "urn:tower-lease:lock-store-unavailable"
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "a handler ran without a confirmed lease"
    );
    // Redis took every lease the layer never heard of: 20 `SET NX` ran besides the warm one.
    let sets = set_calls(&server).await;
    assert!(sets >= 21, "{sets} SET calls: the scenario tested nothing");
    // Each was given back with its secret once its call timed out, long before its TTL.
    let answered = Instant::now();
    while !lock_keys(&server).await.is_empty() {
        assert!(
            answered.elapsed() < Duration::from_millis(300),
            "an orphan was left to its 600 ms TTL"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "lost replies: {sets} SET calls ran, every orphan given back {:?} after the requests were \
         sent and {:?} after the last 503",
        sent.elapsed(),
        answered.elapsed()
    );
}

/// How many `SET` commands the server ran (`INFO commandstats`).
async fn set_calls(server: &RedisServer) -> u64 {
    let mut conn = server.connection().await;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|line| {
            line.strip_prefix("cmdstat_set:calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_out_of_memory_answers_503_never_a_panic() {
    const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(5));
    let server =
        RedisServer::start_with(&["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"]);
    let store = Store::from(RedisStore::new(server.connection().await));
    let runs = Arc::new(AtomicUsize::new(0));
    let addr = serve_jobs(by_id(store, JOBS), &runs).await;
    let http = Http::new();

    let mut conn = server.connection().await;
    fill_until_full(&mut conn).await;

    let reply = http.post(addr, "/jobs/oom").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(
        reply.problem()["type"],
        "urn:tower-lease:lock-store-unavailable"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // `SYNC`: Valkey flushes in the background by default (`lazyfree-lazy-user-flush`), and a
    // write right after an asynchronous flush may still find the memory full.
    let () = redis::cmd("FLUSHDB")
        .arg("SYNC")
        .query_async(&mut conn)
        .await
        .unwrap();
    config_set(&mut conn, "maxmemory", "4mb").await;
    assert_eq!(http.post(addr, "/jobs/oom").await.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_answers_503_promptly_or_runs_unlocked_with_fail_open() {
    const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(2));
    let mut env = Backing::redis(Setup::Layer).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = by_id(env.store.clone(), JOBS);
    let closed = serve_jobs(layer.clone(), &calls).await;
    let open = serve_jobs(layer.fail_open(), &calls).await;
    let http = Http::new();
    assert_eq!(http.post(closed, "/jobs/1").await.status, StatusCode::OK);

    env.server.as_mut().unwrap().stop();
    for _ in 0..3 {
        let begun = Instant::now();
        let reply = http.post(closed, "/jobs/1").await;
        let took = begun.elapsed();
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
        assert_eq!(reply.retry_after(), Some(1));
        assert_eq!(
            reply.problem()["type"],
            "urn:tower-lease:lock-store-unavailable"
        );
        assert!(
            took < STORE_TIMEOUT + Duration::from_secs(1),
            "took {took:?}"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a fail-closed request ran");

    let reply = http.post(open, "/jobs/1").await;
    assert_eq!((reply.status, reply.text()), (StatusCode::OK, "done"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_blackholed_answers_503_within_the_store_timeout() {
    const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(2));
    let server = RedisServer::start();
    let proxy = Proxy::to(&server).await;
    let conn = proxy.connection().await;
    let store: Store = RedisStore::new(conn).timeout(STORE_TIMEOUT).into();
    let calls = Arc::new(AtomicUsize::new(0));
    let addr = serve_jobs(by_id(store, JOBS), &calls).await;
    let http = Http::new();
    assert_eq!(http.post(addr, "/jobs/1").await.status, StatusCode::OK);

    proxy.set(Fault::Blackhole);
    let begun = Instant::now();
    let reply = http.post(addr, "/jobs/2").await;
    let took = begun.elapsed();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(
        reply.problem()["type"],
        "urn:tower-lease:lock-store-unavailable"
    );
    assert!(
        took >= STORE_TIMEOUT,
        "answered before the timeout: {took:?}"
    );
    assert!(
        took < STORE_TIMEOUT + Duration::from_secs(1),
        "took {took:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_store_is_retried_until_the_lease_would_end() {
    const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(2));
    let server = RedisServer::start();
    let proxy = Proxy::to(&server).await;
    let conn = proxy.connection().await;
    let store: Store = RedisStore::new(conn).timeout(STORE_TIMEOUT).into();
    let started = Arc::new(Notify::new());
    let handler = {
        let started = started.clone();
        move || async move {
            started.notify_one();
            tokio::time::sleep(Duration::from_millis(2500)).await;
            "finished"
        }
    };
    let app = Router::new()
        .route("/jobs/{id}", post(handler))
        .route_layer(by_id(store, JOBS));
    let addr = serve(app).await;

    // A hiccup: the first extend (at ~667 ms) times out, a retry gets through well before the
    // 2 s lease would end.
    let reply = tokio::spawn(async move { Http::new().post(addr, "/jobs/1").await });
    started.notified().await;
    proxy.set(Fault::Delay(Duration::from_millis(700)));
    tokio::time::sleep(Duration::from_millis(900)).await;
    proxy.set(Fault::Pass);
    let reply = reply.await.unwrap();
    assert_eq!((reply.status, reply.text()), (StatusCode::OK, "finished"));

    // An outage longer than the lease: lost once the lease would have ended.
    let reply = tokio::spawn(async move { Http::new().post(addr, "/jobs/2").await });
    started.notified().await;
    let slowed = Instant::now();
    proxy.set(Fault::Delay(Duration::from_secs(10)));
    let reply = reply.await.unwrap();
    let took = slowed.elapsed();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(reply.problem()["type"], "urn:tower-lease:lease-lost");
    assert!(
        took < JOBS.ttl() + Duration::from_millis(500),
        "lost after {took:?}"
    );
}
