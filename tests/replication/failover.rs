//! Leases across a Sentinel failover (`SIGKILL` of the primary, promotion of its replica): one
//! taken with `wait_for_replicas` survives it and is released through the new primary, fences
//! keep growing, and one taken without `WAIT` while replication lagged is lost to a second
//! holder, as the README warns.
//!
//! The leases here last 10 s: longer than a failover takes on a loaded machine (about 1 to 3 s
//! with `down-after-milliseconds` 500), so a lease lost in it was lost to the failover, not to
//! its TTL.

use std::time::{Duration, Instant};

use tower_lease::{Lock, Store};

use crate::support::Endpoint;
use crate::support::proxy::Fault;
use crate::support::sentinel::{Link, Topology};

const LEASE: Duration = Duration::from_secs(10);
const JOBS: Lock<str> = Lock::new("jobs", LEASE);
const FENCED: Lock<str> = Lock::new("fenced-jobs", LEASE).fenced();

#[tokio::test]
async fn a_replicated_lease_survives_a_failover_and_is_released_through_the_new_primary() {
    let mut topology = Topology::with_sentinels(Link::Direct).await;
    let holder: Store = topology
        .through_sentinels()
        .await
        .wait_for_replicas(1, Duration::from_millis(500))
        .into();
    let token = JOBS.try_lock(&holder, "a").await.unwrap().expect("free");
    let taken = Instant::now();

    let took = topology.kill_primary_and_fail_over().await;
    eprintln!("failover took {took:?}");
    let rival: Store = topology.through_sentinels().await.into();
    assert!(
        JOBS.try_lock(&rival, "a")
            .await
            .expect("the new primary answers")
            .is_none(),
        "the new primary lost the lease"
    );
    assert!(
        taken.elapsed() < LEASE,
        "the lease ran out before the check"
    );
    // The holder's connection was to the dead primary: once a call found it gone, the store
    // asks the sentinels again. (A call may meet the old connection while it is still dying.)
    answers_again(&holder).await;
    assert!(
        token.release().await.unwrap(),
        "released through the new primary"
    );
    assert!(JOBS.try_lock(&rival, "a").await.unwrap().is_some());
}

#[tokio::test]
async fn fences_keep_growing_across_a_failover() {
    let mut topology = Topology::with_sentinels(Link::Direct).await;
    // Without WAIT: the promoted replica has no replica of its own to acknowledge anything, and
    // fences come from the server's clock, not from what was replicated.
    let store: Store = topology.through_sentinels().await.into();
    let mut before = 0;
    for _ in 0..3 {
        let token = FENCED.try_lock(&store, "a").await.unwrap().expect("free");
        let fence = token.fence().unwrap();
        assert!(fence > before);
        before = fence;
        assert!(token.release().await.unwrap());
    }
    topology.kill_primary_and_fail_over().await;
    // The first call after the failover may still meet the dead primary's connection.
    let deadline = Instant::now() + Duration::from_secs(5);
    let token = loop {
        match FENCED.try_lock(&store, "a").await {
            Ok(token) => break token.expect("free"),
            Err(e) => assert!(Instant::now() < deadline, "store not back: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let after = token.fence().unwrap();
    assert!(
        after > before,
        "fence {after} after the failover, {before} before"
    );
}

#[tokio::test]
async fn without_wait_a_failover_after_lagging_replication_lets_a_second_holder_in() {
    let mut topology = Topology::with_sentinels(Link::Proxied).await;
    let holder: Store = topology.through_sentinels().await.into();
    let link = topology.link.take().expect("a proxied replica");
    link.set(Fault::Blackhole);
    let token = JOBS.try_lock(&holder, "a").await.unwrap().expect("free");
    let taken = Instant::now();
    let key = holder_key();
    let mut replica = topology.replica.connection().await;
    let on_replica: Option<Vec<u8>> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut replica)
        .await
        .unwrap();
    assert_eq!(on_replica, None, "replication was held back");

    topology.kill_primary_and_fail_over().await;
    link.sever();
    let rival: Store = topology.through_sentinels().await.into();
    let second = JOBS.try_lock(&rival, "a").await.unwrap();
    assert!(
        taken.elapsed() < LEASE,
        "the first lease is still live by its TTL"
    );
    assert!(second.is_some(), "the failover kept the lease after all");
    assert!(
        !token.release().await.unwrap(),
        "the first holder finds its lease gone"
    );
}

fn holder_key() -> Vec<u8> {
    tower_lease::store::KeyLayout::default().key(tower_lease::store::KeyRole::Lock, "jobs", b"a")
}

/// Waits until `store` answers a call that sends no `WAIT` (for at most 5 s).
async fn answers_again(store: &Store) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while let Err(e) = store.check().await {
        assert!(Instant::now() < deadline, "store not back: {e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
