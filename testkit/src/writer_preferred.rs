//! `Fairness::WritersFirst` (the old `writer_preferred`): a write attempt refused by readers
//! holds new readers off, with the intent's remaining time as their `retry_after`, until the
//! readers leave and the writer gets in; an intent ends by itself one window after its attempt
//! (for a writer that does not wait, 1.5 s, as long as a client told to retry after a second
//! needs to come back);
//! under `Fairness::ReadersFirst`, readers keep coming. A reader's extension reports a live
//! intent (`Extended::HeldWriterWaiting`), through the single call and the batch, and still
//! extends the lease.

use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until};
use tower_lease::backend::{Extended, LeaseRef, LockRef, Mode, Secret};
use tower_lease::{Fairness, RwLock};

use crate::{Env, ROUNDING};

const TTL: Duration = Duration::from_millis(900);
const PREFERRED: RwLock<str> = RwLock::new("preferred", TTL).fairness(Fairness::WritersFirst);
const PLAIN: RwLock<str> = RwLock::new("plain", TTL).fairness(Fairness::ReadersFirst);
/// How long the intent of a refused write attempt that does not wait lives: 1.5 s, longer
/// than the TTL.
const INTENT: Duration = Duration::from_millis(1500);

/// A write refused by readers leaves an intent: new readers are refused with the intent's
/// remaining time; the writer gets in once the readers left, and after its write no intent is
/// left (a reader gets in at once).
pub async fn a_refused_writer_holds_new_readers_off_until_the_readers_leave(env: Env) {
    assert_eq!(PREFERRED.fairness_policy(), Fairness::WritersFirst);
    assert_eq!(PLAIN.fairness_policy(), Fairness::ReadersFirst);
    let reader = PREFERRED
        .try_read(&env.store, "doc")
        .await
        .unwrap()
        .unwrap();
    assert!(
        PREFERRED
            .try_write(&env.store, "doc")
            .await
            .unwrap()
            .is_none()
    );

    let refused = PREFERRED.attempt_read(&env.store, "doc").await.unwrap();
    let retry_after = refused
        .retry_after()
        .expect("a new reader waits for the writer");
    assert!(
        retry_after <= INTENT + ROUNDING && retry_after > INTENT - Duration::from_millis(200),
        "retry_after {retry_after:?}, the intent's remaining time"
    );

    assert!(reader.release().await.unwrap());
    let writer = PREFERRED.try_write(&env.store, "doc").await.unwrap();
    let writer = writer.expect("the writer gets in once the readers left");
    assert!(
        PREFERRED
            .try_read(&env.store, "doc")
            .await
            .unwrap()
            .is_none()
    );
    assert!(writer.release().await.unwrap());
    let reader = PREFERRED.try_read(&env.store, "doc").await.unwrap();
    assert!(
        reader
            .expect("no intent left after the write")
            .release()
            .await
            .unwrap()
    );
}

/// The intent of a writer that never came back ends one window after its attempt: readers get
/// in again. It outlives the readers that refused the writer.
pub async fn an_abandoned_intent_ends_by_itself(env: Env) {
    let reader = PREFERRED
        .try_read(&env.store, "gone")
        .await
        .unwrap()
        .unwrap();
    assert!(
        PREFERRED
            .try_write(&env.store, "gone")
            .await
            .unwrap()
            .is_none()
    );
    let refused_at = Instant::now();
    assert!(reader.release().await.unwrap());
    assert!(
        PREFERRED
            .try_read(&env.store, "gone")
            .await
            .unwrap()
            .is_none(),
        "the intent outlives the readers"
    );
    // The writer did not wait; its intent ends one window after its attempt.
    sleep_until(refused_at + INTENT + Duration::from_millis(50)).await;
    let second = PREFERRED.try_read(&env.store, "gone").await.unwrap();
    assert!(
        second
            .expect("readers come in again")
            .release()
            .await
            .unwrap()
    );
}

/// Readers-first, a refused writer leaves no intent: new readers get in.
pub async fn without_the_preference_readers_keep_coming_in(env: Env) {
    let first = PLAIN.try_read(&env.store, "doc").await.unwrap().unwrap();
    assert!(PLAIN.try_write(&env.store, "doc").await.unwrap().is_none());
    let second = PLAIN.try_read(&env.store, "doc").await.unwrap();
    assert!(
        second
            .expect("a new reader is let in")
            .release()
            .await
            .unwrap()
    );
    assert!(first.release().await.unwrap());
}

/// A reader's extension answers `Held` without a waiting writer and `HeldWriterWaiting` while
/// a write intent lives, through `extend` and `extend_many`, and still extends the lease.
pub async fn a_readers_extension_reports_a_waiting_writer(env: Env) {
    let backend = env.backend();
    let (mine, other) = (Secret::random(), Secret::random());
    let lock = LockRef::new("extend-intent", b"doc", TTL).fairness(Fairness::WritersFirst);
    let reader = LeaseRef::new(lock, Mode::Read, &mine);
    let acquired = backend.acquire(reader).await.unwrap();
    assert!(matches!(
        acquired,
        tower_lease::backend::Acquisition::Acquired { .. }
    ));
    assert_eq!(
        backend.extend(reader).await.unwrap(),
        Extended::Held,
        "no writer yet"
    );

    // A writer refused by the reader leaves its intent; one that waits, for 500 ms.
    let writer = LeaseRef::new(lock, Mode::Write, &other).waiting();
    let refused = backend.acquire(writer).await.unwrap();
    assert!(matches!(
        refused,
        tower_lease::backend::Acquisition::Busy { .. }
    ));
    sleep(Duration::from_millis(300)).await;
    assert_eq!(
        backend.extend(reader).await.unwrap(),
        Extended::HeldWriterWaiting,
        "the reader hears of the waiting writer"
    );
    let batch = backend.extend_many(&[reader, reader]).await;
    assert!(
        batch
            .iter()
            .all(|answer| matches!(answer, Ok(Extended::HeldWriterWaiting))),
        "and so does a batch: {batch:?}"
    );
    // At 1 s the lease still lives (extended at 300 ms for 900 ms), and the intent has run out
    // (500 ms after the write attempt, which was not repeated): a plain answer again.
    sleep(Duration::from_millis(700)).await;
    assert_eq!(backend.extend(reader).await.unwrap(), Extended::Held);
    assert!(backend.release(reader).await.unwrap());
    assert_eq!(
        backend.extend(reader).await.unwrap(),
        Extended::Gone,
        "a released lease is gone"
    );
    // A stranger's extend is gone too, intent or not.
    let refused = backend.acquire(writer).await.unwrap();
    assert!(matches!(
        refused,
        tower_lease::backend::Acquisition::Acquired { .. }
    ));
    let stranger = LeaseRef::new(lock, Mode::Read, &other);
    assert_eq!(backend.extend(stranger).await.unwrap(), Extended::Gone);
}
