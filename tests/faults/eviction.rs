//! Memory pressure: `Store::check` warns about a policy that can evict lock keys, a `volatile-*`
//! policy really does evict a held lock, and with `noeviction` a full Redis refuses new leases
//! with an error instead of anything worse.

use std::time::Duration;

use tower_lease::store::{KeyLayout, KeyRole};
use tower_lease::{Error, Lock, RedisStore, Store, Warning};

use tower_lease_harness::server::{fill, fill_until_full};
use tower_lease_harness::{Endpoint, RedisServer};

const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(30));

/// `store`'s warnings but the one every store from a bare connection gets.
async fn warnings(store: &Store) -> Vec<Warning> {
    let mut warnings = store.check().await.unwrap();
    warnings.retain(|w| *w != Warning::NoNotifications);
    warnings
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_policies_that_can_evict_lock_keys() {
    let plain = RedisServer::start();
    let store = Store::from(RedisStore::new(plain.connection().await));
    assert_eq!(
        warnings(&store).await,
        [],
        "defaults: maxmemory 0, noeviction"
    );

    for policy in [
        "volatile-lru",
        "volatile-ttl",
        "allkeys-lru",
        "allkeys-random",
    ] {
        let server =
            RedisServer::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", policy]);
        let warnings = warnings(&Store::from(RedisStore::new(server.connection().await))).await;
        assert_eq!(
            warnings,
            [Warning::EvictingPolicy {
                node: None,
                policy: policy.into(),
                maxmemory: 64 << 20
            }],
        );
        assert!(
            warnings[0]
                .to_string()
                .contains("set maxmemory-policy to noeviction")
        );
    }

    let safe =
        RedisServer::start_with(&["--maxmemory", "64mb", "--maxmemory-policy", "noeviction"]);
    assert_eq!(
        warnings(&Store::from(RedisStore::new(safe.connection().await))).await,
        []
    );
    assert_eq!(Store::memory().check().await.unwrap(), []);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volatile_policy_evicts_a_held_lock_and_lets_a_second_holder_in() {
    let server =
        RedisServer::start_with(&["--maxmemory", "4mb", "--maxmemory-policy", "volatile-lru"]);
    let store = Store::from(RedisStore::new(server.connection().await));
    assert!(matches!(
        &warnings(&store).await[..],
        [Warning::EvictingPolicy { .. }]
    ));
    let first = JOBS.try_lock(&store, "evicted").await.unwrap().unwrap();
    let key = KeyLayout::default().key(KeyRole::Lock, "jobs", b"evicted");

    // Data without a TTL cannot be evicted under volatile-*: the lock key is the only candidate.
    let mut conn = server.connection().await;
    let probe = conn.clone();
    let refused = fill(&mut conn, async || {
        let exists: i64 = redis::cmd("EXISTS")
            .arg(&key)
            .query_async(&mut probe.clone())
            .await
            .unwrap();
        exists == 0
    })
    .await;
    assert!(
        !refused,
        "Redis refused writes before it evicted the lock key"
    );

    // This is the documented hazard: the first holder's lease is gone before its TTL.
    assert!(
        !first.extend().await.unwrap(),
        "the evicted holder learns at its next extend"
    );
    // Free a little room (not the lock key: it is gone already) so the second acquire can write.
    let mut pipe = redis::pipe();
    for i in 0..100 {
        pipe.del(format!("filler:0:{i}")).ignore();
    }
    pipe.query_async::<()>(&mut conn).await.unwrap();
    let second = JOBS.try_lock(&store, "evicted").await.unwrap();
    assert!(second.is_some(), "a second holder got the lock 30 s early");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noeviction_with_memory_full_refuses_new_leases_with_an_error() {
    let server =
        RedisServer::start_with(&["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"]);
    let store = Store::from(RedisStore::new(server.connection().await));
    let held = JOBS.try_lock(&store, "held").await.unwrap().unwrap();
    let mut conn = server.connection().await;
    fill_until_full(&mut conn).await;

    let refused = JOBS.try_lock(&store, "new").await;
    let Err(Error::Redis(e)) = &refused else {
        panic!("expected an OOM error, got {refused:?}")
    };
    assert!(e.to_string().contains("maxmemory"), "{e}");
    // The holder keeps its lease: extending does not allocate, and release frees memory.
    let extended = held.extend().await;
    eprintln!("noeviction, memory full: acquire -> {e}; extend -> {extended:?}");
    assert!(
        matches!(extended, Ok(true)),
        "extend allocates nothing and still works"
    );
    assert!(
        held.release().await.unwrap(),
        "release works on a full Redis"
    );
}
