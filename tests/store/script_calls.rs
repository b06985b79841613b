//! What the reader and permit scripts ask of the server, counted in `INFO commandstats` (which
//! counts the commands scripts run too): every call a script makes costs server CPU on every
//! cycle, so the common paths are pinned here.

use std::time::Duration;

use tower_lease::{RedisStore, RwLock, Semaphore, Store};

use tower_lease_harness::RedisServer;
use tower_lease_harness::server::{Endpoint, calls, commandstats};

const TTL: Duration = Duration::from_millis(2_000);
const CYCLES: u64 = 10;

#[tokio::test]
async fn an_uncontended_read_cycle_asks_one_exists_per_script() {
    let server = RedisServer::start();
    let raw = server.connection().await;
    let store: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let rw: RwLock<str> = RwLock::new("calls-rw", TTL);
    let before = commandstats(&raw).await;
    for _ in 0..CYCLES {
        let read = rw.try_read(&store, "n").await.unwrap().unwrap();
        assert!(read.release().await.unwrap());
    }
    let after = commandstats(&raw).await;
    let exists = calls(&after, "exists") - calls(&before, "exists");
    // The acquire's check for blockers, and the release's one check for readers left and a
    // waiter's mark together.
    assert_eq!(
        exists,
        2 * CYCLES,
        "{exists} EXISTS in {CYCLES} read cycles"
    );
}

#[tokio::test]
async fn a_refused_permit_sweeps_nothing_when_nothing_ended() {
    let server = RedisServer::start();
    let raw = server.connection().await;
    let store: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let permits: Semaphore<str> = Semaphore::new("calls-sem", 1, TTL);
    let held = permits.try_acquire(&store, "n").await.unwrap().unwrap();
    let before = commandstats(&raw).await;
    for _ in 0..CYCLES {
        assert!(permits.try_acquire(&store, "n").await.unwrap().is_none());
    }
    let after = commandstats(&raw).await;
    let swept = calls(&after, "zremrangebyscore") - calls(&before, "zremrangebyscore");
    assert_eq!(
        swept, 0,
        "{swept} sweeps in {CYCLES} refusals with nothing ended"
    );
    assert!(held.release().await.unwrap());
}

/// A reader's or a permit's release whose holder confirmed it live (`Backend::release_live`,
/// which a token's `release` takes within its lease) runs no script: plain commands, and still
/// the same answer and nothing left in the set.
#[tokio::test]
async fn a_live_read_or_permit_release_runs_no_script() {
    let server = RedisServer::start();
    let raw = server.connection().await;
    let store: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let rw: RwLock<str> = RwLock::new("calls-live-rw", TTL);
    let permits: Semaphore<str> = Semaphore::new("calls-live-sem", 2, TTL);
    let scripts = |stats: &str| calls(stats, "evalsha") + calls(stats, "eval");
    for _ in 0..CYCLES {
        let read = rw.try_read(&store, "n").await.unwrap().unwrap();
        let permit = permits.try_acquire(&store, "n").await.unwrap().unwrap();
        let before = commandstats(&raw).await;
        assert!(read.release().await.unwrap());
        assert!(permit.release().await.unwrap());
        let after = commandstats(&raw).await;
        let ran = scripts(&after) - scripts(&before);
        assert_eq!(
            ran, 0,
            "{ran} scripts in a live read and a live permit release"
        );
        assert_eq!(permits.in_use(&store, "n").await.unwrap(), 0);
    }
    // Both sets went with their last member.
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("*calls-live*")
        .query_async(&mut raw.clone())
        .await
        .unwrap();
    assert!(keys.is_empty(), "{keys:?}");
}
