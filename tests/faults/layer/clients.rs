//! The layer when clients go away: mid-request or mid-body (the lock is free at once), and a
//! storm of 1000 requests cancelled at random points (no lock and no heartbeat left).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tower_lease::{Lock, RedisStore, Store};

use super::{by_id, lock_keys};
use tower_lease_harness::http::{Chunks, Http, serve, serve_counting_connections};
use tower_lease_harness::{Backing, DropFlag, Endpoint, RedisServer, poll};

const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(2));

tower_lease_harness::store_tests!(
    Layer: [
        a_client_that_disconnects_frees_the_lock_at_once,
        a_client_that_disconnects_mid_body_frees_the_lock_at_once,
    ]
);

/// How long until `name` can be locked directly, polling every 5 ms for at most 3 s.
async fn free_after(store: &Store, name: &str) -> Duration {
    let begun = Instant::now();
    let (token, _) = poll(Duration::from_millis(5), Duration::from_secs(3), || async {
        JOBS.try_lock(store, name).await.unwrap()
    })
    .await
    .expect("never freed");
    let took = begun.elapsed();
    token.release().await.unwrap();
    took
}

async fn a_client_that_disconnects_frees_the_lock_at_once(env: Backing) {
    let started = Arc::new(Notify::new());
    let dropped = Arc::new(AtomicBool::new(false));
    let handler = {
        let (started, dropped) = (started.clone(), dropped.clone());
        move || async move {
            let _flag = DropFlag(dropped);
            started.notify_one();
            tokio::time::sleep(Duration::from_secs(10)).await;
            "finished"
        }
    };
    let app = Router::new()
        .route("/jobs/{id}", post(handler))
        .route_layer(by_id(env.store.clone(), JOBS));
    let addr = serve(app).await;

    let mut client = TcpStream::connect(addr).await.unwrap();
    let request = "POST /jobs/1 HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\n\r\n";
    client.write_all(request.as_bytes()).await.unwrap();
    started.notified().await;
    assert!(JOBS.try_lock(&env.store, "1").await.unwrap().is_none());
    drop(client);

    // The TTL is 2 s: only the dropped guard's release can free it this soon.
    let took = free_after(&env.store, "1").await;
    assert!(took < Duration::from_millis(200), "freed after {took:?}");
    assert!(
        dropped.load(Ordering::SeqCst),
        "the handler was not dropped"
    );
}

async fn a_client_that_disconnects_mid_body_frees_the_lock_at_once(env: Backing) {
    let app = Router::new()
        .route(
            "/jobs/{id}",
            post(|| async { Body::new(Chunks::endless(1024)) }),
        )
        .route_layer(by_id(env.store.clone(), JOBS).hold_through_body());
    let addr = serve(app).await;

    let mut client = TcpStream::connect(addr).await.unwrap();
    let request = "POST /jobs/2 HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\n\r\n";
    client.write_all(request.as_bytes()).await.unwrap();
    let mut some = [0u8; 4096];
    client.read_exact(&mut some).await.unwrap();
    assert!(some.starts_with(b"HTTP/1.1 200"));
    assert!(
        JOBS.try_lock(&env.store, "2").await.unwrap().is_none(),
        "the body holds the lease"
    );
    drop(client);

    let took = free_after(&env.store, "2").await;
    assert!(took < Duration::from_millis(200), "freed after {took:?}");
}

/// Counts a request as in flight until dropped.
struct InFlight(Arc<AtomicUsize>);

