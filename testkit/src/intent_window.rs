//! How long a write intent lives: while its writer waits, and for a short window after a
//! refused attempt: 500 ms (at most the TTL) after an attempt of a waiting writer, which renews
//! it, and 1.5 s after one that does not wait, whose writer comes back after a `Retry-After` of
//! at least a second. A waiting writer that gives up, at its deadline or dropped, takes its
//! intent with it, so readers get in at once; an immediate writer's intent outlives the
//! shortest `Retry-After` and ends within its window; a waiting writer keeps its intent alive
//! while readers stay longer than the window, polling or woken by release notifications, and
//! gets in.
//!
//! The TTL is 2 s, so an intent that lasted two thirds of it (1333 ms) fails the first two; an
//! immediate writer's intent kept for a waiting writer's window fails the third; the last, with
//! a TTL of 900 ms, fails when a notified waiter sleeps past its intent's end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::{Instant, sleep, sleep_until};
use tower_lease::{Fairness, RwLock, Store};

use crate::{Env, ROUNDING, poll};

const DOCS: RwLock<str> =
    RwLock::new("intent", Duration::from_secs(2)).fairness(Fairness::WritersFirst);
/// A lock whose intent, at two thirds of the TTL, would end before a notified waiter's next
/// attempt (up to the last reader's remaining lease).
const KEPT: RwLock<str> =
    RwLock::new("intent-kept", Duration::from_millis(900)).fairness(Fairness::WritersFirst);
/// Longer than the window and than two thirds of `KEPT`'s TTL, shorter than the TTL.
const HOLD: Duration = Duration::from_millis(700);
/// How long the intent of a refused write attempt that does not wait lives.
const RETRY_WINDOW: Duration = Duration::from_millis(1500);
/// The shortest `Retry-After` a client can be told.
const SHORTEST_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Whether the backend still keeps the intent of `name`, where the [`Env`] can look
/// ([`Env::with_intent_probe`]); `false` otherwise.
async fn intent_kept(env: &Env, name: &str) -> bool {
    env.intent_kept(DOCS.namespace(), name.as_bytes()).await
}

/// A writer that waited for readers and gave up (`try_write_for` timed out) leaves no write
/// intent: a new reader gets in at once (and the backend keeps none, where the `Env` can look).
pub async fn a_waiting_writer_that_gives_up_leaves_no_intent(env: Env) {
    let reader = DOCS
        .try_read(&env.store, "deadline")
        .await
        .unwrap()
        .unwrap();
    let wait = Duration::from_millis(300);
    let writer = DOCS.try_write_for(&env.store, "deadline", wait).await;
    assert!(writer.unwrap().is_none(), "the reader keeps the writer out");
    assert!(!intent_kept(&env, "deadline").await, "the intent is gone");
    let second = DOCS.try_read(&env.store, "deadline").await.unwrap();
    let second = second.expect("a reader gets in as soon as the writer gave up");
    assert!(second.release().await.unwrap());
    assert!(reader.release().await.unwrap());
}

/// A waiting writer dropped midway (its client left) withdraws its intent: readers get in
/// again within 150 ms, and the backend keeps no intent.
pub async fn a_dropped_waiting_writer_leaves_no_intent(env: Env) {
    let reader = DOCS.try_read(&env.store, "dropped").await.unwrap().unwrap();
    let store = env.store.clone();
    let wait = Duration::from_secs(5);
    let waiter = tokio::spawn(async move { DOCS.try_write_for(&store, "dropped", wait).await });
    sleep(Duration::from_millis(300)).await;
    let refused = DOCS.attempt_read(&env.store, "dropped").await.unwrap();
    assert!(refused.retry_after().is_some(), "refused while it waits");

    // The client left: the waiter is dropped between two of its attempts.
    waiter.abort();
    let dropped = Instant::now();
    let every = Duration::from_millis(5);
    let (second, sent) = poll(every, Duration::from_secs(3), || async {
        DOCS.try_read(&env.store, "dropped").await.unwrap()
    })
    .await
    .expect("readers come in again");
    let took = sent.saturating_duration_since(dropped);
    // The withdrawal is one round trip, sent as the waiter drops.
    assert!(
        took < Duration::from_millis(150),
        "readers let in after {took:?}"
    );
    assert!(!intent_kept(&env, "dropped").await, "the intent is gone");
    assert!(second.release().await.unwrap());
    assert!(reader.release().await.unwrap());
}

