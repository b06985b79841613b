//! A release made here comes back as a message when a waiter elsewhere marked the name: this
//! process's waiters wake on the release itself, once, and that message wakes none of them
//! again (a Redis release publishes its holder's secret, and the store that made it drops it).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tower_lease::backend::{
    Acquisition, Backend, BoxFuture, Extended, LeaseRef, LockRef, Mode, NotificationSink,
};
use tower_lease::{Lock, RedisStore, Result, Store};

use tower_lease_harness::proxy::{Fault, Proxy};
use tower_lease_harness::{Endpoint, RedisServer};

const JOBS: Lock<str> = Lock::new("echo", Duration::from_secs(5));

/// A `RedisStore` whose acquisitions are counted, the next one held back first when asked.
struct Counting {
    store: RedisStore<redis::aio::ConnectionManager>,
    acquisitions: Arc<AtomicUsize>,
    hold_next: Arc<AtomicBool>,
}

impl Backend for Counting {
    fn acquire<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Acquisition>> {
        Box::pin(async move {
            self.acquisitions.fetch_add(1, Ordering::SeqCst);
            if self.hold_next.swap(false, Ordering::SeqCst) {
                // Long enough for the waiter elsewhere to take the name first, and for the
                // release's own message to come back meanwhile.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            self.store.acquire(lease).await
        })
    }
    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Extended>> {
        self.store.extend(lease)
    }
    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        self.store.release(lease)
    }
    fn release_live<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        self.store.release_live(lease)
    }
    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, Result<u32>> {
        self.store.in_use(lock)
    }
    fn notify_to(&self, sink: NotificationSink) -> bool {
        self.store.notify_to(sink)
    }
    fn announces_every_release(&self) -> bool {
        self.store.announces_every_release()
    }
    fn delivers_own_releases(&self) -> bool {
        self.store.delivers_own_releases()
    }
    fn watch<'a>(&'a self, mode: Mode, ns: &'a str, name: &'a [u8]) -> BoxFuture<'a, Result<()>> {
        self.store.watch(mode, ns, name)
    }
    fn unwatch(&self, mode: Mode, ns: &str, name: &[u8]) {
        self.store.unwatch(mode, ns, name)
    }
    fn timeout(&self) -> Duration {
        Backend::timeout(&self.store)
    }
}

/// Here: a waiter gets the name from a holder, and a second one, queued behind it, inherits
/// the wait (it sends no attempt while the lease is this process's). Elsewhere: a waiter is
/// refused and marks the name, so the release here publishes. At the release, the waiter here
/// wakes and tries, but the one elsewhere gets in first (the attempt here is held back
/// 100 ms), and the release's own message comes back meanwhile. It gets in when the one
/// elsewhere releases: three attempts here from the holder's release on (the first waiter's,
/// the second's refused one, and its last), each release waking a waiter here once, whether
/// it comes as the release here or as its message. The messages here come through a proxy
/// that delays them 50 ms, so that a release's own one comes back after the waiters here were
/// woken by the release itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_release_here_wakes_a_waiter_here_once() {
    let server = RedisServer::start();
    let (acquisitions, hold_next) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicBool::new(false)),
    );
    let proxy = Proxy::to(&server).await;
    proxy.set(Fault::Delay(Duration::from_millis(50)));
    let subscriber = redis::Client::open(format!("redis://{}/", proxy.addr())).unwrap();
    let here = Store::from_backend(Counting {
        store: RedisStore::new(server.connection_manager().await).notifications(subscriber),
        acquisitions: acquisitions.clone(),
        hold_next: hold_next.clone(),
    });
    let elsewhere: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let wait = Duration::from_secs(5);
    let waiter = |store: &Store| {
        let store = store.clone();
        tokio::spawn(async move { JOBS.try_lock_for(&store, "n", wait).await.unwrap() })
    };

    let holder = JOBS.try_lock(&here, "n").await.unwrap().unwrap();
    let first = waiter(&here);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = waiter(&here);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = acquisitions.load(Ordering::SeqCst);
    assert!(holder.release().await.unwrap());
    let first = first.await.unwrap().expect("the first waiter here got in");
    let other = waiter(&elsewhere);
    tokio::time::sleep(Duration::from_millis(300)).await;
    hold_next.store(true, Ordering::SeqCst);
    assert!(first.release().await.unwrap());

    let other = other.await.unwrap().expect("the waiter elsewhere got in");
    // The attempt here (held back), and the message's wake-up, if any: both done by now.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(other.release().await.unwrap());
    let second = second.await.unwrap();
    let attempts = acquisitions.load(Ordering::SeqCst) - before;
    assert!(
        second
            .expect("the second waiter here got in")
            .release()
            .await
            .unwrap()
    );
    assert_eq!(
        attempts, 3,
        "{attempts} attempts here for two waiters served after two releases and a refusal"
    );
}
