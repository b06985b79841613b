//! A Redis restart costs no request: the first call after it succeeds (the store retries once,
//! at once, a call whose connection it found dropped); a retried acquisition whose first reply
//! was lost answers with our own lease, never "busy" with our lease left behind; and with Redis
//! unreachable a bounded wait ends with the store's error at once rather than at its deadline.

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use tower_lease::store::{KeyLayout, KeyRole};
use tower_lease::{Lock, RedisStore, RwLock, Semaphore, Store};

use tower_lease_harness::proxy::{Fault, Proxy};
use tower_lease_harness::{Endpoint, RedisServer};

const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(5));
const FENCED: Lock<str> = Lock::new("fenced", Duration::from_secs(5)).fenced();
const DOCS: RwLock<str> = RwLock::new("docs", Duration::from_secs(5)).fenced();
const SEATS: Semaphore<str> = Semaphore::new("seats", 1, Duration::from_secs(5));

/// Restarts `server` off the runtime's threads (it blocks until the server answers again).
async fn restart(server: RedisServer) -> RedisServer {
    tokio::task::spawn_blocking(move || {
        let mut server = server;
        server.restart();
        server
    })
    .await
    .unwrap()
}

/// The two ways a store reaches a single Redis through a connection manager.
async fn stores(server: &RedisServer) -> [(&'static str, Store); 2] {
    [
        (
            "connect",
            RedisStore::connect(&server.url()).await.unwrap().into(),
        ),
        (
            "manager",
            Store::from(RedisStore::new(server.connection_manager().await)),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_call_after_a_redis_restart_succeeds() {
    for persistent in [false, true] {
        let server = if persistent {
            RedisServer::start_persistent()
        } else {
            RedisServer::start()
        };
        let stores = stores(&server).await;
        let mut server = server;
        for round in 0..3 {
            for (_, store) in &stores {
                let token = JOBS.try_lock(store, "warm").await.unwrap().unwrap();
                assert!(token.release().await.unwrap());
            }
            server = restart(server).await;
            for (how, store) in &stores {
                // One call of each kind: a script, the `SET NX` path, a release.
                let name = format!("{how}-{round}");
                let first = JOBS.try_lock(store, &name).await;
                let context = format!("{how}, persistent {persistent}, round {round}");
                let token = first.unwrap_or_else(|e| panic!("{context}: {e}"));
                assert!(token.expect("free").release().await.unwrap(), "{context}");
            }
            server = restart(server).await;
            for (how, store) in &stores {
                let context = format!("{how}, persistent {persistent}, round {round}");
                let read = DOCS.try_read(store, "after").await;
                let read = read.unwrap_or_else(|e| panic!("{context}: {e}"));
                assert!(read.expect("free").release().await.unwrap(), "{context}");
            }
        }
    }
}

/// Runs `acquire` through a proxy that drops the reply once the command reached Redis (seen by
/// `taken` on a line of its own), then severs the connection: the store's retry must find our
/// own lease. `meanwhile`, a key set before the severing, is what another process did between
/// the two tries (a writer's intent, which refuses new readers).
async fn lost_reply<T, F>(
    proxy: &Proxy,
    raw: &mut redis::aio::MultiplexedConnection,
    acquire: F,
    taken: &[u8],
    meanwhile: Option<Vec<u8>>,
) -> T
where
    F: Future<Output = tower_lease::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    proxy.set(Fault::DropReplies);
    let call = tokio::spawn(acquire);
    let started = Instant::now();
    loop {
        let kind: String = redis::cmd("TYPE")
            .arg(taken)
            .query_async(raw)
            .await
            .unwrap();
        if kind != "none" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "never reached Redis"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    if let Some(key) = meanwhile {
        let () = raw.set_ex(key, "writer", 5).await.unwrap();
    }
    proxy.set(Fault::Pass);
    proxy.sever();
    call.await
        .unwrap()
        .expect("the retry answers, not the severed connection")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_acquisition_whose_reply_was_lost_answers_with_our_own_lease() {
    let server = RedisServer::start();
    let mut raw = server.connection().await;
    let proxy = Proxy::to(&server).await;
    let store = Store::from(RedisStore::new(proxy.connection_manager().await));
    let layout = KeyLayout::default();
    let key = |role, namespace, name: &str| layout.key(role, namespace, name.as_bytes());
    // Every script cached first: a lost `NOSCRIPT` reply would stop the test, not the store.
    let fenced = FENCED.try_lock(&store, "warm").await.unwrap().unwrap();
    assert!(fenced.release().await.unwrap());
    let write = DOCS.try_write(&store, "warm").await.unwrap().unwrap();
    assert!(write.release().await.unwrap());
    let read = DOCS.try_read(&store, "warm").await.unwrap().unwrap();
    assert!(read.release().await.unwrap());
    let permit = SEATS.try_acquire(&store, "warm").await.unwrap().unwrap();
    assert!(permit.release().await.unwrap());

    let s = store.clone();
    let lock = lost_reply(
        &proxy,
        &mut raw,
        async move { JOBS.try_lock(&s, "lost").await },
        &key(KeyRole::Lock, "jobs", "lost"),
        None,
    )
    .await
    .expect("our own lease, not busy");
    assert!(lock.release().await.unwrap(), "the lease was ours");

    // The same for a name refused lately, whose `SET NX` goes with its `PTTL`.
    let other = JOBS.try_lock(&store, "hot").await.unwrap().unwrap();
    assert!(JOBS.try_lock(&store, "hot").await.unwrap().is_none());
    assert!(other.release().await.unwrap());
    let s = store.clone();
    let hot = lost_reply(
        &proxy,
        &mut raw,
        async move { JOBS.try_lock(&s, "hot").await },
        &key(KeyRole::Lock, "jobs", "hot"),
        None,
    )
    .await
    .expect("our own lease, not busy");
    assert!(hot.release().await.unwrap());

    let s = store.clone();
    let fenced = lost_reply(
        &proxy,
        &mut raw,
        async move { FENCED.try_lock(&s, "lost").await },
        &key(KeyRole::Lock, "fenced", "lost"),
        None,
    )
    .await
    .expect("our own lease, not busy");
    let counter: u64 = raw
        .get(key(KeyRole::LockFence, "fenced", "lost"))
        .await
        .unwrap();
    assert_eq!(fenced.fence(), Some(counter), "the fence we were given");
    assert!(fenced.release().await.unwrap());

    let s = store.clone();
    let write = lost_reply(
        &proxy,
        &mut raw,
        async move { DOCS.try_write(&s, "lost").await },
        &key(KeyRole::Writer, "docs", "lost"),
        None,
    )
    .await
    .expect("our own lease, not busy");
    let counter: u64 = raw
        .get(key(KeyRole::RwLockFence, "docs", "lost"))
        .await
        .unwrap();
    assert_eq!(write.fence(), Some(counter));
    assert!(write.release().await.unwrap());

    let s = store.clone();
    let read = lost_reply(
        &proxy,
        &mut raw,
        async move { DOCS.try_read(&s, "lost-read").await },
        &key(KeyRole::Readers, "docs", "lost-read"),
        Some(key(KeyRole::WriteIntent, "docs", "lost-read")),
    )
    .await
    .expect("our own lease, not busy");
    assert!(read.release().await.unwrap());

    let s = store.clone();
    let permit = lost_reply(
        &proxy,
        &mut raw,
        async move { SEATS.try_acquire(&s, "lost").await },
        &key(KeyRole::Permits, "seats", "lost"),
        None,
    )
    .await
    .expect("our own permit, not full");
    assert!(permit.release().await.unwrap());

    // Nothing left behind: every lease above was ours, and released.
    let mut left: Vec<Vec<u8>> = raw.keys("*").await.unwrap();
    left.retain(|key| !key.ends_with(b":fence") && !key.ends_with(b":wi"));
    assert!(left.is_empty(), "{left:?}");
}

/// A store through `proxy` with the default 1 s timeout, whose subscriber connection for
/// release notifications is live: a wait on a name held elsewhere has used it.
async fn a_store_that_waited(server: &RedisServer, proxy: &Proxy) -> Store {
    let store: Store = RedisStore::connect(&proxy.url()).await.unwrap().into();
    let elsewhere: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let held = JOBS.try_lock(&elsewhere, "held").await.unwrap().unwrap();
    let wait = Duration::from_millis(50);
    assert!(
        JOBS.try_lock_for(&store, "held", wait)
            .await
            .unwrap()
            .is_none()
    );
    assert!(held.release().await.unwrap());
    store
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bounded_wait_with_redis_unreachable_ends_with_the_store_error_at_once() {
    let server = RedisServer::start();
    let proxy = Proxy::to(&server).await;
    let store = a_store_that_waited(&server, &proxy).await;
    proxy.set(Fault::Blackhole);
    for name in ["held", "other"] {
        let started = Instant::now();
        let wait = Duration::from_secs(2);
        let waited = tokio::time::timeout(
            Duration::from_secs(5),
            JOBS.try_lock_for(&store, name, wait),
        )
        .await
        .expect("the wait ends");
        let took = started.elapsed();
        println!("{name}: a 2 s wait with Redis unreachable ended after {took:?}");
        assert!(waited.is_err(), "{name}: the store's error");
        assert!(took < Duration::from_millis(1200), "{name}: {took:?}");
    }
}

/// The same over HTTP: a request under `LockLayer::wait(2 s)` with Redis blackholed is answered
/// `503` after about the store's timeout, not after its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_request_with_redis_unreachable_is_answered_503_at_once() {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;

    use axum::Router;
    use axum::routing::post;
    use http::StatusCode;
    use tower_lease::{LockLayer, extract};

    use tower_lease_harness::http::{Http, count, serve};

    let server = RedisServer::start();
    let proxy = Proxy::to(&server).await;
    let store = a_store_that_waited(&server, &proxy).await;
    let layer =
        LockLayer::new(store, JOBS, extract::path_segment(1)).max_wait(Duration::from_secs(2));
    let app = Router::new()
        .route("/jobs/{id}", post(count))
        .route_layer(layer)
        .with_state(Arc::new(AtomicUsize::new(0)));
    let addr = serve(app).await;
    proxy.set(Fault::Blackhole);
    let started = Instant::now();
    let reply = tokio::time::timeout(Duration::from_secs(5), Http::new().post(addr, "/jobs/held"))
        .await
        .expect("answered");
    let took = started.elapsed();
    println!(
        "a request waiting 2 s with Redis unreachable: {} after {took:?}",
        reply.status
    );
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(took < Duration::from_millis(1200), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_one_name_with_redis_down_all_end_with_the_store_error_at_once() {
    let mut server = RedisServer::start();
    let store: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let token = JOBS.try_lock(&store, "warm").await.unwrap().unwrap();
    assert!(token.release().await.unwrap());
    server.stop();
    let started = Instant::now();
    let waiters: Vec<_> = (0..20)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let wait = Duration::from_secs(2);
                let waited = JOBS.try_lock_for(&store, "down", wait).await;
                (waited.is_err(), started.elapsed())
            })
        })
        .collect();
    let mut slowest = Duration::ZERO;
    for waiter in waiters {
        let (failed, took) = waiter.await.unwrap();
        assert!(failed, "the store's error");
        slowest = slowest.max(took);
    }
    println!("20 waiters with Redis down: the last ended after {slowest:?}");
    assert!(slowest < Duration::from_millis(600), "{slowest:?}");
}
