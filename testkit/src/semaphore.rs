//! `Semaphore`: at most K permits per name, each a lease of its own.

use std::time::Duration;

use tokio::time::{Instant, sleep};
use tower_lease::backend::{LockRef, Mode};
use tower_lease::{Attempt, Error, Semaphore};

use crate::{Env, ROUNDING, assert_strangers_refused};

const EXPORTS: Semaphore<str> = Semaphore::new("export", 3, Duration::from_secs(10));
const SHORT: Semaphore<str> = Semaphore::new("export", 1, Duration::from_millis(500));

/// Permits are granted up to the limit and refused past it, `in_use` counts them, another name
/// has its own, and a released slot can be taken again.
pub async fn permits_up_to_the_limit(env: Env) {
    let store = &env.store;
    let mut permits = Vec::new();
    for n in 1..=3 {
        let permit = EXPORTS.try_acquire(store, "tenant").await.unwrap();
        permits.push(permit.unwrap_or_else(|| panic!("permit {n} of 3 refused")));
        assert_eq!(EXPORTS.in_use(store, "tenant").await.unwrap(), n);
    }
    let fourth = EXPORTS.try_acquire(store, "tenant").await.unwrap();
    assert!(fourth.is_none(), "a fourth permit of 3");
    // Another name has its own permits.
    let other = EXPORTS.try_acquire(store, "other").await.unwrap();
    assert!(other.is_some(), "names share permits");

    let first = permits.remove(0);
    assert!(first.release().await.unwrap());
    assert_eq!(EXPORTS.in_use(store, "tenant").await.unwrap(), 2);
    let again = EXPORTS.try_acquire(store, "tenant").await.unwrap();
    assert!(again.is_some(), "a released slot stays taken");
    assert_eq!(EXPORTS.in_use(store, "tenant").await.unwrap(), 3);
}

/// A refused permit's `retry_after` is the *earliest* live permit's remaining lease, not the
/// latest's.
pub async fn retry_after_is_the_earliest_live_permit(env: Env) {
    let store = &env.store;
    let sem = Semaphore::<str>::new("export", 2, Duration::from_millis(1500));
    let first_sent = Instant::now();
    let _earliest = sem.try_acquire(store, "t").await.unwrap().unwrap();
    let first_answered = Instant::now();
    sleep(Duration::from_millis(300)).await;
    let _latest = sem.try_acquire(store, "t").await.unwrap().unwrap();
    let third_sent = Instant::now();
    let Attempt::Busy { retry_after } = sem.attempt(store, "t").await.unwrap() else {
        panic!("a third permit of 2");
    };
    let third_answered = Instant::now();
    // The earliest permit ends 1500 ms after the store took it, somewhere between `first_sent`
    // and `first_answered`; the store answered the third attempt between `third_sent` and
    // `third_answered`. The latest permit ends 300 ms later than the earliest.
    let ttl = Duration::from_millis(1500);
    let at_most = ttl.saturating_sub(third_sent - first_answered);
    let at_least = ttl.saturating_sub(third_answered - first_sent);
    assert!(
        retry_after <= at_most + ROUNDING,
        "retry_after {retry_after:?} is past the earliest permit's end (at most {at_most:?})"
    );
    assert!(
        retry_after + ROUNDING >= at_least,
        "retry_after {retry_after:?} is before the earliest permit's end (at least {at_least:?})"
    );
}

/// A permit nobody releases stops counting after its TTL: `in_use` is 0 and the slot can be
/// taken.
pub async fn an_abandoned_permit_frees_its_slot_after_its_ttl(env: Env) {
    let store = &env.store;
    drop(SHORT.try_acquire(store, "t").await.unwrap().unwrap()); // its holder crashes
    assert!(SHORT.try_acquire(store, "t").await.unwrap().is_none());
    sleep(Duration::from_millis(600)).await;
    assert_eq!(SHORT.in_use(store, "t").await.unwrap(), 0);
    let next = SHORT.try_acquire(store, "t").await.unwrap();
    assert!(next.is_some(), "an ended permit still takes its slot");
}

/// An extension of a permit that ran out answers `false` and takes no slot back; nor does its
/// release take the next holder's permit.
pub async fn extend_after_expiry_fails_and_takes_no_slot(env: Env) {
    let store = &env.store;
    let late = SHORT.try_acquire(store, "t").await.unwrap().unwrap();
    sleep(Duration::from_millis(600)).await;
    assert!(
        !late.extend().await.unwrap(),
        "an ended permit was extended"
    );
    assert_eq!(
        SHORT.in_use(store, "t").await.unwrap(),
        0,
        "extend re-took a slot"
    );

    let next = SHORT.try_acquire(store, "t").await.unwrap().unwrap();
    assert!(!late.extend().await.unwrap());
    assert!(!late.release().await.unwrap(), "an ended permit released");
    assert_eq!(
        SHORT.in_use(store, "t").await.unwrap(),
        1,
        "the next holder's permit is gone"
    );
    assert!(next.release().await.unwrap());
}

