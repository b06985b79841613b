//! The three ways of holding leases the benchmark compares.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use tokio_util::sync::CancellationToken;
use tower::{Layer, ServiceExt};
use tower_lease::layer::TimeoutBody;
use tower_lease::{Lease, Lock, LockLayer, RedisStore, Store, extract};

use crate::probe::{Probe, Stats, wait_deadline};

use tower_lease_harness::Endpoint;
use tower_lease_harness::bench::{self, Redis};

pub(crate) const TTL: Duration = Duration::from_secs(3);
const LEASES: Lock<str> = Lock::new("held", TTL);

/// Leases held by requests in flight through `LockLayer`; its heartbeat keeps them.
pub(crate) async fn through_layer(redis: &Redis, leases: usize, hold: Duration) -> Stats {
    let conn = redis.connection().await;
    let store: Store = RedisStore::new(conn).prefix("bench-layer").into();
    let held = Arc::new(AtomicUsize::new(0));
    let kept = Arc::new(AtomicUsize::new(0));
    let done = CancellationToken::new();
    let handler = {
        let (held, kept, done) = (held.clone(), kept.clone(), done.clone());
        tower::service_fn(move |req: Request<TimeoutBody<Empty<Bytes>>>| {
            let (held, kept, done) = (held.clone(), kept.clone(), done.clone());
            async move {
                let lease = req
                    .extensions()
                    .get::<Lease>()
                    .cloned()
                    .expect("a Lease extension");
                held.fetch_add(1, Ordering::SeqCst);
                done.cancelled().await;
                if lease.is_held() {
                    kept.fetch_add(1, Ordering::SeqCst);
                }
                Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
            }
        })
    };
    let service = LockLayer::new(store, LEASES, extract::path_segment(1)).layer(handler);
    let request = |name: String| {
        let req = Request::post(format!("/l/{name}"))
            .body(Empty::new())
            .unwrap();
        tokio::spawn(service.clone().oneshot(req))
    };

    // Warm up the connection, the script cache and the runtime before the baselines.
    let warm = request("warm".into());
    while held.load(Ordering::SeqCst) < 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut probe = Probe::start(redis, leases).await;
    let requests: Vec<_> = (0..leases).map(|i| request(i.to_string())).collect();
    while held.load(Ordering::SeqCst) < leases + 1 {
        wait_deadline(probe.started);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let held_now = probe.held();
    #[allow(
        clippy::exit,
        reason = "a profiling hook: the heap alive at exit is the point"
    )]
    if std::env::var("HEARTBEAT_EXIT").is_ok_and(|at| at == "held") {
        // For a heap profiler (valgrind's DHAT): what is alive at exit is what the held
        // requests keep. The redis-server dies with this process.
        std::process::exit(0);
    }
    let mut stats = probe.window(held_now, hold).await;

    done.cancel();
    let mut ok = 0;
    for request in requests {
        let res = request.await.expect("a request task panicked").unwrap();
        ok += usize::from(res.status() == StatusCode::OK);
    }
    assert_eq!(warm.await.unwrap().unwrap().status(), StatusCode::OK);
    // A lost lease shows twice: the handler sees `is_held() == false`, the client a 503.
    stats.lost = (leases - kept.load(Ordering::SeqCst).min(leases)).max(leases - ok);
    probe.finish("bench-layer").await;
    stats
}