impl InFlight {
    fn enter(counter: &Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        InFlight(counter.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Calls of `EVALSHA`, `EVAL` and `SET` (a native extend is a `SET … IFEQ`) the server has
/// answered so far.
async fn script_calls(server: &RedisServer) -> u64 {
    let mut conn = server.connection().await;
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    stats
        .lines()
        .filter(|l| {
            ["cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_set:"]
                .iter()
                .any(|command| l.starts_with(command))
        })
        .filter_map(|l| {
            l.split_once("calls=")?
                .1
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_1000_cancelled_requests_leaves_no_lock_and_no_heartbeat() {
    const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(5));
    let heartbeat = Duration::from_millis(100);
    let server = RedisServer::start();
    let store = Store::from(RedisStore::new(server.connection_manager().await));
    let runs = Arc::new(AtomicUsize::new(0));
    let runs_in_app = runs.clone();
    let handler = move || {
        let runs = runs_in_app.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            let ms = rand::random_range(0..300);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            "done"
        }
    };
    // Requests the server still works on: a connection the kernel accepted during the storm can
    // reach the service after its client has gone, and hyper learns that only when it answers.
    let in_flight = Arc::new(AtomicUsize::new(0));
    let counter = in_flight.clone();
    let app = Router::new()
        .route("/jobs/{id}", post(handler))
        .route_layer(by_id(store, JOBS).heartbeat(heartbeat))
        .layer(axum::middleware::from_fn(
            move |req, next: axum::middleware::Next| {
                let guard = InFlight::enter(&counter);
                async move {
                    let _guard = guard;
                    next.run(req).await
                }
            },
        ));
    let (addr, connections) = serve_counting_connections(app).await;
    let http = Http::new();
    assert_eq!(http.post(addr, "/jobs/warm").await.status, StatusCode::OK);
    // The runtime's tasks, less hyper's one per open server connection: a connection the
    // kernel accepted during the storm is hyper's to close, whenever it learns of the close.
    let alive = || {
        let tasks = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        tasks.saturating_sub(connections.load(Ordering::SeqCst))
    };
    // Let the warm request's own tasks (its release) finish before taking the baseline.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let tasks_before = alive();

    // 1000 requests on 300 names, each connection closed at a random point: before the request
    // is complete, while the lease is taken, while the handler runs, or after it answered.
    let started = Instant::now();
    let mut storm = tokio::task::JoinSet::new();
    for i in 0..1000 {
        storm.spawn(async move {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            let request = format!(
                "POST /jobs/storm-{} HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n",
                i % 300
            );
            // Every third request whole, so that enough handlers start (a loaded machine reads
            // fewer of the others before their clients leave); the rest cut at a random point.
            let cut = if i % 3 == 0 {
                request.len()
            } else {
                rand::random_range(0..request.len() + 20)
            };
            let _ = stream
                .write_all(&request.as_bytes()[..cut.min(request.len())])
                .await;
            tokio::time::sleep(Duration::from_millis(rand::random_range(0..250))).await;
            drop(stream);
        });
    }
    while let Some(done) = storm.join_next().await {
        done.unwrap();
    }
    let storm_took = started.elapsed();
    while in_flight.load(Ordering::SeqCst) > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "requests never finished"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let server_done = started.elapsed();

    // A grace far below the 5 s TTL: every lease must have been released, not expired.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let keys = lock_keys(&server).await;
    // No heartbeat left: no script call reaches Redis over five heartbeat periods.
    let calls = script_calls(&server).await;
    tokio::time::sleep(5 * heartbeat).await;
    assert_eq!(
        script_calls(&server).await,
        calls,
        "something still extends leases"
    );
    // Tasks that are merely finishing (a release's round trip) may take a moment; a task per
    // lease that never ends would not.
    let mut tasks_after = alive();
    let settle = Instant::now();
    while tasks_after > tasks_before && settle.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
        tasks_after = alive();
    }
    eprintln!(
        "storm: 1000 requests cut in {storm_took:?}, served until {server_done:?}, {} handlers started; tasks {tasks_before} before, \
         {tasks_after} after ({} connections open); {} lock keys and no extend after a 500 ms grace",
        runs.load(Ordering::SeqCst),
        connections.load(Ordering::SeqCst),
        keys.len()
    );
    assert!(
        runs.load(Ordering::SeqCst) > 50,
        "too few requests reached a handler to mean anything"
    );
    assert!(
        tasks_after <= tasks_before,
        "{tasks_after} tasks alive vs {tasks_before} before"
    );
    // A key left behind was taken by an acquisition whose request was gone before the reply
    // came back: nobody holds its token, so only the TTL frees it.
    let mut conn = server.connection().await;
    let mut left = Vec::new();
    for key in keys.iter().take(3) {
        let pttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut conn)
            .await
            .unwrap();
        left.push(format!("{key} (PTTL {pttl} ms)"));
    }
    assert!(
        keys.is_empty(),
        "{} lock keys left after the storm: {left:?}",
        keys.len()
    );
}
