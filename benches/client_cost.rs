//! A `Lock` cycle's client cost on the store an application builds (`RedisStore::connect`),
//! beside the same cycle written by hand (`SET NX PX` + `EVALSHA`) on a `ConnectionManager` set
//! up alike: allocations per cycle (a counting allocator) and, under callgrind, instructions.
//! The server runs in its own process, so callgrind counts only the client's instructions.
//!
//! ```text
//! cargo bench --all-features --bench client_cost                # allocations and ns per cycle
//! ITERS=20000 CLIENT_COST=lock REDIS_URL=redis://127.0.0.1:P \
//!     valgrind --tool=callgrind target/release/deps/client_cost-…
//! ```
//!
//! The variants (`CLIENT_COST=a,b` runs only those): `minimum` (by hand) and `lock`
//! (`Lock::try_lock` + `release`). With `ITERS=n` each runs `n` cycles after as many to warm up
//! (at most 2,000): run two `n` under callgrind and divide the difference in instructions by the
//! difference in cycles. Without `REDIS_URL` it starts a `redis-server` of its own.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use tower_lease::{Lock, Store};
use tower_lease_harness::bench::{self, Redis};
use tower_lease_harness::server::Endpoint;

#[path = "support/counting.rs"]
mod counting;

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

const TTL: Duration = Duration::from_secs(10);
const LOCK: Lock<str> = Lock::new("bench", TTL);

/// The compare-and-delete everyone writes next to `SET NX PX` (as in `throughput`).
static COMPARE_AND_DELETE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
});

/// The hand-written cycle, as the `throughput` benchmark's minimum.
async fn minimum(conn: &mut redis::aio::ConnectionManager) {
    let key = "tlcost:hand:n0";
    let token: [u8; 16] = rand::random();
    let set: Option<String> = bench::set_nx_px(key, &token, TTL)
        .query_async(conn)
        .await
        .expect("SET NX PX");
    assert!(set.is_some(), "the hand-written lock was held");
    let deleted: i64 = COMPARE_AND_DELETE
        .key(key)
        .arg(&token[..])
        .invoke_async(conn)
        .await
        .expect("EVALSHA");
    assert_eq!(deleted, 1, "the hand-written release found no lease");
}

async fn lock(store: &Store) {
    let token = LOCK.try_lock(store, "n0").await.unwrap();
    assert!(token.expect("lock held").release().await.unwrap());
}

fn main() {
    let redis = Redis::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(bench(&redis));
}

async fn bench(redis: &Redis) {
    // As `RedisStore::connect` sets up its own.
    let mut manager = redis.managed_connection().await;
    let store: Store = tower_lease::RedisStore::connect(&redis.url())
        .await
        .expect("RedisStore::connect")
        .prefix("tlcost")
        .into();
    let only = std::env::var("CLIENT_COST").ok();
    let runs = std::env::var("ITERS")
        .ok()
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(20_000);
    let wanted = |name: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|o| o == name))
    };
    println!("| variant | allocations per cycle | µs per cycle |");
    println!("|---|---:|---:|");
    if wanted("minimum") {
        for _ in 0..runs.min(2_000) {
            minimum(&mut manager).await;
        }
        let (allocations, started) = (counting::allocations(), Instant::now());
        for _ in 0..runs {
            minimum(&mut manager).await;
        }
        report("minimum", allocations, started, runs);
    }
    if wanted("lock") {
        for _ in 0..runs.min(2_000) {
            lock(&store).await;
        }
        let (allocations, started) = (counting::allocations(), Instant::now());
        for _ in 0..runs {
            lock(&store).await;
        }
        report("lock", allocations, started, runs);
    }
}

fn report(name: &str, allocations: u64, started: Instant, runs: u64) {
    let elapsed = started.elapsed();
    let allocations = counting::allocations() - allocations;
    println!(
        "| {name} | {:.2} | {:.2} |",
        allocations as f64 / runs as f64,
        elapsed.as_secs_f64() * 1e6 / runs as f64,
    );
}
