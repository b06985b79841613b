//! Lock/release cycles per second: tower-lease side by side with the hand-written minimum and
//! with `rslock`, on one `redis-server`, at 1 and 64 concurrent tasks.
//!
//! ```text
//! cargo bench --all-features --bench throughput
//! BENCH_ROUNDS=15 BENCH_ROUND_MS=1000 cargo bench --all-features --bench throughput
//! ```
//!
//! Every variant runs once per round, in an order that rotates from round to round, so drift on a
//! shared machine hits all of them alike; the table shows the median of the rounds and ratios.
//! Every cycle checks its own result: a lock that is not acquired or not released panics.

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Ready;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use tower::util::ServiceFn;
use tower::{Layer, ServiceExt};
use tower_lease::{Lock, LockLayer, RwLock, Store, extract};

use support::{Op, Redis, Settings, median, op, quantile_us};

const TTL: Duration = Duration::from_secs(10);
const LOCK: Lock<str> = Lock::new("bench", TTL);
const RWLOCK: RwLock<str> = RwLock::new("bench", TTL);
const CONCURRENCY: [usize; 2] = [1, 64];

/// The compare-and-delete everyone writes next to `SET NX PX`.
static COMPARE_AND_DELETE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
});

/// Counts allocations when `BENCH_DIAG` is set (an allocation count per cycle is steady where
/// timings are not); otherwise it only forwards, so the timings are not disturbed.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller upholds `alloc`'s contract, which is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MINIMUM: &str = "hand-written SET NX PX + EVALSHA";
const RSLOCK: &str = "rslock";

fn main() {
    let settings = Settings::from_env(15, 150);
    COUNTING.store(std::env::var_os("BENCH_DIAG").is_some(), Ordering::Relaxed);
    let redis = Redis::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(bench(&redis, settings));
}

/// One name per task, so that every acquisition is uncontended and must succeed.
fn names(prefix: &str) -> Arc<Vec<String>> {
    Arc::new(
        (0..CONCURRENCY[1])
            .map(|t| format!("{prefix}{t}"))
            .collect(),
    )
}

async fn variants(redis: &Redis) -> Vec<(&'static str, Op)> {
    let conn = redis.connection().await;
    let mut list: Vec<(&'static str, Op)> = Vec::new();

    let keys = names("tlbench:hand:");
    let hand = conn.clone();
    list.push((
        MINIMUM,
        op(move |task, _| {
            let (mut conn, keys) = (hand.clone(), keys.clone());
            async move {
                let key = keys[task].as_str();
                let token: [u8; 16] = rand::random();
                let set: Option<String> = redis::cmd("SET")
                    .arg(key)
                    .arg(&token[..])
                    .arg("NX")
                    .arg("PX")
                    .arg(TTL.as_millis() as u64)
                    .query_async(&mut conn)
                    .await
                    .expect("SET NX PX");
                assert!(set.is_some(), "the hand-written lock was held");
                let deleted: i64 = COMPARE_AND_DELETE
                    .key(key)
                    .arg(&token[..])
                    .invoke_async(&mut conn)
                    .await
                    .expect("EVALSHA");
                assert_eq!(deleted, 1, "the hand-written release found no lease");
            }
        }),
    ));

    if std::env::var_os("BENCH_DIAG").is_some() {
        diagnostics(&mut list, &conn);
    }

    let mut manager = rslock::LockManager::new(vec![redis.url().to_owned()]);
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

    // What most applications hand the store: a ConnectionManager (it reconnects by itself).
    let manager = redis::aio::ConnectionManager::new(redis.client())
        .await
        .unwrap();
    let managed = tower_lease::RedisStore::new(manager)
        .prefix("tlbench")
        .into();
    list.push((
        "tower-lease Lock (Redis, ConnectionManager)",
        lock_cycle(managed),
    ));

    let stores = [
        (
            "tower-lease Lock (Redis)",
            "RwLock read (Redis)",
            "RwLock write (Redis)",
            redis_store(conn.clone()),
        ),
        (
            "tower-lease Lock (memory)",
            "RwLock read (memory)",
            "RwLock write (memory)",
            Store::memory(),
        ),
    ];
    for (lock, read, write, store) in stores {
        list.push((lock, lock_cycle(store.clone())));
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
            redis_store(conn.clone()),
        ),
        (
            "LockLayer request (memory)",
            "bare request + Lock cycle (memory)",
            Store::memory(),
        ),
    ] {
        list.push((layered, layer_request(store.clone())));
        list.push((bare, bare_request(store)));
    }
    list
}

