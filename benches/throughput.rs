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

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Ready;
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

const MINIMUM: &str = "hand-written SET NX PX + EVALSHA";
const RSLOCK: &str = "rslock";

fn main() {
    let settings = Settings::from_env(5, 400);
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
        let (store, service, paths, names) =
            (store.clone(), service.clone(), paths.clone(), names.clone());
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

struct Row {
    rates: Vec<f64>,
    latencies: Vec<u64>,
}

async fn bench(redis: &Redis, settings: Settings) {
    let variants = variants(redis).await;
    // BENCH_ONLY=<substring> runs only the matching variants, for profiling one of them.
    if let Ok(only) = std::env::var("BENCH_ONLY") {
        for (name, op) in variants.iter().filter(|(name, _)| name.contains(&only)) {
            for tasks in CONCURRENCY {
                let (cpu, server) = (
                    support::cpu_time(),
                    redis.pid().and_then(support::cpu_time_of),
                );
                let run = support::run(op, tasks, settings.round * settings.rounds as u32).await;
                let cpu = (support::cpu_time() - cpu).as_secs_f64() * 1e6 / run.ops as f64;
                let server = redis
                    .pid()
                    .and_then(support::cpu_time_of)
                    .zip(server)
                    .map(|(b, a)| (b - a).as_secs_f64() * 1e6 / run.ops as f64);
                println!(
                    "{name} at {tasks} tasks: {:.0}/s, client CPU {cpu:.2} µs/cycle, server CPU {server:.2?} µs/cycle",
                    run.per_second()
                );
            }
        }
        return;
    }
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
                let run = support::run(&variants[v].1, tasks, settings.round).await;
                let row = results.entry((tasks, v)).or_insert_with(|| Row {
                    rates: Vec::new(),
                    latencies: Vec::new(),
                });
                row.rates.push(run.per_second());
                row.latencies.extend(run.latencies);
            }
        }
    }
    assert_no_keys_left(redis).await;

    println!(
        "\nlock/release cycles, {} rounds of {:?} per variant, TTL {:?}",
        settings.rounds, settings.round, TTL
    );
    println!("machine: {}\n", support::machine());
    println!("| tasks | variant | cycles/s (median) | × minimum | × rslock | p50 µs | p99 µs |");
    println!("|---:|---|---:|---:|---:|---:|---:|");
    let mut medians = HashMap::new();
    let mut p50s = HashMap::new();
    for tasks in CONCURRENCY {
        for (v, (name, _)) in variants.iter().enumerate() {
            let row = results.get_mut(&(tasks, v)).unwrap();
            medians.insert((tasks, name.to_string()), median(&mut row.rates));
            p50s.insert(
                (tasks, name.to_string()),
                quantile_us(&mut row.latencies, 0.5),
            );
        }
        for (v, (name, _)) in variants.iter().enumerate() {
            let rate = medians[&(tasks, name.to_string())];
            let row = results.get_mut(&(tasks, v)).unwrap();
            let (p50, p99) = if tasks == 1 {
                (
                    format!("{:.1}", quantile_us(&mut row.latencies, 0.5)),
                    format!("{:.1}", quantile_us(&mut row.latencies, 0.99)),
                )
            } else {
                ("".into(), "".into())
            };
            println!(
                "| {tasks} | {name} | {rate:.0} | {:.2} | {:.2} | {p50} | {p99} |",
                rate / medians[&(tasks, MINIMUM.to_string())],
                rate / medians[&(tasks, RSLOCK.to_string())],
            );
        }
    }

    println!("\ntargets:");
    let get = |map: &HashMap<(usize, String), f64>, tasks: usize, name: &str| {
        map[&(tasks, name.to_owned())]
    };
    let lock = "tower-lease Lock (Redis)";
    let vs_min = get(&medians, 64, lock) / get(&medians, 64, MINIMUM);
    let vs_rslock = get(&medians, 64, lock) / get(&medians, 64, RSLOCK);
    let latency = get(&p50s, 1, lock) / get(&p50s, 1, MINIMUM);
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
        for store in ["Redis", "memory"] {
            let layered = get(&medians, tasks, &format!("LockLayer request ({store})"));
            let bare = get(
                &medians,
                tasks,
                &format!("bare request + Lock cycle ({store})"),
            );
            let what =
                format!("LockLayer request ≥ 0.95× a bare Lock cycle, {store}, {tasks} tasks");
            target(&what, layered / bare, layered / bare >= 0.95);
        }
    }
}

fn target(what: &str, ratio: f64, met: bool) {
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
