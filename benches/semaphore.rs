//! `Semaphore` on one `redis-server`: permit acquire+release cycles at 64 tasks beside the
//! hand-written `Lock` minimum and the `Lock` cycle, and the layer's heartbeat with 10,000 held
//! permits.
//!
//! ```text
//! cargo bench --all-features --bench semaphore
//! BENCH_ROUNDS=15 BENCH_ROUND_MS=1000 SEMAPHORE_HELD=10000 SEMAPHORE_SECS=10 cargo bench ...
//! ```
//!
//! Every variant runs once per round, in an order that rotates from round to round; the table
//! shows medians over the rounds, and each ratio is taken within a round. Every cycle checks
//! that it acquired and released.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use tokio_util::sync::CancellationToken;
use tower::{Layer, ServiceExt};
use tower_lease::layer::TimeoutBody;
use tower_lease::{Lease, Lock, RedisStore, Semaphore, SemaphoreLayer, Store, extract};

use tower_lease_harness::Endpoint;
use tower_lease_harness::bench::{self, Op, Redis, Settings, median, op};

const TTL: Duration = Duration::from_secs(10);
const LOCK: Lock<str> = Lock::new("bench", TTL);
/// As many permits as tasks: on one hot name every cycle is still acquired.
const HOT: Semaphore<str> = Semaphore::new("bench-hot", 64, TTL);
const ONE: Semaphore<str> = Semaphore::new("bench-one", 1, TTL);
const TASKS: usize = 64;

static COMPARE_AND_DELETE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
});

const MINIMUM: &str = "hand-written SET NX PX + EVALSHA (Lock minimum)";

async fn variants(redis: &Redis) -> Vec<(&'static str, Op)> {
    let conn = redis.connection().await;
    let store: Store = RedisStore::new(conn.clone()).prefix("tlbench").into();
    let names: Arc<Vec<String>> = Arc::new((0..TASKS).map(|t| format!("name-{t}")).collect());
    let hand = {
        let (conn, names) = (conn.clone(), names.clone());
        op(move |task, i| {
            let (mut conn, key) = (conn.clone(), format!("tlbench:hand:{}", names[task]));
            async move {
                let token = i.to_le_bytes();
                let set: Option<String> = bench::set_nx_px(&key, &token, TTL)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert!(set.is_some(), "the minimum was refused");
                let deleted: i64 = COMPARE_AND_DELETE
                    .key(&key)
                    .arg(&token[..])
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(deleted, 1);
            }
        })
    };
    let lock = {
        let (store, names) = (store.clone(), names.clone());
        op(move |task, _| {
            let (store, names) = (store.clone(), names.clone());
            async move {
                let token = LOCK.try_lock(&store, &names[task]).await.unwrap();
                assert!(
                    token
                        .expect("a Lock cycle was refused")
                        .release()
                        .await
                        .unwrap()
                );
            }
        })
    };
    // A permit cycle of `semaphore` on the name `name_of` picks for a task.
    let permit_cycle = |semaphore: Semaphore<str>, name_of: fn(&[String], usize) -> &str| {
        let (store, names) = (store.clone(), names.clone());
        op(move |task, _| {
            let (store, names) = (store.clone(), names.clone());
            async move {
                let name = name_of(&names, task);
                let permit = semaphore.try_acquire(&store, name).await.unwrap();
                let permit = permit.expect("a permit was refused");
                assert!(permit.release().await.unwrap());
            }
        })
    };
    let permit_each = permit_cycle(ONE, |names, task| &names[task]);
    let permit_hot = permit_cycle(HOT, |_, _| "hot");
    vec![
        (MINIMUM, hand),
        ("Lock try_lock + release", lock),
        ("Semaphore permit cycle, a name per task", permit_each),
        ("Semaphore permit cycle, one name, 64 permits", permit_hot),
    ]
}

async fn cycles(redis: &Redis, settings: Settings) {
    let variants = variants(redis).await;
    let mut rates = vec![Vec::new(); variants.len()];
    let mut ratios = vec![Vec::new(); variants.len()];
    // Warm up the connection and the script cache.
    for (_, op) in &variants {
        bench::run(op, TASKS, Duration::from_millis(50)).await;
    }
    for round in 0..settings.rounds {
        let mut this_round = vec![0.0; variants.len()];
        for k in 0..variants.len() {
            let v = (round + k) % variants.len();
            let run = bench::run(&variants[v].1, TASKS, settings.round).await;
            this_round[v] = run.per_second();
        }
        for (v, rate) in this_round.iter().enumerate() {
            rates[v].push(*rate);
            ratios[v].push(rate / this_round[0]);
        }
    }
    println!(
        "\ncycles per second at {TASKS} tasks, one multiplexed connection, median of {} rounds of {:?}",
        settings.rounds, settings.round
    );
    println!("machine: {}\n", bench::machine());
    println!("| variant | cycles/s | × minimum |");
    println!("|---|---:|---:|");
    for (v, (name, _)) in variants.iter().enumerate() {
        println!(
            "| {name} | {:.0} | {:.2} |",
            median(&mut rates[v]),
            median(&mut ratios[v])
        );
    }
}

