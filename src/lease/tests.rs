//! The driver against a scripted store: batching, ending with its last lease, hung and failing
//! stores, and leases the store no longer holds.

use std::borrow::Cow;
use std::sync::atomic::AtomicU8;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::Result;
use crate::backend::BoxFuture;
use crate::backend::{Acquisition, Backend, Extended, LeaseRef, LockRef, Mode};
use crate::definition::attempt::Attempt;
use crate::lease::kept::KeptLease;
use crate::store::MemoryStore;
use crate::store::heartbeat::{Heartbeat, HeartbeatTiming};
use crate::store::raw::RawLease;
use crate::{Error, Lock, Store};

const LOCK: Lock<str> = Lock::new("driver", Duration::from_millis(300));
const EVERY: Duration = Duration::from_millis(100);

const ANSWER: u8 = 0;
const FAIL: u8 = 1;
const HANG: u8 = 2;
const GONE: u8 = 3;

/// The memory store, with extensions that can fail, hang or find the lease gone, and a
/// record of every batch's size.
#[derive(Default)]
struct Scripted {
    memory: MemoryStore,
    extends: AtomicU8,
    batches: Mutex<Vec<usize>>,
}

impl Backend for Arc<Scripted> {
    fn acquire<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Acquisition>> {
        self.memory.acquire(lease)
    }

    fn extend<'a>(&'a self, _: LeaseRef<'a>) -> BoxFuture<'a, Result<Extended>> {
        unreachable!("the driver extends in batches")
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        self.memory.release(lease)
    }

    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, Result<u32>> {
        self.memory.in_use(lock)
    }

    fn extend_many<'a>(
        &'a self,
        leases: &'a [LeaseRef<'a>],
    ) -> BoxFuture<'a, Vec<Result<Extended>>> {
        self.batches.lock().unwrap().push(leases.len());
        match self.extends.load(Ordering::SeqCst) {
            ANSWER => self.memory.extend_many(leases),
            FAIL => Box::pin(async move {
                let timeout = || Err(Error::Timeout(Duration::from_millis(1)));
                leases.iter().map(|_| timeout()).collect()
            }),
            HANG => Box::pin(std::future::pending()),
            _ => Box::pin(async move { leases.iter().map(|_| Ok(Extended::Gone)).collect() }),
        }
    }
}

fn scripted() -> (Arc<Scripted>, Store) {
    let backend = Arc::new(Scripted::default());
    (backend.clone(), Store::from_backend(backend))
}

/// Acquires `name` now and enrols it in `heartbeat` at once, as a body holding the lease does.
async fn hold(store: &Store, heartbeat: &Heartbeat, name: &str) -> KeptLease {
    let sent_at = Instant::now();
    let name = Cow::Owned(name.as_bytes().to_vec());
    let held = match RawLease::acquire(store.clone(), LOCK.definition(), Mode::Exclusive, name)
        .await
        .unwrap()
    {
        Attempt::Acquired(held) => held,
        Attempt::Busy { .. } => panic!("free at first"),
    };
    let timing = HeartbeatTiming {
        every: EVERY,
        max_hold: None,
    };
    let mut guard = KeptLease::new(held, sent_at, timing);
    guard.enrol_now(heartbeat);
    guard
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

#[tokio::test(start_paused = true)]
async fn leases_due_at_nearby_moments_share_one_task_and_one_call_per_beat() {
    let (backend, store) = scripted();
    let heartbeat = Heartbeat::default();
    let mut guards = Vec::new();
    // 100 leases taken 1 ms apart: their first beats spread over 100 ms.
    for i in 0..100 {
        guards.push(hold(&store, &heartbeat, &format!("n{i}")).await);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(alive_tasks(), 1, "one driver, not a task per lease");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(guards.iter().all(|g| g.valid_at(Instant::now())));

    let batches = backend.batches.lock().unwrap().clone();
    let extends: usize = batches.iter().sum();
    // About 30 beats of 100 leases; sending a little early may add a few.
    assert!((2_900..=3_600).contains(&extends), "{extends} extends");
    // The first beat gathers an eighth of a beat's worth (13 leases); the groups stay
    // together after that, so about 8 calls per beat instead of 100.
    assert!(batches.len() * 8 <= extends, "{} calls", batches.len());

    for guard in guards {
        guard.release().await;
    }
    tokio::task::yield_now().await;
    assert_eq!(alive_tasks(), 0, "the driver ends with its last lease");
    let calls = backend.batches.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        backend.batches.lock().unwrap().len(),
        calls,
        "no extend after release"
    );

    // And it starts again on demand.
    let guard = hold(&store, &heartbeat, "again").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(guard.valid_at(Instant::now()));
    assert_eq!(alive_tasks(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_hung_store_loses_the_lease_at_its_expiry_not_later() {
    let (backend, store) = scripted();
    let heartbeat = Heartbeat::default();
    let started = Instant::now();
    let guard = hold(&store, &heartbeat, "hung").await;
    backend.extends.store(HANG, Ordering::SeqCst);
    guard.lease().lost().await;
    // The extend sent at 100 ms never answers; the lease ends at 300 − (3 + 2) ms.
    assert_eq!(started.elapsed(), Duration::from_millis(295));
    assert!(!guard.valid_at(Instant::now()));
}

#[tokio::test(start_paused = true)]
async fn errors_are_retried_until_the_lease_expires() {
    let (backend, store) = scripted();
    let heartbeat = Heartbeat::default();
    let started = Instant::now();
    let kept = hold(&store, &heartbeat, "kept").await;
    backend.extends.store(FAIL, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let failed = backend.batches.lock().unwrap().len();
    assert!(failed >= 4, "retried with a short backoff: {failed} calls");
    backend.extends.store(ANSWER, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(kept.valid_at(Instant::now()), "a retry got through in time");

    // Failing for good: lost at the expiry of the last confirmed extend, not after.
    backend.extends.store(FAIL, Ordering::SeqCst);
    let last = backend.batches.lock().unwrap().len();
    kept.lease().lost().await;
    let now = Instant::now();
    assert!(backend.batches.lock().unwrap().len() > last);
    assert_eq!(
        now,
        kept.state().valid_until(),
        "lost at its expiry ({:?} in)",
        started.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(alive_tasks(), 0, "nothing left to extend");
}

#[tokio::test(start_paused = true)]
async fn a_lease_the_store_no_longer_holds_is_lost_at_the_beat() {
    let (backend, store) = scripted();
    let heartbeat = Heartbeat::default();
    let started = Instant::now();
    let gone = hold(&store, &heartbeat, "gone").await;
    let other = hold(&store, &heartbeat, "other").await;
    backend.extends.store(GONE, Ordering::SeqCst);
    gone.lease().lost().await;
    assert_eq!(started.elapsed(), EVERY);
    assert!(
        !other.valid_at(Instant::now()),
        "the store answered false for both"
    );
}