/// Leases held as plain tokens, each extended every TTL/3 by a task of its own.
pub(crate) async fn plain_tokens(redis: &Redis, leases: usize, hold: Duration) -> Stats {
    let conn = redis.connection().await;
    let store: Store = RedisStore::new(conn).prefix("bench-tokens").into();
    // Warm up the connection and the script cache before the baselines.
    let warm = LEASES.try_lock(&store, "warm").await.unwrap().unwrap();
    assert!(warm.extend().await.unwrap() && warm.release().await.unwrap());
    let mut probe = Probe::start(redis, leases).await;
    let held = Arc::new(AtomicUsize::new(0));
    let done = CancellationToken::new();
    let tasks: Vec<_> = (0..leases)
        .map(|i| {
            let (store, held, done) = (store.clone(), held.clone(), done.clone());
            tokio::spawn(async move {
                let token = LEASES
                    .try_lock(&store, &i.to_string())
                    .await
                    .unwrap()
                    .unwrap();
                held.fetch_add(1, Ordering::SeqCst);
                let mut every = tokio::time::interval(TTL / 3);
                every.tick().await;
                let kept = loop {
                    tokio::select! {
                        () = done.cancelled() => break true,
                        _ = every.tick() => {
                            if !token.extend().await.unwrap() {
                                break false;
                            }
                        }
                    }
                };
                kept && token.release().await.unwrap()
            })
        })
        .collect();
    while held.load(Ordering::SeqCst) < leases {
        wait_deadline(probe.started);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut stats = probe.window(probe.held(), hold).await;
    done.cancel();
    for task in tasks {
        stats.lost += usize::from(!task.await.expect("a token task panicked"));
    }
    probe.finish("bench-tokens").await;
    stats
}

/// Leases held as [`Held`](tower_lease::Held)s, kept in a `Vec` by no task of their own: the
/// store's heartbeat extends them all, as it does for jobs.
pub(crate) async fn held_jobs(redis: &Redis, leases: usize, hold: Duration) -> Stats {
    let conn = redis.connection().await;
    let store: Store = RedisStore::new(conn).prefix("bench-held").into();
    let warm = LEASES.try_lock(&store, "warm").await.unwrap().unwrap();
    assert!(warm.extend().await.unwrap() && warm.release().await.unwrap());
    let mut probe = Probe::start(redis, leases).await;
    let mut held = Vec::with_capacity(leases);
    for i in 0..leases {
        let token = LEASES.try_lock(&store, &i.to_string()).await.unwrap();
        held.push(token.expect("a free name").keep_alive());
        wait_deadline(probe.started);
    }
    let mut stats = probe.window(probe.held(), hold).await;
    for lease in held {
        let kept = lease.is_held() && lease.release().await.unwrap();
        stats.lost += usize::from(!kept);
    }
    probe.finish("bench-held").await;
    stats
}

/// The same extends by hand, batched: one task sends every due extend (the compare-and-`PEXPIRE`
/// tower-lease runs) in pipelines of 500. Not something tower-lease does: the floor a batching
/// heartbeat could reach.
pub(crate) async fn batched(redis: &Redis, leases: usize, hold: Duration) -> Stats {
    const BATCH: usize = 500;
    static EXTEND: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
        redis::Script::new(include_str!(
            "../../src/store/redis/scripts/lock/extend.lua"
        ))
    });
    let mut conn = redis.connection().await;
    let ttl = TTL.as_millis() as u64;
    let warm: i64 = EXTEND
        .key("bench-batched:warm")
        .arg("x")
        .arg(ttl)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(warm, 0);
    let mut probe = Probe::start(redis, leases).await;
    let held: Arc<Vec<(String, [u8; 16])>> = Arc::new(
        (0..leases)
            .map(|i| (format!("bench-batched:{i}"), rand::random()))
            .collect(),
    );
    for chunk in held.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for (key, token) in chunk {
            pipe.add_command(bench::set_nx_px(key, &token[..], TTL))
                .ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
    }
    let lost = Arc::new(AtomicUsize::new(0));
    let done = CancellationToken::new();
    let beat = {
        let (held, lost, done, mut conn) = (held.clone(), lost.clone(), done.clone(), conn.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(TTL / 3);
            every.tick().await;
            loop {
                tokio::select! {
                    () = done.cancelled() => return,
                    _ = every.tick() => {}
                }
                for chunk in held.chunks(BATCH) {
                    let mut pipe = redis::pipe();
                    for (key, token) in chunk {
                        pipe.invoke_script(EXTEND.key(key).arg(&token[..]).arg(ttl));
                    }
                    let extended: Vec<i64> = pipe.query_async(&mut conn).await.unwrap();
                    let failed = extended.iter().filter(|&&n| n != 1).count();
                    lost.fetch_add(failed, Ordering::SeqCst);
                }
            }
        })
    };
    let mut stats = probe.window(probe.held(), hold).await;
    done.cancel();
    beat.await.unwrap();
    for chunk in held.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for (key, token) in chunk {
            // The script publishes each release on the channel it is given; nobody listens here.
            pipe.invoke_script(
                RELEASE
                    .key(key)
                    .arg(&token[..])
                    .arg("bench-batched-released"),
            );
        }
        let released: Vec<i64> = pipe.query_async(&mut conn).await.unwrap();
        lost.fetch_add(
            released.iter().filter(|&&n| n != 1).count(),
            Ordering::SeqCst,
        );
    }
    stats.lost = lost.load(Ordering::SeqCst);
    probe.finish("bench-batched").await;
    stats
}

static RELEASE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(include_str!(
        "../../src/store/redis/scripts/lock/release.lua"
    ))
});
