//! Fences keep growing when Redis loses its data: after `FLUSHALL`, after a restart without
//! persistence, and after a cluster master restarts empty, the next fence of a name is above
//! every fence issued before.

use std::time::{Duration, Instant};

use tower_lease::store::{KeyLayout, KeyRole};
use tower_lease::{Lock, RedisStore, RwLock, Store};

use tower_lease_harness::{Endpoint, RedisServer};

const INVOICES: Lock<str> = Lock::new("invoice", Duration::from_secs(5)).fenced();
const CATALOG: RwLock<str> = RwLock::new("catalog", Duration::from_secs(5)).fenced();

/// Takes and releases the exclusive lock and the write lock of `name` three times each,
/// checking that each fence is above `floor` and above the one before it of the same lock;
/// answers the highest.
async fn fences_above(store: &Store, name: &str, floor: u64) -> u64 {
    let (mut lock_last, mut write_last) = (floor, floor);
    for _ in 0..3 {
        let token = INVOICES.try_lock(store, name).await.unwrap().expect("free");
        let fence = token.fence().unwrap();
        assert!(fence > lock_last, "lock fence {fence} after {lock_last}");
        lock_last = fence;
        assert!(token.release().await.unwrap());

        let writer = CATALOG.try_write(store, name).await.unwrap().expect("free");
        let fence = writer.fence().unwrap();
        assert!(fence > write_last, "write fence {fence} after {write_last}");
        write_last = fence;
        assert!(writer.release().await.unwrap());
    }
    lock_last.max(write_last)
}

/// Like [`fences_above`], once the store answers again after a restart.
async fn fences_above_once_back(store: &Store, name: &str, floor: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match INVOICES.try_lock(store, name).await {
            Ok(Some(token)) => {
                assert!(token.release().await.unwrap());
                break;
            }
            Ok(None) => panic!("nobody else holds {name}"),
            Err(error) => {
                assert!(Instant::now() < deadline, "store not back: {error}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    fences_above(store, name, floor).await
}

#[tokio::test]
async fn fences_grow_across_flushall_and_a_restart_without_persistence() {
    let mut server = RedisServer::start();
    let store = Store::from(RedisStore::new(server.connection_manager().await));
    let name = "seat-1";
    let before = fences_above(&store, name, 0).await;

    let mut raw = server.connection().await;
    let _: () = redis::cmd("FLUSHALL").query_async(&mut raw).await.unwrap();
    let counter = KeyLayout::default().key(KeyRole::LockFence, "invoice", name.as_bytes());
    let exists: bool = redis::cmd("EXISTS")
        .arg(&counter)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(!exists, "the counter is gone");
    let after_flush = fences_above(&store, name, before).await;

    server.restart();
    fences_above_once_back(&store, name, after_flush).await;
}

#[cfg(feature = "cluster")]
#[tokio::test]
async fn fences_grow_when_a_cluster_master_restarts_empty() {
    let mut cluster = tower_lease_harness::cluster::RedisCluster::start();
    let store = Store::from(RedisStore::new(cluster.connection().await));
    let layout = KeyLayout::default();
    // A name whose keys live on node 1, the one restarted.
    let victim = cluster.nodes()[1].port();
    let name = (0..)
        .map(|i| format!("seat-{i}"))
        .find(|name| {
            let key = layout.key(KeyRole::LockFence, "invoice", name.as_bytes());
            cluster.node_for(&key).port() == victim
        })
        .unwrap();
    let before = fences_above(&store, &name, 0).await;

    cluster.stop_node(1);
    cluster.restart_node(1);
    fences_above_once_back(&store, &name, before).await;
}

/// Distinct names (as a client sending unknown product ids makes them) leave nothing behind
/// that does not expire: once their leases ended, the only keys left are fence counters, each
/// expiring within an hour of its lock's last acquisition; a read acquisition renews its
/// lock's counter and creates none; and fences still grow when the counter has gone.
#[tokio::test]
async fn fence_keys_of_distinct_names_expire_and_fences_still_grow_without_them() {
    const SHORT: Lock<str> = Lock::new("short", Duration::from_millis(100)).fenced();
    const DOCS: RwLock<str> = RwLock::new("docs", Duration::from_millis(100)).fenced();
    const HOUR_MS: i64 = 3_600_000;
    let server = RedisServer::start();
    let store = Store::from(RedisStore::new(server.connection().await));
    let mut raw = server.connection().await;
    let names = 2_000;
    for i in 0..names {
        let name = format!("product-{i}");
        // Abandoned, as a request cut short leaves its lease: it ends by expiry.
        drop(SHORT.try_lock(&store, &name).await.unwrap().unwrap());
        let writer = DOCS.try_write(&store, &name).await.unwrap().unwrap();
        assert!(writer.release().await.unwrap());
        let reader = DOCS
            .try_read(&store, &format!("unwritten-{i}"))
            .await
            .unwrap();
        assert_eq!(reader.unwrap().fence(), Some(0));
    }
    tokio::time::sleep(Duration::from_millis(250)).await;
    let keys: Vec<Vec<u8>> = redis::cmd("KEYS")
        .arg("*")
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(
        keys.len(),
        2 * names,
        "one counter per fenced lock, nothing else"
    );
    for key in &keys {
        assert!(key.ends_with(b":fence"), "{}", String::from_utf8_lossy(key));
        let pttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut raw)
            .await
            .unwrap();
        assert!(pttl > HOUR_MS - 60_000 && pttl <= HOUR_MS, "PTTL {pttl}");
    }

    // A reader renews the counter it reads: the write generation stays while the name is used.
    let counter = KeyLayout::default().key(KeyRole::RwLockFence, "docs", b"product-0");
    let () = redis::cmd("PEXPIRE")
        .arg(&counter)
        .arg(5_000)
        .query_async(&mut raw)
        .await
        .unwrap();
    let reader = DOCS.try_read(&store, "product-0").await.unwrap().unwrap();
    let generation: u64 = redis::cmd("GET")
        .arg(&counter)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert_eq!(reader.fence(), Some(generation));
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&counter)
        .query_async(&mut raw)
        .await
        .unwrap();
    assert!(pttl > HOUR_MS - 60_000, "renewed by the read: PTTL {pttl}");

    // The counter gone (as it goes after its hour): the next fence is still above the last.
    let counter = KeyLayout::default().key(KeyRole::LockFence, "short", b"product-0");
    let last: u64 = redis::cmd("GET")
        .arg(&counter)
        .query_async(&mut raw)
        .await
        .unwrap();
    let () = redis::cmd("DEL")
        .arg(&counter)
        .query_async(&mut raw)
        .await
        .unwrap();
    let next = SHORT.try_lock(&store, "product-0").await.unwrap().unwrap();
    assert!(next.fence().unwrap() > last);
}
