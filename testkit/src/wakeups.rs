//! Notifications: a release in one store wakes a waiter in the other (the [`Env`]'s second
//! store stands for another process; without one, both are the store under test) within
//! [`WAKE`], for each kind of lock and, for an `RwLock`, each side; and a write intent in one
//! store stops the other's shared reads (`RwLockLayer`) from taking new readers at once.
//!
//! The leases last [`TTL`] (5 s), so a waiter that misses a release is not saved by the
//! holder's lease end: it waits for the core's fallback poll, 1 s for a waiter whose store
//! claims notifications ([`Backend::notify_to`](tower_lease::backend::Backend::notify_to)
//! answered `true`), which [`WAKE`] (400 ms) is well under. A store without notifications
//! polls every 100 ms at most, within the same bound. So these catch a backend that claims
//! notifications and delivers nothing, none for releases, a notice sent before the release is
//! visible (the woken waiter is refused, then waits for the poll), or an `RwLock`'s releases
//! announced under another lock's kind. Each waits on the `RwLock`'s
//! [`ReadersFirst`](Fairness::ReadersFirst) side, whose writers leave no write intent: a
//! writer that keeps an intent renews it (every 250 ms), which would hide a missed release.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};
use tower_lease::{Fairness, Lock, RwLock, Semaphore, Store};

use crate::Env;

/// How long the leases last: no waiter wakes for a holder's lease end.
pub const TTL: Duration = Duration::from_secs(5);
/// The longest a wake-up may take: a notification and a round trip on a loaded 2-core machine,
/// or a poll of a store without notifications (every 100 ms at most); well under a watched
/// waiter's fallback poll (1 s).
pub const WAKE: Duration = Duration::from_millis(400);
/// How long each waiter waits at most.
const WAIT: Duration = Duration::from_secs(4);
/// How long a holder holds before it releases: its waiters were refused, watch the lock and
/// sleep by then.
const HOLD: Duration = Duration::from_millis(300);

const JOB: Lock<str> = Lock::new("wake-lock", TTL);
const DOC: RwLock<str> = RwLock::new("wake-rw", TTL).fairness(Fairness::ReadersFirst);
const SLOTS: Semaphore<str> = Semaphore::new("wake-permit", 1, TTL);

/// Which way the releases go: from the store under test to the second store, and back; the
/// store under test alone without a second one.
fn directions(env: &Env) -> Vec<(&'static str, Store, Store)> {
    let here = env.store.clone();
    match env.elsewhere() {
        Some(elsewhere) => vec![
            (
                "released here, waiting elsewhere",
                here.clone(),
                elsewhere.clone(),
            ),
            ("released elsewhere, waiting here", elsewhere, here),
        ],
        None => vec![("one store", here.clone(), here)],
    }
}

/// Asserts that the waiter that got in at `entered` did so within [`WAKE`] of `released`.
fn woken(what: &str, way: &str, released: Instant, entered: Instant) {
    assert!(
        entered >= released,
        "{what} ({way}): the waiter got in before the release"
    );
    let late = entered - released;
    assert!(
        late <= WAKE,
        "{what} ({way}): the waiter got in {late:?} after the release, more than {WAKE:?}: the \
         release did not wake it (no notification, one sent before the release was visible, or \
         under the wrong lock), it waited for its poll"
    );
}

/// Runs `wait` in a task: it answers once it got in, with the instant it did.
fn waiter<F>(wait: F) -> JoinHandle<Instant>
where
    F: Future<Output = Instant> + Send + 'static,
{
    tokio::spawn(wait)
}

/// A `Lock` released in one store wakes its waiter in the other within [`WAKE`].
pub async fn a_locks_release_wakes_its_waiter(env: Env) {
    for (way, from, to) in directions(&env) {
        let held = JOB.try_lock(&from, way).await.unwrap().expect("free");
        let waiting = waiter(async move {
            let token = JOB.try_lock_for(&to, way, WAIT).await.unwrap();
            let entered = Instant::now();
            let token = token.expect("the waiter got in within its wait");
            assert!(token.release().await.unwrap(), "released while held");
            entered
        });
        sleep(HOLD).await;
        let released = Instant::now();
        assert!(held.release().await.unwrap(), "released while held");
        woken("a Lock", way, released, waiting.await.unwrap());
    }
}

/// The last read of an `RwLock` released in one store wakes the writer waiting in the other
/// within [`WAKE`].
pub async fn a_reads_release_wakes_the_waiting_writer(env: Env) {
    for (way, from, to) in directions(&env) {
        let read = DOC.try_read(&from, way).await.unwrap().expect("free");
        let waiting = waiter(async move {
            let token = DOC.try_write_for(&to, way, WAIT).await.unwrap();
            let entered = Instant::now();
            let token = token.expect("the writer got in within its wait");
            assert!(token.release().await.unwrap(), "released while held");
            entered
        });
        sleep(HOLD).await;
        let released = Instant::now();
        assert!(read.release().await.unwrap(), "released while held");
        woken("an RwLock writer", way, released, waiting.await.unwrap());
    }
}

/// A write of an `RwLock` released in one store wakes every reader waiting in the other (three,
/// side by side) within [`WAKE`].
pub async fn a_writes_release_wakes_the_waiting_readers(env: Env) {
    for (way, from, to) in directions(&env) {
        let write = DOC.try_write(&from, way).await.unwrap().expect("free");
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let to = to.clone();
                waiter(async move {
                    let token = DOC.try_read_for(&to, way, WAIT).await.unwrap();
                    let entered = Instant::now();
                    let token = token.expect("the reader got in within its wait");
                    // Held a little, so the readers overlap as they would.
                    sleep(Duration::from_millis(20)).await;
                    assert!(token.release().await.unwrap(), "released while held");
                    entered
                })
            })
            .collect();
        sleep(HOLD).await;
        let released = Instant::now();
        assert!(write.release().await.unwrap(), "released while held");
        for reader in readers {
            woken("an RwLock reader", way, released, reader.await.unwrap());
        }
    }
}

/// A `Semaphore`'s permit released in one store wakes the waiter for a permit in the other
/// within [`WAKE`].
pub async fn a_permits_release_wakes_its_waiter(env: Env) {
    for (way, from, to) in directions(&env) {
        let permit = SLOTS.try_acquire(&from, way).await.unwrap().expect("free");
        let waiting = waiter(async move {
            let token = SLOTS.try_acquire_for(&to, way, WAIT).await.unwrap();
            let entered = Instant::now();
            let token = token.expect("the waiter got a permit within its wait");
            assert!(token.release().await.unwrap(), "released while held");
            entered
        });
        sleep(HOLD).await;
        let released = Instant::now();
        assert!(permit.release().await.unwrap(), "released while held");
        woken("a Semaphore permit", way, released, waiting.await.unwrap());
    }
}
