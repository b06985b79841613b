//! `RedisStore::wait_for_replicas` on a local primary and one replica: lock/release cycles from
//! 64 tasks with and without `WAIT` on one multiplexed connection, as a ratio, and what the
//! `WAIT`s do to other calls (a `PING` every millisecond) on the same connection and on one of
//! their own.
//!
//! Then, with feature `sentinel`, on a primary, two replicas and three sentinels
//! (`down-after-milliseconds` 1 s) started by the test harness: the longest stretch without
//! a successful acquisition across a `SENTINEL FAILOVER` and a `kill -9` of the primary, two
//! `connect_sentinel` stores with `wait_for_replicas(1, 300 ms)` writing steadily (median of
//! `BENCH_FAILOVERS` runs, default 3); and the time per lock/release cycle of a
//! `connect_sentinel` store with `wait_for_replicas(1, 300 ms)` against one without, paired
//! round by round (one task, then 64).
//!
//! ```text
//! cargo bench --all-features --bench replicated
//! ```
//!
//! `BENCH_ROUNDS`, `BENCH_ROUND_MS` (default 9 × 400 ms) set the rounds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tower_lease::{Lock, RedisStore, Store};

use tower_lease_harness::Endpoint;
use tower_lease_harness::bench;

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
    let settings = bench::Settings::from_env(9, 400);
    let primary = bench::Redis::start_with(&["--repl-diskless-sync-delay", "0"]);
    let replica =
        bench::Redis::start_with(&["--replicaof", "127.0.0.1", &primary.port().to_string()]);
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
            let op = bench::op(move |task, _| {
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
            let run = bench::run(&op, TASKS, settings.round).await;
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
        bench::machine()
    );
    println!();
    println!("| variant | cycles/s | ratio to no WAIT | PING p50 | PING p99 |");
    println!("|---|---:|---:|---:|---:|");
    for (i, variant) in VARIANTS.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.2} | {:.0} µs | {:.0} µs |",
            variant.label,
            bench::median(&mut cycles[i]),
            bench::median(&mut ratios[i]),
            bench::quantile_us(&mut pings[i], 0.5),
            bench::quantile_us(&mut pings[i], 0.99),
        );
    }
    #[cfg(feature = "sentinel")]
    sentinel::run(&settings).await;
}

/// Failover write gaps and the cost of `WAIT` on a Sentinel store.
#[cfg(feature = "sentinel")]
mod sentinel {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    use tower_lease::store::SentinelConnection;
    use tower_lease::{Lock, RedisStore, Store};

    use tower_lease_harness::bench;
    use tower_lease_harness::sentinel::{MASTER, Topology};

    const DOWN_AFTER: Duration = Duration::from_secs(1);
    const GAP_LOCK: Lock<str> = Lock::new("gap", Duration::from_secs(2));

    async fn store(topology: &Topology, wait: bool) -> Store {
        let deadline = Instant::now() + Duration::from_secs(5);
        let store: RedisStore<SentinelConnection> = loop {
            match RedisStore::connect_sentinel(MASTER, topology.sentinel_urls()).await {
                Ok(store) => break store,
                Err(e) => assert!(Instant::now() < deadline, "no primary: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        match wait {
            true => store
                .wait_for_replicas(1, Duration::from_millis(300))
                .into(),
            false => store.into(),
        }
    }

    /// The longest stretch without a successful acquisition from the failover `fail` starts
    /// on, under two stores writing steadily (two tasks each, 20 ms holds).
    async fn gap(kill: bool) -> Duration {
        let mut topology = Topology::two_replicas(DOWN_AFTER).await;
        let stores = [store(&topology, true).await, store(&topology, true).await];
        let successes = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::new();
        for (i, store) in stores.iter().flat_map(|s| [s, s]).enumerate() {
            let (store, successes, stop) = (store.clone(), successes.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let name = format!("w{i}");
                while !stop.load(Ordering::Relaxed) {
                    match GAP_LOCK.try_lock(&store, &name).await {
                        Ok(Some(token)) => {
                            successes.lock().unwrap().push(Instant::now());
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            let _ = token.release().await;
                        }
                        _ => tokio::time::sleep(Duration::from_millis(20)).await,
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let began = Instant::now();
        if kill {
            topology.primary.stop();
        } else {
            topology.sentinel_failover().await;
        }
        tokio::time::sleep(Duration::from_secs(9)).await;
        let end = Instant::now();
        stop.store(true, Ordering::Relaxed);
        for task in tasks {
            task.await.unwrap();
        }
        let successes = successes.lock().unwrap();
        let mut last = began;
        let mut longest = Duration::ZERO;
        for &at in successes.iter().filter(|&&at| at >= began) {
            longest = longest.max(at - last);
            last = at;
        }
        longest.max(end - last)
    }

    pub(crate) async fn run(settings: &bench::Settings) {
        let runs: usize = std::env::var("BENCH_FAILOVERS")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(3);
        println!();
        println!(
            "Failover on a primary, two replicas and three sentinels (down-after 1 s), two \
             connect_sentinel stores with wait_for_replicas(1, 300 ms), {runs} runs"
        );
        println!();
        println!("| failover | longest write gap, median | min | max |");
        println!("|---|---:|---:|---:|");
        for (label, kill) in [
            ("SENTINEL FAILOVER", false),
            ("kill -9 of the primary", true),
        ] {
            let mut gaps = Vec::new();
            for _ in 0..runs {
                gaps.push(gap(kill).await.as_secs_f64());
            }
            let (min, max) = gaps
                .iter()
                .fold((f64::MAX, 0.0f64), |(lo, hi), &g| (lo.min(g), hi.max(g)));
            println!(
                "| {label} | {:.2} s | {min:.2} s | {max:.2} s |",
                bench::median(&mut gaps)
            );
        }

        // The cost of WAIT: the same topology, a store with and one without, paired per round.
        let topology = Topology::two_replicas(DOWN_AFTER).await;
        let plain = store(&topology, false).await;
        let waiting = store(&topology, true).await;
        const CYCLE: Lock<str> = Lock::new("cycle", Duration::from_secs(10));
        println!();
        println!(
            "| tasks | connect_sentinel, µs/cycle | with wait_for_replicas(1, ..), µs/cycle | ratio |"
        );
        println!("|---:|---:|---:|---:|");
        for tasks in [1, 64] {
            let mut per = [Vec::new(), Vec::new()];
            let mut ratios = Vec::new();
            for round in 0..settings.rounds {
                let mut this_round = [0.0; 2];
                for k in 0..2 {
                    let i = (round + k) % 2;
                    let store = [&plain, &waiting][i].clone();
                    let op = bench::op(move |task, _| {
                        let store = store.clone();
                        async move {
                            let name = format!("t{task}");
                            let token = CYCLE.try_lock(&store, &name).await.unwrap().expect("free");
                            assert!(token.release().await.unwrap());
                        }
                    });
                    let run = bench::run(&op, tasks, settings.round).await;
                    // Time per cycle, as one task sees it.
                    this_round[i] = 1e6 * tasks as f64 / run.per_second();
                    per[i].push(this_round[i]);
                }
                ratios.push(this_round[1] / this_round[0]);
            }
            println!(
                "| {tasks} | {:.0} | {:.0} | {:.2} |",
                bench::median(&mut per[0]),
                bench::median(&mut per[1]),
                bench::median(&mut ratios)
            );
        }
    }
}