/// A single refused write attempt's intent holds readers off with a `retry_after` of at most
/// its window (1.5 s), outlives its readers, still holds a writer's place when that writer comes
/// back after the shortest `Retry-After` (1 s), and ends with its window.
pub async fn an_immediate_writers_intent_ends_within_the_window(env: Env) {
    let reader = DOCS.try_read(&env.store, "once").await.unwrap().unwrap();
    assert!(DOCS.try_write(&env.store, "once").await.unwrap().is_none());
    let refused_at = Instant::now();
    let refused = DOCS.attempt_read(&env.store, "once").await.unwrap();
    let retry_after = refused.retry_after().expect("the intent holds readers off");
    assert!(
        retry_after <= RETRY_WINDOW + ROUNDING,
        "retry_after {retry_after:?}: the intent lasts one window"
    );
    assert!(reader.release().await.unwrap());
    // Where the writer, told to come back after a second, comes back.
    sleep(SHORTEST_RETRY_AFTER + Duration::from_millis(100)).await;
    let late = DOCS.attempt_read(&env.store, "once").await.unwrap();
    let asked = refused_at.elapsed();
    if asked < RETRY_WINDOW - Duration::from_millis(100) {
        assert!(
            late.retry_after().is_some(),
            "the intent ended {asked:?} after the refusal, before its writer could come back"
        );
    }
    sleep_until(refused_at + RETRY_WINDOW + Duration::from_millis(150)).await;
    let second = DOCS.try_read(&env.store, "once").await.unwrap();
    let second = second.expect("the intent ended with its window");
    assert!(second.release().await.unwrap());
}

/// A reader arriving every 50 ms holds its lease for [`HOLD`] (longer than the window, as a
/// reader under a heartbeat does); a writer on `writer_store` waits up to 4 s. Answers how long
/// the writer took, if it got in, and whether a reader was inside while it held the lock.
async fn writer_among_readers(
    readers_store: &Store,
    writer_store: &Store,
    name: &'static str,
) -> (Option<Duration>, bool) {
    let stop = Arc::new(AtomicBool::new(false));
    let inside = Arc::new(AtomicUsize::new(0));
    let arrivals = {
        let (store, stop, inside) = (readers_store.clone(), stop.clone(), inside.clone());
        tokio::spawn(async move {
            let mut reads = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                if let Some(token) = KEPT.try_read(&store, name).await.unwrap() {
                    let inside = inside.clone();
                    inside.fetch_add(1, Ordering::SeqCst);
                    reads.push(tokio::spawn(async move {
                        sleep(HOLD).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                        token.release().await.unwrap();
                    }));
                }
                sleep(Duration::from_millis(50)).await;
            }
            for read in reads {
                read.await.unwrap();
            }
        })
    };
    sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let wait = Duration::from_secs(4);
    let writer = KEPT.try_write_for(writer_store, name, wait).await.unwrap();
    let took = started.elapsed();
    let overlap = writer.is_some() && inside.load(Ordering::SeqCst) > 0;
    stop.store(true, Ordering::SeqCst);
    let got_in = match writer {
        Some(writer) => {
            assert!(writer.release().await.unwrap());
            Some(took)
        }
        None => None,
    };
    arrivals.await.unwrap();
    (got_in, overlap)
}

/// A writer waiting among readers that keep arriving (each holding longer than the window)
/// keeps its intent alive and gets in within one hold, with no reader inside; on this store and,
/// where the `Env` has one, from another process's store.
pub async fn a_waiting_writer_keeps_its_intent_while_readers_stay(env: Env) {
    let mut runs = vec![("this store", env.store.clone(), "polling")];
    // Woken by notifications, a waiter may sleep up to a second between attempts.
    if let Some(notified) = env.elsewhere() {
        runs.push(("another process", notified, "notified"));
    }
    for (writer, writer_store, name) in runs {
        let (took, overlap) = writer_among_readers(&env.store, &writer_store, name).await;
        eprintln!("writer in {writer}, among readers of {HOLD:?}: in after {took:?}");
        let took = took.unwrap_or_else(|| panic!("the writer in {writer} starved"));
        // The reads inside end within one hold of its first attempt; none start after it.
        assert!(
            took < HOLD + Duration::from_millis(400),
            "the writer in {writer} got in after {took:?}"
        );
        assert!(!overlap, "a reader was inside with the writer");
    }
}
