//! `RedisStore::wait_for_replicas` on a local primary and one replica: lock/release cycles from
//! 64 tasks with and without `WAIT` on one multiplexed connection, as a ratio, and what the
//! `WAIT`s do to other calls (a `PING` every millisecond) on the same connection and on one of
//! their own.
//!
//! ```text
//! cargo bench --all-features --bench replicated
//! ```
//!
//! `BENCH_ROUNDS`, `BENCH_ROUND_MS` (default 9 × 400 ms) set the rounds.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tower_lease::{Lock, RedisStore, Store};

const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(10));
const TASKS: usize = 64;

/// A variant: whether the store waits for the replica, and whether the probe shares its
/// connection.
struct Variant {
    label: &'static str,
    wait: bool,
    probe_shares: bool,
}

const VARIANTS: [Variant; 3] = [
    Variant {
        label: "no WAIT",
        wait: false,
        probe_shares: true,
    },
    Variant {
        label: "WAIT 1, probe on the same connection",
        wait: true,
        probe_shares: true,
    },
    Variant {
        label: "WAIT 1, probe on its own connection",
        wait: true,
        probe_shares: false,
    },
];

/// `PING`s on `conn`, one a millisecond until `stop`; answers their latencies in nanoseconds.
async fn probe(mut conn: MultiplexedConnection, stop: Arc<AtomicBool>) -> Vec<u64> {
    let mut latencies = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let began = Instant::now();
        let () = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map(|_: String| ())
            .expect("PING");
        latencies.push(began.elapsed().as_nanos() as u64);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    latencies
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let settings = support::Settings::from_env(9, 400);
    let primary = support::Redis::start_with(&["--repl-diskless-sync-delay", "0"]);
    let replica =
        support::Redis::start_with(&["--replicaof", "127.0.0.1", &primary.port().to_string()]);
    let mut raw = replica.connection().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut raw)
            .await
            .unwrap();
        if info.contains("master_link_status:up") {
            break;
        }
        assert!(Instant::now() < deadline, "the replica never synced");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let mut cycles: Vec<Vec<f64>> = VARIANTS.iter().map(|_| Vec::new()).collect();
    let mut ratios: Vec<Vec<f64>> = VARIANTS.iter().map(|_| Vec::new()).collect();
    let mut pings: Vec<Vec<u64>> = VARIANTS.iter().map(|_| Vec::new()).collect();
    for round in 0..settings.rounds {
        let mut this_round = [0.0; VARIANTS.len()];
        for k in 0..VARIANTS.len() {
            let i = (round + k) % VARIANTS.len();
            let variant = &VARIANTS[i];
            let conn = primary.connection().await;
            let own = primary.connection().await;
            let mut store = RedisStore::new(conn.clone());
            if variant.wait {
                store = store.wait_for_replicas(1, Duration::from_millis(100));
            }
            let store: Store = store.into();
            let op = support::op(move |task, _| {
                let store = store.clone();
                async move {
                    let name = format!("t{task}");
                    let token = JOBS.try_lock(&store, &name).await.unwrap().expect("free");
                    assert!(token.release().await.unwrap());
                }
            });
            let stop = Arc::new(AtomicBool::new(false));
            let probing = tokio::spawn(probe(
                if variant.probe_shares { conn } else { own },
                stop.clone(),
            ));
            let run = support::run(&op, TASKS, settings.round).await;
            stop.store(true, Ordering::Relaxed);
            pings[i].extend(probing.await.unwrap());
            this_round[i] = run.per_second();
            cycles[i].push(run.per_second());
        }
        for i in 0..VARIANTS.len() {
            ratios[i].push(this_round[i] / this_round[0]);
        }
    }
    let mut left = primary.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("tower-lease:*")
        .query_async(&mut left)
        .await
        .unwrap();
    assert!(keys.is_empty(), "the benchmark left keys behind: {keys:?}");

    println!(
        "WAIT on a primary with one replica, {TASKS} tasks, {}",
        support::machine()
    );
    println!();
    println!("| variant | cycles/s | ratio to no WAIT | PING p50 | PING p99 |");
    println!("|---|---:|---:|---:|---:|");
    for (i, variant) in VARIANTS.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.2} | {:.0} µs | {:.0} µs |",
            variant.label,
            support::median(&mut cycles[i]),
            support::median(&mut ratios[i]),
            support::quantile_us(&mut pings[i], 0.5),
            support::quantile_us(&mut pings[i], 0.99),
        );
    }
}
