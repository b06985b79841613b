//! The variants the throughput benchmark compares, each one lock/release cycle as an [`Op`].

use std::convert::Infallible;
use std::future::Ready;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use tower::util::ServiceFn;
use tower::{Layer, Service, ServiceExt};
use tower_lease::layer::TimeoutBody;
use tower_lease::{Lock, LockLayer, RwLock, Semaphore, Store, extract};

use tower_lease_harness::Endpoint;
use tower_lease_harness::bench::{self, Op, Redis, op};

pub(crate) const TTL: Duration = Duration::from_secs(10);
pub(crate) const LOCK: Lock<str> = Lock::new("bench", TTL);
pub(crate) const RWLOCK: RwLock<str> = RwLock::new("bench", TTL);
/// Four permits per name, one taken per cycle.
pub(crate) const SEMAPHORE: Semaphore<str> = Semaphore::new("bench", 4, TTL);
pub(crate) const CONCURRENCY: [usize; 2] = [1, 64];

/// The compare-and-delete everyone writes next to `SET NX PX`.
static COMPARE_AND_DELETE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
});

/// The minimum, on a `ConnectionManager` set up as `RedisStore::connect` sets up its own.
pub(crate) const MINIMUM: &str = "hand-written SET NX PX + EVALSHA";
/// The same on one `MultiplexedConnection`, beside the store made with `RedisStore::new`.
pub(crate) const MINIMUM_MULTIPLEXED: &str =
    "hand-written SET NX PX + EVALSHA (MultiplexedConnection)";
/// The minimum on a server with native compare-and-delete (Valkey 9): no script at all.
pub(crate) const NATIVE_MINIMUM: &str = "hand-written SET NX PX + DELIFEQ";
/// The `Lock` the goals hold to the minimum: on a store made by `RedisStore::connect`.
pub(crate) const LOCK_REDIS: &str = "tower-lease Lock (Redis)";
pub(crate) const RSLOCK: &str = "rslock";
pub(crate) const REFUSED_HAND: &str = "refused: hand-written SET NX PX";
pub(crate) const REFUSED_LOCK: &str = "refused: Lock try_lock (Redis)";

/// The name every task of the refused variants asks for, held by someone else all along.
const HELD: &str = "held";
const HELD_HAND_KEY: &str = "tlbench:hand:held";

/// Takes the name of the refused variants for someone else, in both their keys.
async fn hold(conn: &mut redis::aio::MultiplexedConnection) {
    let layer_key = tower_lease::RedisStore::new(conn.clone())
        .prefix("tlbench")
        .key(
            tower_lease::store::KeyRole::Lock,
            LOCK.namespace(),
            HELD.as_bytes(),
        );
    for key in [HELD_HAND_KEY.as_bytes().to_vec(), layer_key] {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg("someone else")
            .arg("PX")
            .arg(3_600_000)
            .query_async(conn)
            .await
            .unwrap();
    }
}

