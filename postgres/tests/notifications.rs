//! Release notifications across processes: a waiter in one store is woken by a release in
//! another (`LISTEN`/`NOTIFY`), rather than polling, also after its listening connection was
//! terminated.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tower_lease::backend::{
    Acquisition, Backend, BoxFuture, Extended, LeaseRef, LockRef, Mode, NotificationSink,
};
use tower_lease::{Lock, Result, Store};
use tower_lease_postgres::PgStore;

const JOBS: Lock<str> = Lock::new("notified", Duration::from_secs(5));
/// How long the waiter waits before the release: polling (5 ms, backing off to 100 ms) would
/// attempt about twenty times in it.
const WAIT: Duration = Duration::from_millis(1500);

/// A `PgStore` that counts its acquisitions: how often a waiter looked.
struct Counting {
    store: PgStore,
    acquisitions: Arc<AtomicUsize>,
}

impl Backend for Counting {
    fn acquire<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Acquisition>> {
        self.acquisitions.fetch_add(1, Ordering::SeqCst);
        self.store.acquire(lease)
    }
    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Extended>> {
        self.store.extend(lease)
    }
    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        self.store.release(lease)
    }
    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, Result<u32>> {
        self.store.in_use(lock)
    }
    fn notify_to(&self, sink: NotificationSink) -> bool {
        self.store.notify_to(sink)
    }
    fn watch<'a>(&'a self, mode: Mode, ns: &'a str, name: &'a [u8]) -> BoxFuture<'a, Result<()>> {
        self.store.watch(mode, ns, name)
    }
    fn timeout(&self) -> Duration {
        Backend::timeout(&self.store)
    }
}

/// Holds `name` in `holder`, lets `waiter` wait for it for [`WAIT`], releases it: answers how
/// many times the waiter looked, and how long after the release it got the lock.
async fn wait_for_release(
    holder: &Store,
    waiter: &Store,
    looks: &AtomicUsize,
    name: &str,
) -> (usize, Duration) {
    let held = JOBS.try_lock(holder, name).await.unwrap().expect("free");
    let before = looks.load(Ordering::SeqCst);
    let waiting = {
        let (waiter, name) = (waiter.clone(), name.to_owned());
        tokio::spawn(async move {
            let token = JOBS.try_lock_for(&waiter, &name, WAIT * 3).await.unwrap();
            (Instant::now(), token.expect("acquired once released"))
        })
    };
    tokio::time::sleep(WAIT).await;
    let released = Instant::now();
    assert!(held.release().await.unwrap());
    let (got, token) = waiting.await.unwrap();
    assert!(token.release().await.unwrap());
    (looks.load(Ordering::SeqCst) - before, got - released)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_elsewhere_wakes_the_waiter_here() {
    let server = support::server().await;
    let holder: Store = support::pg_store(&server).await.into();
    let acquisitions = Arc::new(AtomicUsize::new(0));
    let waiter = Store::from_backend(Counting {
        store: support::pg_store(&server).await,
        acquisitions: acquisitions.clone(),
    });

    let (looks, after) = wait_for_release(&holder, &waiter, &acquisitions, "a").await;
    // The first attempt, a look once watching, the woken one; a fallback look a second.
    assert!(looks <= 5, "the waiter polled: {looks} attempts");
    assert!(
        after < Duration::from_millis(300),
        "woken {after:?} after the release"
    );

    // The listener's connection terminated (with every other): it listens again, and says
    // it may have missed something meanwhile.
    let killed: i64 = support::client(&server.url())
        .await
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(killed >= 2);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (looks, after) = wait_for_release(&holder, &waiter, &acquisitions, "b").await;
    assert!(
        looks <= 5,
        "the waiter polled after the reconnect: {looks} attempts"
    );
    assert!(
        after < Duration::from_millis(300),
        "woken {after:?} after the release"
    );
}
