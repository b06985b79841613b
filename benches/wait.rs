//! Bounded waits against a local `redis-server`: how soon the next waiter holds the lock after a
//! release (p50, p99), woken by a release in its own process or finding one elsewhere by
//! polling; how many Redis commands a waited acquisition costs; and 1000 waiters on one name.
//! With feature `cluster`, on a local 3-master cluster: the cluster bus messages per release
//! (`CLUSTER INFO`'s `cluster_stats_messages_*`, summed over the nodes) and the hand-off, with
//! the scripts' `PUBLISH` and a subscriber on one node, and with `SPUBLISH` and `SSUBSCRIBE`
//! (what `connect_cluster` sets up on Redis 7.0), in alternating rounds.
//!
//! ```text
//! cargo bench --all-features --bench wait
//! ```
//!
//! `HANDOFFS` (default 200) sets how many hand-offs each latency row measures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Barrier;
use tower_lease::{Lock, RedisStore, Store};

use tower_lease_harness::Endpoint;
use tower_lease_harness::bench;

const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(10));
const WAIT: Duration = Duration::from_secs(5);

/// `count` hand-offs: a holder releases after a pause, a waiter (already waiting through
/// `waiter_store`) acquires; answers the nanoseconds from each release to the acquisition.
async fn handoffs(holder_store: &Store, waiter_store: &Store, count: usize) -> Vec<u64> {
    let mut latencies = Vec::with_capacity(count);
    for i in 0..count {
        let name = format!("h{i}");
        let holder = JOBS.try_lock(holder_store, &name).await.unwrap().unwrap();
        let waiter = {
            let (store, name) = (waiter_store.clone(), name.clone());
            tokio::spawn(async move {
                let token = JOBS.try_lock_for(&store, &name, WAIT).await.unwrap();
                let acquired = Instant::now();
                token.unwrap().release().await.unwrap();
                acquired
            })
        };
        // Long enough for the waiter's polls to have backed off to their longest.
        tokio::time::sleep(Duration::from_millis(150)).await;
        let released = Instant::now();
        holder.release().await.unwrap();
        let acquired = waiter.await.unwrap();
        latencies.push(acquired.duration_since(released).as_nanos() as u64);
    }
    latencies
}