/// Deletes what [`hold`] took, so the benchmark leaves no key behind.
pub(crate) async fn release_held(redis: &Redis) {
    let mut conn = redis.connection().await;
    let layer_key = tower_lease::RedisStore::new(conn.clone())
        .prefix("tlbench")
        .key(
            tower_lease::store::KeyRole::Lock,
            LOCK.namespace(),
            HELD.as_bytes(),
        );
    let _: () = redis::cmd("DEL")
        .arg(HELD_HAND_KEY)
        .arg(layer_key)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// One name per task, so that every acquisition is uncontended and must succeed.
fn names(prefix: &str) -> Arc<Vec<String>> {
    Arc::new(
        (0..CONCURRENCY[1])
            .map(|t| format!("{prefix}{t}"))
            .collect(),
    )
}

pub(crate) async fn variants(redis: &Redis) -> Vec<(&'static str, Op)> {
    let conn = redis.connection().await;
    let mut list: Vec<(&'static str, Op)> = Vec::new();

    // The store a user builds (`RedisStore::connect`) sends over a `ConnectionManager`, so the
    // minimum it is held to runs over one too, set up alike; the pair on one
    // `MultiplexedConnection` follows as rows of their own.
    let manager = redis.managed_connection().await;
    list.push((
        MINIMUM,
        minimum(manager.clone(), "tlbench:hand:", Release::Script),
    ));
    list.push((
        MINIMUM_MULTIPLEXED,
        minimum(conn.clone(), "tlbench:handm:", Release::Script),
    ));
    if has_delifeq(&conn).await {
        list.push((
            NATIVE_MINIMUM,
            minimum(manager.clone(), "tlbench:native:", Release::Native),
        ));
    }

    if std::env::var_os("BENCH_DIAG").is_some() {
        diagnostics(&mut list, &conn);
    }

    // The refused path: every task asks for one name someone else holds.
    hold(&mut conn.clone()).await;
    let hand = conn.clone();
    list.push((
        REFUSED_HAND,
        op(move |_, _| {
            let mut conn = hand.clone();
            async move {
                let token: [u8; 16] = rand::random();
                let set: Option<String> = bench::set_nx_px(HELD_HAND_KEY, &token, TTL)
                    .query_async(&mut conn)
                    .await
                    .expect("SET NX PX");
                assert!(set.is_none(), "the held name was free");
            }
        }),
    ));
    let store = redis_store(conn.clone());
    list.push((
        REFUSED_LOCK,
        op(move |_, _| {
            let store = store.clone();
            async move {
                let attempt = LOCK.attempt(&store, HELD).await.unwrap();
                let retry_after = attempt.retry_after().expect("the held name was free");
                assert!(retry_after > Duration::ZERO);
            }
        }),
    ));

    let mut manager = rslock::LockManager::new(vec![redis.url()]);
    // One server and one try: the same work as the others, no retry loop.
    manager.set_retry(1, Duration::from_millis(1));
    let keys = names("tlbench:rslock:");
    list.push((
        RSLOCK,
        op(move |task, _| {
            let (manager, keys) = (manager.clone(), keys.clone());
            async move {
                let lock = manager
                    .lock(keys[task].as_bytes(), TTL)
                    .await
                    .expect("rslock did not acquire");
                manager.unlock(&lock).await;
            }
        }),
    ));

    // The store on one `MultiplexedConnection` (`RedisStore::new`): its timeout kept by the
    // connection's own response timeout, no release notifications.
    list.push((
        "tower-lease Lock (Redis, MultiplexedConnection)",
        lock_cycle(redis_store(conn.clone())),
    ));
    // What a user builds: `RedisStore::connect` (a `ConnectionManager`, release notifications,
    // the native compare-and-set probe).
    let connected: Store = tower_lease::RedisStore::connect(&redis.url())
        .await
        .expect("RedisStore::connect")
        .prefix("tlbench")
        .into();

    let stores = [
        (
            "tower-lease Lock (Redis)",
            "RwLock read (Redis)",
            "RwLock write (Redis)",
            "Semaphore permit (Redis)",
            connected.clone(),
        ),
        (
            "tower-lease Lock (memory)",
            "RwLock read (memory)",
            "RwLock write (memory)",
            "Semaphore permit (memory)",
            Store::memory(),
        ),
    ];
    for (lock, read, write, permit, store) in stores {
        list.push((lock, lock_cycle(store.clone())));
        let (s, holders) = (store.clone(), names("p"));
        list.push((
            permit,
            op(move |task, _| {
                let (store, names) = (s.clone(), holders.clone());
                async move {
                    let permit = SEMAPHORE.try_acquire(&store, &names[task]).await.unwrap();
                    assert!(permit.expect("a permit free").release().await.unwrap());
                }
            }),
        ));
        let (s, readers) = (store.clone(), names("r"));
        list.push((
            read,
            op(move |task, _| {
                let (store, names) = (s.clone(), readers.clone());
                async move {
                    let token = RWLOCK.try_read(&store, &names[task]).await.unwrap();
                    assert!(token.expect("read lock held").release().await.unwrap());
                }
            }),
        ));
        let writers = names("w");
        list.push((
            write,
            op(move |task, _| {
                let (store, names) = (store.clone(), writers.clone());
                async move {
                    let token = RWLOCK.try_write(&store, &names[task]).await.unwrap();
                    assert!(token.expect("write lock held").release().await.unwrap());
                }
            }),
        ));
    }
    for (layered, bare, store) in [
        (
            "LockLayer request (Redis)",
            "bare request + Lock cycle (Redis)",
            connected.clone(),
        ),
        (
            "LockLayer request (memory)",
            "bare request + Lock cycle (memory)",
            Store::memory(),
        ),
    ] {
        list.push((layered, layer_request(store.clone(), false)));
        list.push((bare, bare_request(store, false)));
    }
    // The same two with a request as axum hands it to a route layer: its extensions already
    // hold what the router put there, so the layer's `Lease` is not the map's first entry.
    let store = Store::memory();
    list.push((
        "LockLayer request as axum routes it (memory)",
        layer_request(store.clone(), true),
    ));
    list.push((
        "bare request as axum routes it + Lock cycle (memory)",
        bare_request(store, true),
    ));
    // And with a handler that waits once before it answers, as real ones do: the layer then
    // waits for the lease's first beat too.
    for (layered, bare, store) in [
        (
            "LockLayer request to a waiting handler (Redis)",
            "bare request to a waiting handler + Lock cycle (Redis)",
            connected.clone(),
        ),
        (
            "LockLayer request to a waiting handler (memory)",
            "bare request to a waiting handler + Lock cycle (memory)",
            Store::memory(),
        ),
    ] {
        list.push((
            layered,
            layer_request_with(store.clone(), false, waits_once::<TimeoutBody<Body>>),
        ));
        list.push((bare, bare_request_with(store, false, waits_once::<Body>)));
    }
    list
}

/// An inner service that yields to the runtime once before it answers.
fn waits_once<B>() -> ServiceFn<fn(Request<B>) -> AnswerAfterAYield> {
    tower::service_fn(|_req| AnswerAfterAYield(false))
}

/// Pending once (waking itself at once), then the response: a handler that waits, without a
/// timer or an allocation of its own.
struct AnswerAfterAYield(bool);

impl std::future::Future for AnswerAfterAYield {
    type Output = Result<Response<Body>, Infallible>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        if self.0 {
            return std::task::Poll::Ready(Ok(Response::new(Body::new())));
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

/// What axum's router leaves in a request's extensions before a route layer sees it (it
/// inserts the matched path and the path's parameters); one entry stands for them.
#[derive(Clone)]
struct Routed;

fn request(path: &str, routed: bool) -> Request<Body> {
    let mut req = Request::post(path).body(Body::new()).unwrap();
    if routed {
        req.extensions_mut().insert(Routed);
    }
    req
}

type Body = Empty<Bytes>;

/// `B`: the request body, the layer's [`TimeoutBody`] or the bare one.
type Noop<B> = ServiceFn<fn(Request<B>) -> Ready<Result<Response<Body>, Infallible>>>;

/// The inner service of the layer variants: answers at once.
fn noop<B>() -> Noop<B> {
    tower::service_fn(|_req| std::future::ready(Ok(Response::new(Body::new()))))
}

/// The paths of the requests, one name per task, locked on their second segment.
fn paths() -> Arc<Vec<String>> {
    Arc::new((0..CONCURRENCY[1]).map(|t| format!("/jobs/{t}")).collect())
}

fn layer_request(store: Store, routed: bool) -> Op {
    layer_request_with(store, routed, noop::<TimeoutBody<Body>>)
}

fn layer_request_with<S>(store: Store, routed: bool, inner: fn() -> S) -> Op
where
    S: Service<Request<TimeoutBody<Body>>, Response = Response<Body>, Error = Infallible>,
    S: Clone + Send + Sync + 'static,
    S::Future: Send,
{
    let service = LockLayer::new(store, LOCK, extract::path_segment(1)).layer(inner());
    let paths = paths();
    op(move |task, _| {
        let (service, paths) = (service.clone(), paths.clone());
        async move {
            let req = request(&paths[task], routed);
            let res = service.oneshot(req).await.unwrap();
            assert_eq!(
                res.status(),
                StatusCode::OK,
                "the layer refused the request"
            );
        }
    })
}

/// What the layer does, written out: take the lease, call the service, release.
fn bare_request(store: Store, routed: bool) -> Op {
    bare_request_with(store, routed, noop::<Body>)
}

fn bare_request_with<S>(store: Store, routed: bool, inner: fn() -> S) -> Op
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    S: Clone + Send + Sync + 'static,
    S::Future: Send,
{
    let service = inner();
    let (paths, names) = (paths(), names(""));
    op(move |task, _| {
        let (store, service, paths) = (store.clone(), service.clone(), paths.clone());
        let names = names.clone();
        async move {
            let token = LOCK
                .try_lock(&store, &names[task])
                .await
                .unwrap()
                .expect("lock held");
            let req = request(&paths[task], routed);
            let res = service.oneshot(req).await.unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            assert!(token.release().await.unwrap());
        }
    })
}

/// How the minimum releases: the compare-and-delete script, or `DELIFEQ` (Valkey 9).
#[derive(Clone, Copy)]
enum Release {
    Script,
    Native,
}

/// The hand-written lock/release cycle, `SET NX PX` and a compare-and-delete, on `conn`.
fn minimum<C>(conn: C, prefix: &str, release: Release) -> Op
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let keys = names(prefix);
    op(move |task, _| {
        let (mut conn, keys) = (conn.clone(), keys.clone());
        async move {
            let key = keys[task].as_str();
            let token: [u8; 16] = rand::random();
            let set: Option<String> = bench::set_nx_px(key, &token, TTL)
                .query_async(&mut conn)
                .await
                .expect("SET NX PX");
            assert!(set.is_some(), "the hand-written lock was held");
            let deleted: i64 = match release {
                Release::Script => COMPARE_AND_DELETE
                    .key(key)
                    .arg(&token[..])
                    .invoke_async(&mut conn)
                    .await
                    .expect("EVALSHA"),
                Release::Native => redis::cmd("DELIFEQ")
                    .arg(key)
                    .arg(&token[..])
                    .query_async(&mut conn)
                    .await
                    .expect("DELIFEQ"),
            };
            assert_eq!(deleted, 1, "the hand-written release found no lease");
        }
    })
}

/// Whether the server has `DELIFEQ` (Valkey 9.0+).
async fn has_delifeq(conn: &redis::aio::MultiplexedConnection) -> bool {
    let info: Vec<redis::Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("DELIFEQ")
        .query_async(&mut conn.clone())
        .await
        .unwrap_or_default();
    info.first().is_some_and(|info| *info != redis::Value::Nil)
}

fn redis_store(conn: redis::aio::MultiplexedConnection) -> Store {
    tower_lease::RedisStore::new(conn).prefix("tlbench").into()
}

fn lock_cycle(store: Store) -> Op {
    let names = names("n");
    op(move |task, _| {
        let (store, names) = (store.clone(), names.clone());
        async move {
            let token = LOCK.try_lock(&store, &names[task]).await.unwrap();
            assert!(token.expect("lock held").release().await.unwrap());
        }
    })
}

static ACQUIRE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(include_str!(
        "../../src/store/redis/scripts/lock/acquire.lua"
    ))
});

/// Where the cost of a cycle goes: the minimum with one change each.
fn diagnostics(list: &mut Vec<(&'static str, Op)>, conn: &redis::aio::MultiplexedConnection) {
    // A timeout set with `RedisStore::timeout` is kept by a timer of the store's own, one per
    // call, where the default one is the connection's response timeout: its price.
    let store: Store = tower_lease::RedisStore::new(conn.clone())
        .prefix("tlbench")
        .timeout(Duration::from_secs(1))
        .into();
    list.push(("diag: Lock (Redis) with timeout(1 s)", lock_cycle(store)));
    // The layer spawns a heartbeat task per request and aborts it at the release: its price.
    let (store, sleepers) = (redis_store(conn.clone()), names("s"));
    list.push((
        "diag: Lock cycle + spawned, aborted sleeper",
        op(move |task, _| {
            let (store, names) = (store.clone(), sleepers.clone());
            async move {
                let token = LOCK.try_lock(&store, &names[task]).await.unwrap();
                let sleeper = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(
                    tokio::time::sleep(Duration::from_secs(3)),
                ));
                assert!(token.expect("lock held").release().await.unwrap());
                drop(sleeper);
            }
        }),
    ));
    let keys = names("tlbench:diag1:");
    let c = conn.clone();
    list.push((
        "diag: minimum + tokio timeout",
        op(move |task, _| {
            let (mut conn, keys) = (c.clone(), keys.clone());
            async move {
                let key = keys[task].as_str();
                let token: [u8; 16] = rand::random();
                let t = Duration::from_secs(1);
                let set: Option<String> = tokio::time::timeout(
                    t,
                    bench::set_nx_px(key, &token, TTL).query_async(&mut conn),
                )
                .await
                .unwrap()
                .unwrap();
                assert!(set.is_some());
                let deleted: i64 = tokio::time::timeout(
                    t,
                    COMPARE_AND_DELETE
                        .key(key)
                        .arg(&token[..])
                        .invoke_async(&mut conn),
                )
                .await
                .unwrap()
                .unwrap();
                assert_eq!(deleted, 1);
            }
        }),
    ));
    let keys = names("tlbench:diag2:");
    let c = conn.clone();
    list.push((
        "diag: EVALSHA acquire.lua + EVALSHA",
        op(move |task, _| {
            let (mut conn, keys) = (c.clone(), keys.clone());
            async move {
                let key = keys[task].as_str();
                let token: [u8; 16] = rand::random();
                let (ok, _): (i64, i64) = ACQUIRE
                    .key(key)
                    .arg(&token[..])
                    .arg(TTL.as_millis() as u64)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(ok, 1);
                let deleted: i64 = COMPARE_AND_DELETE
                    .key(key)
                    .arg(&token[..])
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(deleted, 1);
            }
        }),
    ));
    let keys = names("tlbench:diag3:");
    let c = conn.clone();
    list.push((
        "diag: pipeline SET NX PX + PTTL, EVALSHA",
        op(move |task, _| {
            let (mut conn, keys) = (c.clone(), keys.clone());
            async move {
                let key = keys[task].as_str();
                let token: [u8; 16] = rand::random();
                let (set, _pttl): (Option<String>, i64) = redis::pipe()
                    .add_command(bench::set_nx_px(key, &token, TTL))
                    .cmd("PTTL")
                    .arg(key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert!(set.is_some());
                let deleted: i64 = COMPARE_AND_DELETE
                    .key(key)
                    .arg(&token[..])
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(deleted, 1);
            }
        }),
    ));
}
