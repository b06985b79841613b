//! Bounded waits against a local `redis-server`: how soon the next waiter holds the lock after a
//! release (p50, p99), woken by a release in its own process or finding one elsewhere by
//! polling; how many Redis commands a waited acquisition costs; and 1000 waiters on one name.
//!
//! ```text
//! cargo bench --all-features --bench wait
//! ```
//!
//! `HANDOFFS` (default 200) sets how many hand-offs each latency row measures.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Barrier;
use tower_lease::{Lock, RedisStore, Store};

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
    support::command_calls(conn, |command| command != "info").await
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let redis = support::Redis::start();
    let count: usize = std::env::var("HANDOFFS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let store: Store = RedisStore::new(redis.connection().await).into();
    // Another store handle has waiters of its own: a release through it is "elsewhere".
    let elsewhere: Store = RedisStore::new(redis.connection().await).into();
    // A store with release notifications, as `RedisStore::connect` makes it.
    let notified: Store = RedisStore::connect(redis.url()).await.unwrap().into();
    let mut raw = redis.connection().await;

    println!("bounded waits on redis-server, {}", support::machine());
    for (label, holder, waiter) in [
        ("woken by a release here", &store, &store),
        ("notified (release elsewhere)", &elsewhere, &notified),
        ("polling (release elsewhere)", &elsewhere, &store),
    ] {
        let mut latencies = handoffs(holder, waiter, count).await;
        println!(
            "  hand-off, {label:<28} p50 {:>8.0} µs  p99 {:>8.0} µs  ({count} hand-offs)",
            support::quantile_us(&mut latencies, 0.5),
            support::quantile_us(&mut latencies, 0.99),
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
}