type Body = Empty<Bytes>;

type Noop = ServiceFn<fn(Request<Body>) -> Ready<Result<Response<Body>, Infallible>>>;

/// The inner service of the layer variants: answers at once.
fn noop() -> Noop {
    tower::service_fn(|_req| std::future::ready(Ok(Response::new(Body::new()))))
}

/// The paths of the requests, one name per task, locked on their second segment.
fn paths() -> Arc<Vec<String>> {
    Arc::new((0..CONCURRENCY[1]).map(|t| format!("/jobs/{t}")).collect())
}

fn layer_request(store: Store) -> Op {
    let service = LockLayer::new(store, LOCK, extract::path_segment(1)).layer(noop());
    let paths = paths();
    op(move |task, _| {
        let (service, paths) = (service.clone(), paths.clone());
        async move {
            let req = Request::post(paths[task].as_str())
                .body(Body::new())
                .unwrap();
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
fn bare_request(store: Store) -> Op {
    let service = noop();
    let (paths, names) = (paths(), names(""));
    op(move |task, _| {
        let (store, service, paths, names) = (store.clone(), service, paths.clone(), names.clone());
        async move {
            let token = LOCK
                .try_lock(&store, &names[task])
                .await
                .unwrap()
                .expect("lock held");
            let req = Request::post(paths[task].as_str())
                .body(Body::new())
                .unwrap();
            let res = service.oneshot(req).await.unwrap();
            assert_eq!(res.status(), StatusCode::OK);
            assert!(token.release().await.unwrap());
        }
    })
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

#[derive(Default)]
struct Row {
    /// One entry per round, in round order, as are `p50s`, `client_cpu` and `server_cpu`.
    rates: Vec<f64>,
    p50s: Vec<f64>,
    latencies: Vec<u64>,
    client_cpu: Vec<f64>,
    server_cpu: Vec<f64>,
    allocations: Vec<f64>,
}

/// Runs `op` and answers the CPU time this process and the redis-server used per operation,
/// in µs (NaN when the server is not ours): steadier than throughput on a busy machine.
async fn measured(
    redis: &Redis,
    op: &Op,
    tasks: usize,
    length: Duration,
) -> (support::Run, f64, f64, f64) {
    let (client, server) = (
        support::cpu_time(),
        redis.pid().and_then(support::cpu_time_of),
    );
    let allocations = ALLOCATIONS.load(Ordering::Relaxed);
    let run = support::run(op, tasks, length).await;
    let allocations = (ALLOCATIONS.load(Ordering::Relaxed) - allocations) as f64 / run.ops as f64;
    let per_op = |d: Duration| d.as_secs_f64() * 1e6 / run.ops as f64;
    let client = per_op(support::cpu_time() - client);
    let server = match (redis.pid().and_then(support::cpu_time_of), server) {
        (Some(after), Some(before)) => per_op(after - before),
        _ => f64::NAN,
    };
    (run, client, server, allocations)
}

async fn bench(redis: &Redis, settings: Settings) {
    let variants = variants(redis).await;
    // BENCH_ONLY=a,b runs only the variants whose names hold one of these, for profiling.
    let variants: Vec<_> = match std::env::var("BENCH_ONLY") {
        Ok(only) => variants
            .into_iter()
            .filter(|(name, _)| only.split(',').any(|part| name.contains(part)))
            .collect(),
        Err(_) => variants,
    };
    // Warm up: connections, loaded scripts, allocator pools.
    for (_, op) in &variants {
        support::run(op, 8, Duration::from_millis(100)).await;
    }
    let mut results: HashMap<(usize, usize), Row> = HashMap::new();
    for tasks in CONCURRENCY {
        for round in 0..settings.rounds {
            for k in 0..variants.len() {
                // Rotate the order from round to round.
                let v = (k + round) % variants.len();
                let (mut run, client, server, allocations) =
                    measured(redis, &variants[v].1, tasks, settings.round).await;
                let row = results.entry((tasks, v)).or_default();
                row.rates.push(run.per_second());
                row.p50s.push(quantile_us(&mut run.latencies, 0.5));
                row.latencies.extend(run.latencies);
                row.client_cpu.push(client);
                row.server_cpu.push(server);
                row.allocations.push(allocations);
            }
        }
    }
    assert_no_keys_left(redis).await;

    println!(
        "\nlock/release cycles, {} rounds of {:?} per variant, TTL {:?}",
        settings.rounds, settings.round, TTL
    );
    println!("machine: {}", support::machine());
    println!(
        "cycles/s and CPU per cycle: medians of the rounds; ratios: medians of the ratios within \
         each round; p50/p99: latency of all cycles at 1 task\n"
    );
    println!(
        "| tasks | variant | cycles/s | × minimum | × rslock | p50 µs | p99 µs | client CPU µs | server CPU µs | allocations |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let index = |name: &str| variants.iter().position(|(n, _)| *n == name);
    // The median over rounds of `of(a) / of(b)` in the same round; NaN when one of them was
    // left out by BENCH_ONLY.
    let paired = |tasks: usize, a: &str, b: &str, of: fn(&Row) -> &[f64]| {
        let (Some(a), Some(b)) = (index(a), index(b)) else {
            return f64::NAN;
        };
        let (a, b) = (of(&results[&(tasks, a)]), of(&results[&(tasks, b)]));
        let mut ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b).collect();
        median(&mut ratios)
    };
    for tasks in CONCURRENCY {
        for (v, (name, _)) in variants.iter().enumerate() {
            let row = &results[&(tasks, v)];
            let rate = median(&mut row.rates.clone());
            let client = median(&mut row.client_cpu.clone());
            let server = median(&mut row.server_cpu.clone());
            let allocations = match median(&mut row.allocations.clone()) {
                n if COUNTING.load(Ordering::Relaxed) => format!("{n:.1}"),
                _ => "".into(),
            };
            let (p50, p99) = if tasks == 1 {
                let mut latencies = row.latencies.clone();
                (
                    format!("{:.1}", quantile_us(&mut latencies, 0.5)),
                    format!("{:.1}", quantile_us(&mut latencies, 0.99)),
                )
            } else {
                ("".into(), "".into())
            };
            println!(
                "| {tasks} | {name} | {rate:.0} | {:.2} | {:.2} | {p50} | {p99} | {client:.1} | {server:.1} | {allocations} |",
                paired(tasks, name, MINIMUM, rates),
                paired(tasks, name, RSLOCK, rates),
            );
        }
    }

    println!("\ntargets:");
    let lock = "tower-lease Lock (Redis)";
    let vs_min = paired(64, lock, MINIMUM, rates);
    let vs_rslock = paired(64, lock, RSLOCK, rates);
    let latency = paired(1, lock, MINIMUM, p50s);
    target(
        "Lock cycle at 64 tasks ≥ 0.97× the minimum",
        vs_min,
        vs_min >= 0.97,
    );
    target(
        "Lock cycle at 64 tasks ≥ 1.3× rslock",
        vs_rslock,
        vs_rslock >= 1.3,
    );
    target(
        "Lock p50 latency at 1 task ≤ 1.05× the minimum's",
        latency,
        latency <= 1.05,
    );
    for tasks in CONCURRENCY {
        let ratio = |store: &str| {
            let bare = format!("bare request + Lock cycle ({store})");
            paired(tasks, &format!("LockLayer request ({store})"), &bare, rates)
        };
        let (redis, memory) = (ratio("Redis"), ratio("memory"));
        let what = format!("LockLayer request ≥ 0.95× a bare Lock cycle, {tasks} tasks");
        target(&what, redis, redis >= 0.95);
        if !memory.is_nan() {
            // Not a target: without the network this shows the layer's own cost.
            println!("  (on Store::memory(): {memory:.3})");
        }
    }
}

fn rates(row: &Row) -> &[f64] {
    &row.rates
}

fn p50s(row: &Row) -> &[f64] {
    &row.p50s
}

fn target(what: &str, ratio: f64, met: bool) {
    if ratio.is_nan() {
        return;
    }
    println!(
        "- {what}: {ratio:.3} {}",
        if met { "met" } else { "MISSED" }
    );
}

/// Every cycle released what it took: nothing of the benchmark may be left in Redis.
async fn assert_no_keys_left(redis: &Redis) {
    let mut conn = redis.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("tlbench*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.is_empty(), "the benchmark left keys behind: {keys:?}");
}

static ACQUIRE: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../src/store/scripts/acquire.lua")));

/// Where the cost of a cycle goes: the minimum with one change each.
fn diagnostics(list: &mut Vec<(&'static str, Op)>, conn: &redis::aio::MultiplexedConnection) {
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
                    redis::cmd("SET")
                        .arg(key)
                        .arg(&token[..])
                        .arg("NX")
                        .arg("PX")
                        .arg(TTL.as_millis() as u64)
                        .query_async(&mut conn),
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
                    .cmd("SET")
                    .arg(key)
                    .arg(&token[..])
                    .arg("NX")
                    .arg("PX")
                    .arg(TTL.as_millis() as u64)
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