/// Commands Redis has run so far, from `INFO commandstats`, without the `INFO`s themselves.
async fn commands(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    bench::command_calls(conn, |command| command != "info").await
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let redis = bench::Redis::start();
    let count: usize = std::env::var("HANDOFFS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let store: Store = RedisStore::new(redis.connection().await).into();
    // Another store handle has waiters of its own: a release through it is "elsewhere".
    let elsewhere: Store = RedisStore::new(redis.connection().await).into();
    // A store with release notifications, as `RedisStore::connect` makes it.
    let notified: Store = RedisStore::connect(&redis.url()).await.unwrap().into();
    let mut raw = redis.connection().await;

    println!("bounded waits on redis-server, {}", bench::machine());
    for (label, holder, waiter) in [
        ("woken by a release here", &store, &store),
        ("notified (release elsewhere)", &elsewhere, &notified),
        ("polling (release elsewhere)", &elsewhere, &store),
    ] {
        let mut latencies = handoffs(holder, waiter, count).await;
        println!(
            "  hand-off, {label:<28} p50 {:>8.0} µs  p99 {:>8.0} µs  ({count} hand-offs)",
            bench::quantile_us(&mut latencies, 0.5),
            bench::quantile_us(&mut latencies, 0.99),
        );
    }

    // Commands per waited acquisition: the waiter's attempts, the holder's and the waiter's
    // releases, counted over many hand-offs and divided.
    for (label, waiter) in [("notified", &notified), ("polling", &store)] {
        let before = commands(&mut raw).await;
        handoffs(&elsewhere, waiter, count).await;
        let per_handoff = (commands(&mut raw).await - before) as f64 / count as f64;
        println!(
            "  Redis commands per hand-off, {label:<8} (holder's SET and release; waiter's attempts and release): {per_handoff:.1}"
        );
    }

    // 1000 waiters on one name in this process, each holding for a moment: no herd.
    let waiters = 1000;
    let holder = JOBS.try_lock(&store, "herd").await.unwrap().unwrap();
    let ready = Arc::new(Barrier::new(waiters + 1));
    let mut tasks = Vec::new();
    for _ in 0..waiters {
        let (store, ready) = (store.clone(), ready.clone());
        tasks.push(tokio::spawn(async move {
            ready.wait().await;
            let token = JOBS
                .try_lock_for(&store, "herd", Duration::from_secs(60))
                .await
                .unwrap();
            token.expect("served").release().await.unwrap();
        }));
    }
    ready.wait().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = commands(&mut raw).await;
    let started = Instant::now();
    holder.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    let took = started.elapsed();
    let per_waiter = (commands(&mut raw).await - before) as f64 / waiters as f64;
    println!(
        "  {waiters} waiters on one name: all served in {:.0} ms, {per_waiter:.2} Redis commands per waiter",
        took.as_secs_f64() * 1e3
    );
    drop(redis);
    #[cfg(feature = "cluster")]
    cluster(count).await;
}

/// The cluster rows: bus messages per release and hand-offs, plain against sharded.
#[cfg(feature = "cluster")]
async fn cluster(count: usize) {
    const ROUNDS: usize = 3;
    const RELEASES: usize = 300;
    let cluster = tower_lease_harness::cluster::RedisCluster::start_with(&[]);
    let client = redis::cluster::ClusterClient::new(cluster.urls()).unwrap();
    // The subscriber on the first node and the scripts' `PUBLISH`, as before `SPUBLISH`.
    let plain = || async {
        let subscriber = redis::Client::open(cluster.urls()[0].as_str()).unwrap();
        let store = RedisStore::new(client.get_async_connection().await.unwrap());
        Store::from(store.notifications(subscriber))
    };
    let sharded =
        || async { Store::from(RedisStore::connect_cluster(cluster.urls()).await.unwrap()) };
    let variants = [
        (
            "PUBLISH, SUBSCRIBE on one node",
            plain().await,
            plain().await,
        ),
        ("SPUBLISH, SSUBSCRIBE", sharded().await, sharded().await),
    ];
    let fields = ["received", "publish_received", "publishshard_received"];
    let mut messages = vec![[0u64; 3]; variants.len()];
    let mut latencies = vec![Vec::new(); variants.len()];
    // A quarter of the single server's hand-offs per variant, to keep the run short.
    let per_round = (count / 4 / ROUNDS).max(1);
    for _ in 0..ROUNDS {
        for (i, (_, holder, waiter)) in variants.iter().enumerate() {
            let before = fields.map(|field| cluster.bus_messages(field));
            // Whether or not anyone listens: a `PUBLISH` crosses the bus to every node anyway.
            for n in 0..RELEASES {
                let token = JOBS.try_lock(holder, &format!("b{n}")).await.unwrap();
                token.unwrap().release().await.unwrap();
            }
            // The last messages reach the other nodes a moment after the last release.
            tokio::time::sleep(Duration::from_millis(200)).await;
            let after = fields.map(|field| cluster.bus_messages(field));
            for (sum, (after, before)) in messages[i].iter_mut().zip(after.iter().zip(before)) {
                *sum += after - before;
            }
            latencies[i].extend(handoffs(holder, waiter, per_round).await);
        }
    }
    println!(
        "bounded waits on a local 3-master cluster (no replicas), {ROUNDS} alternating rounds"
    );
    let releases = (ROUNDS * RELEASES) as f64;
    for (i, (label, _, _)) in variants.iter().enumerate() {
        let [all, publish, shard] = messages[i].map(|m| m as f64 / releases);
        println!(
            "  {label:<32} bus messages received per release: {all:.2} (publish {publish:.2}, \
             publishshard {shard:.2}, the rest gossip); hand-off p50 {:>6.0} µs p99 {:>6.0} µs",
            bench::quantile_us(&mut latencies[i], 0.5),
            bench::quantile_us(&mut latencies[i], 0.99),
        );
    }
}
