//! [`LeaseGuard`]'s tests: the heartbeat of one guard, max_hold, release and drop.

use std::borrow::Cow;
use std::time::Duration;

use super::*;
use crate::backend::Mode;
use crate::definition::Definition;
use crate::definition::attempt::Attempt;
use crate::{Lock, Store};

const LOCK: Lock<str> = Lock::new("beat", Duration::from_millis(300));
const EVERY_100_MS: HeartbeatTiming = HeartbeatTiming {
    every: Duration::from_millis(100),
    max_hold: None,
};

/// Acquires `name` on `LOCK`: the lease, and when its command was sent (taken before, as the
/// layer does).
async fn acquire(store: &Store, name: &'static [u8]) -> (RawLease, Instant) {
    let definition: Definition = LOCK.definition();
    let sent_at = Instant::now();
    match RawLease::acquire(
        store.clone(),
        definition,
        Mode::Exclusive,
        Cow::Borrowed(name),
    )
    .await
    .unwrap()
    {
        Attempt::Acquired(held) => (held, sent_at),
        Attempt::Busy { .. } => panic!("free at first"),
    }
}

/// A guard of `x`, enrolled in a heartbeat at once; and when its acquisition was sent.
async fn guard(store: &Store, timing: HeartbeatTiming) -> (LeaseGuard, Instant) {
    let (held, sent_at) = acquire(store, b"x").await;
    let mut guard = LeaseGuard::new(held, sent_at, timing);
    guard.enrol_now(&Heartbeat::default());
    (guard, sent_at)
}

#[tokio::test(start_paused = true)]
async fn the_heartbeat_starts_when_its_first_beat_is_due_under_a_polling_future() {
    let store = Store::memory();
    let timing = EVERY_100_MS;
    let (held, sent_at) = acquire(&store, b"lazy").await;
    let mut guard = LeaseGuard::new(held, sent_at, timing);
    assert!(!guard.is_enrolled(), "no task before it is due");

    // What the response future does while the handler runs: poll, and be woken on time.
    let heartbeat = Heartbeat::default();
    let timer = crate::coarse_timer::CoarseTimer::new(timing.every);
    let polling = std::future::poll_fn(|cx| {
        guard.poll_first_beat(cx, &heartbeat, &timer);
        std::task::Poll::<()>::Pending
    });
    let _ = tokio::time::timeout(Duration::from_millis(150), polling).await;
    assert!(guard.is_enrolled(), "registered when due");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        guard.valid_at(Instant::now()),
        "the driver extends it on its own"
    );
    assert!(LOCK.try_lock(&store, "lazy").await.unwrap().is_none());
}

#[tokio::test(start_paused = true)]
async fn the_heartbeat_keeps_the_lease_and_max_hold_ends_it_at_the_margin() {
    let store = Store::memory();
    let timing = HeartbeatTiming {
        every: Duration::from_millis(100),
        max_hold: Some(Duration::from_millis(250)),
    };
    let (guard, acquired) = guard(&store, timing).await;
    let lease = guard.lease();

    // Extends at 100 and 200 ms; none at 300 ms (past max_hold), so the lease counts as
    // lost at 200 + 300 − (3 + 2) ms = 495 ms, just before the store's end at 500 ms.
    lease.lost().await;
    assert_eq!(acquired.elapsed(), Duration::from_millis(495));
    assert!(!lease.is_held());
    assert!(!guard.valid_at(Instant::now()));
    assert!(
        LOCK.try_lock(&store, "x").await.unwrap().is_none(),
        "still in the store"
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(LOCK.try_lock(&store, "x").await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_lease_stays_valid_while_extended_and_release_ends_it() {
    let store = Store::memory();
    let timing = EVERY_100_MS;
    let (guard, _) = guard(&store, timing).await;
    let lease = guard.lease();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(lease.is_held() && guard.valid_at(Instant::now()));
    assert!(LOCK.try_lock(&store, "x").await.unwrap().is_none());

    guard.release().await;
    assert!(!lease.is_held());
    lease.ended().await;
    let lost = tokio::time::timeout(Duration::from_secs(60), lease.lost()).await;
    assert!(lost.is_err(), "a released lease is not lost");
    assert!(LOCK.try_lock(&store, "x").await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn a_dropped_guard_releases_in_the_background() {
    let store = Store::memory();
    let timing = EVERY_100_MS;
    let (guard, _) = guard(&store, timing).await;
    drop(guard);
    tokio::task::yield_now().await;
    assert!(LOCK.try_lock(&store, "x").await.unwrap().is_some());
}