/// `INFO commandstats` calls of `EVALSHA`: the heartbeat's extends.
async fn evalsha_calls(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    bench::command_calls(conn, |command| command == "evalsha").await
}

/// `held` requests hold a permit each through `SemaphoreLayer` (100 names of `held / 100`
/// permits, TTL 3 s, extended every second) for `hold`.
async fn heartbeat(redis: &Redis, held: usize, hold: Duration) {
    const PERMITS: Semaphore<str> = Semaphore::new("held", 1, Duration::from_secs(3));
    let names = 100;
    let per_name = held.div_ceil(names) as u32;
    let store: Store = RedisStore::new(redis.connection().await)
        .prefix("bench-permits")
        .into();
    let (inside, kept) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let done = CancellationToken::new();
    let handler = {
        let (inside, kept, done) = (inside.clone(), kept.clone(), done.clone());
        tower::service_fn(move |req: Request<TimeoutBody<Empty<Bytes>>>| {
            let (inside, kept, done) = (inside.clone(), kept.clone(), done.clone());
            async move {
                let lease = req.extensions().get::<Lease>().cloned().expect("a Lease");
                inside.fetch_add(1, Ordering::SeqCst);
                done.cancelled().await;
                kept.fetch_add(usize::from(lease.is_held()), Ordering::SeqCst);
                Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
            }
        })
    };
    let semaphore = PERMITS.with_permits(per_name).unwrap();
    let service = SemaphoreLayer::new(store, semaphore, extract::path_segment(1)).layer(handler);
    let started = Instant::now();
    let requests: Vec<_> = (0..held)
        .map(|i| {
            let req = Request::post(format!("/p/name-{}", i % names))
                .body(Empty::new())
                .unwrap();
            tokio::spawn(service.clone().oneshot(req))
        })
        .collect();
    while inside.load(Ordering::SeqCst) < held {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not all permits were taken"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let acquired_in = started.elapsed();
    let mut conn = redis.connection().await;
    let extends = evalsha_calls(&mut conn).await;
    let pid = redis.pid();
    let (cpu, server_cpu) = (bench::cpu_time(), pid.and_then(bench::cpu_time_of));
    let window = Instant::now();
    tokio::time::sleep(hold).await;
    let window = window.elapsed();
    let cpu = bench::cpu_time() - cpu;
    let server_cpu = pid
        .and_then(bench::cpu_time_of)
        .zip(server_cpu)
        .map(|(a, b)| a - b);
    let extends = evalsha_calls(&mut conn).await - extends;
    done.cancel();
    let mut ok = 0;
    for request in requests {
        ok += usize::from(request.await.unwrap().unwrap().status() == StatusCode::OK);
    }
    let lost = held - kept.load(Ordering::SeqCst).min(ok);
    let share = |cpu: Duration| cpu.as_secs_f64() / window.as_secs_f64() * 100.0;
    println!(
        "\n{held} permits held through SemaphoreLayer ({names} names × {per_name} permits), TTL 3 s, for {hold:?}\n"
    );
    println!("| measure | value |\n|---|---:|");
    println!("| all acquired in | {acquired_in:.2?} |");
    println!(
        "| extends per second | {:.0} |",
        extends as f64 / window.as_secs_f64()
    );
    println!(
        "| this process's CPU, share of one core | {:.2} % |",
        share(cpu)
    );
    match server_cpu {
        Some(cpu) => println!(
            "| redis-server CPU, share of one core | {:.2} % |",
            share(cpu)
        ),
        None => println!("| redis-server CPU, share of one core | n/a |"),
    }
    println!("| permits lost | {lost} |");
    let left: Vec<String> = redis::cmd("KEYS")
        .arg("bench-permits*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        left.is_empty(),
        "{} permit sets were left behind",
        left.len()
    );
}

fn main() {
    let settings = Settings::from_env(9, 300);
    let var = |name: &str, default: u64| {
        std::env::var(name).map_or(default, |v| v.parse().expect("a whole number"))
    };
    let held = var("SEMAPHORE_HELD", 10_000) as usize;
    let hold = Duration::from_secs(var("SEMAPHORE_SECS", 10));
    let redis = Redis::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        cycles(&redis, settings).await;
        heartbeat(&redis, held, hold).await;
    });
}
