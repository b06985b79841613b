//! `Lock`: one holder per name.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::{Instant, sleep};
use tower_lease::backend::{LockRef, Mode};
use tower_lease::{Attempt, Lock};

use crate::{Env, Holders, ROUNDING, assert_strangers_refused, poll};

const LONG: Lock<str> = Lock::new("conformance", Duration::from_secs(10));

/// 64 tasks contend for three names through `Lock::try_lock`: never two holders inside one
/// name's critical section, someone gets in, and every acquisition releases with `true`.
pub async fn mutual_exclusion(env: Env) {
    const TASKS: usize = 64;
    const ROUNDS: usize = 20;
    let names = ["alpha", "beta", "gamma"];
    let holders: Arc<HashMap<&str, Holders>> =
        Arc::new(names.iter().map(|n| (*n, Holders::default())).collect());
    let acquired = Arc::new(AtomicUsize::new(0));
    let released = Arc::new(AtomicUsize::new(0));

    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let (store, holders) = (env.store.clone(), holders.clone());
        let (acquired, released) = (acquired.clone(), released.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..ROUNDS {
                let name = names[(task + round) % names.len()];
                let Some(token) = LONG.try_lock(&store, name).await.unwrap() else {
                    tokio::task::yield_now().await;
                    continue;
                };
                acquired.fetch_add(1, Ordering::SeqCst);
                let inside = holders[name].enter();
                sleep(Duration::from_millis(1)).await;
                drop(inside);
                if token.release().await.unwrap() {
                    released.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(
        holders.values().map(Holders::most).max(),
        Some(1),
        "two holders inside one critical section"
    );
    let acquired = acquired.load(Ordering::SeqCst);
    assert!(
        acquired >= names.len(),
        "contention starved everyone: {acquired} acquisitions"
    );
    assert_eq!(
        acquired,
        released.load(Ordering::SeqCst),
        "an acquisition was not released"
    );
}

/// A stranger (another secret) can neither release nor extend a held lock, which stays taken;
/// the holder then extends and releases it, and the name is free at once.
pub async fn only_the_holder_releases_or_extends(env: Env) {
    let token = LONG
        .try_lock(&env.store, "holder-only")
        .await
        .unwrap()
        .unwrap();
    assert!(
        LONG.try_lock(&env.store, "holder-only")
            .await
            .unwrap()
            .is_none()
    );

    // Anyone without the token is refused, whatever they ask for.
    let lock = LockRef::new(LONG.namespace(), b"holder-only", LONG.ttl());
    assert_strangers_refused(&env.store, lock, Mode::Exclusive).await;
    assert!(
        LONG.try_lock(&env.store, "holder-only")
            .await
            .unwrap()
            .is_none(),
        "stranger freed it"
    );

    assert!(token.extend().await.unwrap());
    assert!(token.release().await.unwrap());
    let again = LONG.try_lock(&env.store, "holder-only").await.unwrap();
    assert!(again.is_some(), "a released lock must be free at once");
}

/// The release of a lease that ran out, after the next holder took the name, answers `false`
/// and leaves the next holder's lease in place.
pub async fn stale_release_leaves_next_holder_alone(env: Env) {
    let short = Lock::<str>::new("conformance", Duration::from_millis(200));
    let stale = short.try_lock(&env.store, "stale").await.unwrap().unwrap();
    sleep(Duration::from_millis(300)).await;
    let next = LONG
        .try_lock(&env.store, "stale")
        .await
        .unwrap()
        .expect("the stale lease ran out");
    assert!(
        !stale.release().await.unwrap(),
        "a stale token must not release"
    );
    assert!(
        LONG.try_lock(&env.store, "stale").await.unwrap().is_none(),
        "the stale release deleted the next holder's lock"
    );
    assert!(next.release().await.unwrap());
}

/// An extension after the lease ran out answers `false` and does not take the name again: the
/// next holder gets in, and the stale token can neither extend nor release its lease.
pub async fn extend_after_expiry_does_not_reacquire(env: Env) {
    let short = Lock::<str>::new("conformance", Duration::from_millis(200));
    let token = short.try_lock(&env.store, "lapsed").await.unwrap().unwrap();
    sleep(Duration::from_millis(300)).await;
    assert!(
        !token.extend().await.unwrap(),
        "extend after expiry must answer false"
    );
    let other = LONG.try_lock(&env.store, "lapsed").await.unwrap();
    assert!(other.is_some(), "the failed extend took the lock again");
    assert!(
        !token.extend().await.unwrap(),
        "extend must not steal the next holder's lease"
    );
    assert!(!token.release().await.unwrap());
}

/// Three extensions, each within the lease, carry it well past its first TTL: the name stays
/// taken, and the release answers `true`.
pub async fn extend_keeps_the_lease(env: Env) {
    let ttl = Duration::from_millis(400);
    let lock = Lock::<str>::new("conformance", ttl);
    let token = lock.try_lock(&env.store, "kept").await.unwrap().unwrap();
    // Three extensions at 60 % of the TTL carry the lease well past its first end.
    for _ in 0..3 {
        sleep(ttl * 6 / 10).await;
        assert!(
            token.extend().await.unwrap(),
            "extend within the lease must succeed"
        );
    }
    assert!(
        lock.try_lock(&env.store, "kept").await.unwrap().is_none(),
        "extended lease was lost"
    );
    assert!(token.release().await.unwrap());
}

/// A lease whose holder sends nothing more frees its name no earlier than its TTL after the
/// acquisition and no later than 250 ms past it.
pub async fn abandoned_lease_frees_itself_after_ttl(env: Env) {
    let ttl = Duration::from_millis(300);
    let lock = Lock::<str>::new("conformance", ttl);
    let sent = Instant::now();
    let token = lock
        .try_lock(&env.store, "abandoned")
        .await
        .unwrap()
        .unwrap();
    let answered = Instant::now();
    drop(token); // as a crashed holder would: nothing is sent

    // The attempt that got in was sent at `freed_at`, and answered at `seen_free`: the store
    // found the name free somewhere between, so only the answer bounds the TTL from below.
    let ((_next, seen_free), freed_at) =
        poll(Duration::from_millis(5), Duration::from_secs(3), || async {
            let next = lock.try_lock(&env.store, "abandoned").await.unwrap();
            next.map(|next| (next, Instant::now()))
        })
        .await
        .expect("an abandoned lease must free itself");
    assert!(
        seen_free + ROUNDING >= sent + ttl,
        "freed {:?} after acquiring, before its TTL",
        seen_free - sent
    );
    assert!(
        freed_at <= answered + ttl + Duration::from_millis(250),
        "freed {:?} after acquiring, long after its TTL",
        freed_at - sent
    );
}

/// A refused acquisition's `retry_after` is the holder's remaining lease (within the
/// rounding), asked twice 100 ms apart.
pub async fn retry_after_is_the_holders_remaining_lease(env: Env) {
    let ttl = Duration::from_millis(1000);
    let lock = Lock::<str>::new("conformance", ttl);
    let sent = Instant::now();
    let _token = lock.try_lock(&env.store, "busy").await.unwrap().unwrap();
    let answered = Instant::now();
    sleep(Duration::from_millis(300)).await;

    // Twice: on Redis a name refused lately is asked with its `PTTL` in the same round trip.
    for _ in 0..2 {
        let asked = Instant::now();
        let attempt = lock.attempt(&env.store, "busy").await.unwrap();
        let told = Instant::now();
        let Attempt::Busy { retry_after } = attempt else {
            panic!("the lock is held")
        };
        // The holder's lease ends between `sent + ttl` and `answered + ttl`.
        let at_most = (answered + ttl).saturating_duration_since(asked) + ROUNDING;
        let at_least = (sent + ttl)
            .saturating_duration_since(told)
            .saturating_sub(ROUNDING);
        assert!(
            retry_after >= at_least && retry_after <= at_most,
            "retry_after {retry_after:?} not within {at_least:?}..={at_most:?}"
        );
        sleep(Duration::from_millis(100)).await;
    }
}

/// A fenced lock's fences increase with every acquisition of a name; another name has fences
/// of its own, and an unfenced lock hands out none.
pub async fn fences_increase_per_name(env: Env) {
    let fenced = LONG.fenced();
    let mut last = 0;
    for _ in 0..5 {
        let token = fenced
            .try_lock(&env.store, "fenced-a")
            .await
            .unwrap()
            .unwrap();
        let fence = token.fence().expect("a fenced lock hands out fences");
        assert!(fence > last, "fence {fence} after {last}");
        last = fence;
        assert!(token.release().await.unwrap());
    }
    let other = fenced
        .try_lock(&env.store, "fenced-b")
        .await
        .unwrap()
        .unwrap();
    let other_fence = other.fence().expect("a fenced lock hands out fences");
    assert!(other_fence > 0, "another name has a fence of its own");
    let plain = LONG
        .try_lock(&env.store, "unfenced")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(plain.fence(), None);
}
