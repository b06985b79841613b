//! `Held::into_token`: the heartbeat stops, the token comes back, and the lease runs to its TTL
//! from its last extension unless the token releases it.

use std::time::{Duration, Instant};

use tower_lease::Lock;

use tower_lease_harness::Backing;

const NIGHTLY: Lock<str> = Lock::new("nightly", Duration::from_millis(300));

tower_lease_harness::store_tests!(
    Layer: [
        into_token_keeps_the_lease_to_its_ttl_without_the_heartbeat,
        a_token_from_into_token_releases_and_keeps_alive_again,
    ]
);

async fn into_token_keeps_the_lease_to_its_ttl_without_the_heartbeat(env: Backing) {
    let held = NIGHTLY
        .try_lock(&env.store, "a")
        .await
        .unwrap()
        .unwrap()
        .keep_alive();
    // Two TTLs: only the heartbeat kept it this long.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(held.is_held());
    let lease = held.lease();
    let token = held.into_token();
    let handed = Instant::now();
    assert!(
        !lease.is_held(),
        "the Held's lease handle says it is over for it"
    );
    assert!(
        NIGHTLY.try_lock(&env.store, "a").await.unwrap().is_none(),
        "the lease outlives the Held"
    );
    // The last extension was at most a third of the TTL ago (plus a loaded machine's slack):
    // the lease is still there for most of a TTL, then runs out, as nothing extends it.
    tokio::time::sleep(Duration::from_millis(120)).await;
    assert!(
        NIGHTLY.try_lock(&env.store, "a").await.unwrap().is_none(),
        "held {:?} after into_token",
        handed.elapsed()
    );
    let freed = loop {
        if let Some(next) = NIGHTLY.try_lock(&env.store, "a").await.unwrap() {
            assert!(next.release().await.unwrap());
            break handed.elapsed();
        }
        assert!(
            handed.elapsed() < Duration::from_millis(900),
            "still held {:?} after into_token: the heartbeat did not stop",
            handed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert!(freed <= Duration::from_millis(900), "freed after {freed:?}");
    // Run out: the token's release says so, and touches nobody's lease.
    assert!(!token.release().await.unwrap());
}

async fn a_token_from_into_token_releases_and_keeps_alive_again(env: Backing) {
    let held = NIGHTLY
        .try_lock(&env.store, "b")
        .await
        .unwrap()
        .unwrap()
        .keep_alive();
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Kept alive again: the new Held counts from the last extension, so it is held, and stays
    // held past the TTL.
    let held = held.into_token().keep_alive();
    assert!(held.is_held());
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(held.is_held(), "the second heartbeat kept it");
    assert!(NIGHTLY.try_lock(&env.store, "b").await.unwrap().is_none());
    let token = held.into_token();
    assert!(token.release().await.unwrap(), "released within its TTL");
    let next = NIGHTLY.try_lock(&env.store, "b").await.unwrap();
    assert!(next.expect("free at once").release().await.unwrap());
}