/// Extensions within the lease keep a permit past its first TTL: it still counts and refuses
/// others; its release frees the slot.
pub async fn extend_keeps_a_permit_past_its_first_ttl(env: Env) {
    let store = &env.store;
    let sem = Semaphore::<str>::new("export", 1, Duration::from_millis(1000));
    let permit = sem.try_acquire(store, "t").await.unwrap().unwrap();
    for _ in 0..4 {
        sleep(Duration::from_millis(300)).await;
        assert!(permit.extend().await.unwrap());
    }
    // 1200 ms after a 1000 ms acquire: only the extensions keep it.
    assert_eq!(sem.in_use(store, "t").await.unwrap(), 1);
    assert!(sem.try_acquire(store, "t").await.unwrap().is_none());
    assert!(permit.release().await.unwrap());
    assert_eq!(sem.in_use(store, "t").await.unwrap(), 0);
}

/// Strangers can neither release nor extend a permit; it still counts.
pub async fn permits_are_holder_only(env: Env) {
    let store = &env.store;
    let _held = EXPORTS.try_acquire(store, "t").await.unwrap().unwrap();
    let lock = LockRef::new("export", b"t", EXPORTS.ttl()).permits(3);
    assert_strangers_refused(store, lock, Mode::Permit).await;
    assert_eq!(EXPORTS.in_use(store, "t").await.unwrap(), 1);
}

/// The limit is the caller's: a call with 1 permit is refused beside one live permit, a call
/// with 3 is not.
pub async fn each_call_checks_its_own_limit(env: Env) {
    let store = &env.store;
    let one = EXPORTS.with_permits(1).unwrap();
    let _first = EXPORTS.try_acquire(store, "t").await.unwrap().unwrap();
    assert!(one.try_acquire(store, "t").await.unwrap().is_none());
    let second = EXPORTS.try_acquire(store, "t").await.unwrap();
    assert!(second.is_some(), "a limit of 3 with 1 live");
}

/// A waiter (`try_acquire_for`) gets the slot a release frees, long before the held permit's
/// lease would have ended.
pub async fn a_waiter_gets_the_slot_a_release_frees(env: Env) {
    let store = env.store.clone();
    let one = EXPORTS.with_permits(1).unwrap();
    // Held for 10 s unless released: only the release can serve the waiter in time.
    let held = one.try_acquire(&store, "t").await.unwrap().unwrap();
    let releaser = tokio::spawn(async move {
        sleep(Duration::from_millis(50)).await;
        held.release().await.unwrap()
    });
    let started = Instant::now();
    let permit = one
        .try_acquire_for(&store, "t", Duration::from_secs(5))
        .await
        .unwrap();
    assert!(permit.is_some(), "the waiter was not served");
    assert!(releaser.await.unwrap());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "served after {:?}, not at the release",
        started.elapsed()
    );
}

/// 0 permits, a bad namespace and names out of range are clear errors, never panics.
pub async fn bad_input_is_a_clear_error(env: Env) {
    let store = &env.store;
    let ttl = Duration::from_secs(1);
    assert!(matches!(
        Semaphore::<str>::try_new("export", 0, ttl),
        Err(Error::InvalidPermits)
    ));
    assert!(matches!(
        EXPORTS.with_permits(0),
        Err(Error::InvalidPermits)
    ));
    assert!(matches!(
        Semaphore::<str>::try_new("with:colon", 2, ttl),
        Err(Error::InvalidNamespace { .. })
    ));
    let long = "n".repeat(tower_lease::MAX_NAME_LEN + 1);
    for name in ["", long.as_str()] {
        assert!(matches!(
            EXPORTS.try_acquire(store, name).await,
            Err(Error::InvalidName { .. })
        ));
        assert!(matches!(
            EXPORTS.in_use(store, name).await,
            Err(Error::InvalidName { .. })
        ));
    }
}

/// A permit released after its lease ran out answers `false`, and takes no live permit with
/// it.
pub async fn a_permit_released_after_its_lease_ran_out_answers_false(env: Env) {
    let pair = Semaphore::<str>::new("export", 2, Duration::from_millis(200));
    let ended = pair.try_acquire(&env.store, "late").await.unwrap().unwrap();
    sleep(Duration::from_millis(300)).await;
    let live = pair.try_acquire(&env.store, "late").await.unwrap().unwrap();
    assert!(!ended.release().await.unwrap(), "an ended permit released");
    let other = pair.try_acquire(&env.store, "late").await.unwrap().unwrap();
    assert!(
        pair.try_acquire(&env.store, "late")
            .await
            .unwrap()
            .is_none(),
        "a third permit of two: the ended permit's release took a live one with it"
    );
    assert!(live.release().await.unwrap(), "a live permit's release");
    assert!(other.release().await.unwrap(), "a live permit's release");
}
