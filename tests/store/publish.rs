//! Releases that tell only those who wait (issue 47): a `Lock` or permit release publishes on
//! its channel only when a waiting caller marked the name, and a waiter that marks after the
//! release looked for a mark still learns of it. On a single Redis (whichever server
//! `TOWER_LEASE_SERVER` names: on Valkey 9 the `Lock` releases with `DELIFEQ`) and the local
//! cluster (`SPUBLISH`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Notify, mpsc};
use tower_lease::backend::{
    Acquisition, Backend, BoxFuture, Extended, LeaseRef, LockRef, Mode, NotificationSink, Warning,
};
use tower_lease::{Lock, RedisStore, Semaphore, Store};
use tower_lease_harness::{Backing, Endpoint, RedisServer};

const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(5));
const FENCED: Lock<str> = Lock::new("fenced", Duration::from_secs(5)).fenced();
const POOL: Semaphore<str> = Semaphore::new("pool", 2, Duration::from_secs(5));

tower_lease_harness::store_tests!(
    Core: [],
    redis: [
        cycles_with_nobody_waiting_publish_nothing,
        refusals_of_callers_that_do_not_wait_publish_nothing,
        a_waiter_elsewhere_is_told_by_one_publish,
        a_permit_waiter_elsewhere_is_told_by_one_publish,
    ]
);

/// `PUBLISH` and `SPUBLISH` calls on every server behind `env`, scripts' own included.
async fn publishes(env: &Backing) -> u64 {
    let raw = env.raw();
    raw.command_calls("publish").await + raw.command_calls("spublish").await
}

/// 200 cycles of each kind on a name nobody waits for: not one publish (before issue 47, every
/// release published: 200 for each kind).
async fn cycles_with_nobody_waiting_publish_nothing(env: Backing) {
    let before = publishes(&env).await;
    for i in 0..200 {
        let name = format!("quiet-{}", i % 7);
        let token = JOBS.try_lock(&env.store, &name).await.unwrap().unwrap();
        assert!(token.release().await.unwrap());
        let token = FENCED.try_lock(&env.store, &name).await.unwrap().unwrap();
        assert!(token.release().await.unwrap());
        let permit = POOL.try_acquire(&env.store, &name).await.unwrap().unwrap();
        assert!(permit.release().await.unwrap());
    }
    let published = publishes(&env).await - before;
    assert_eq!(published, 0, "publishes in 600 cycles with nobody waiting");
}

/// A refused `try_lock` (which does not wait) leaves no mark: the release after it publishes
/// nothing.
async fn refusals_of_callers_that_do_not_wait_publish_nothing(env: Backing) {
    let elsewhere = env.notified().await.expect("a second store");
    let holder = JOBS.try_lock(&env.store, "r").await.unwrap().unwrap();
    let permits = [
        POOL.try_acquire(&env.store, "r").await.unwrap().unwrap(),
        POOL.try_acquire(&env.store, "r").await.unwrap().unwrap(),
    ];
    for _ in 0..5 {
        assert!(JOBS.try_lock(&elsewhere, "r").await.unwrap().is_none());
        assert!(POOL.try_acquire(&elsewhere, "r").await.unwrap().is_none());
    }
    let before = publishes(&env).await;
    assert!(holder.release().await.unwrap());
    for permit in permits {
        assert!(permit.release().await.unwrap());
    }
    assert_eq!(publishes(&env).await - before, 0);
}

/// A waiter in another store (as in another process) waits for a `Lock` held here: the
/// release publishes (once), and the waiter gets the lock at once, not at a poll.
async fn a_waiter_elsewhere_is_told_by_one_publish(env: Backing) {
    // Both made as `connect` makes a process's store: on a cluster, a store of `new` publishes
    // with `PUBLISH`, which `connect_cluster`'s `SSUBSCRIBE` does not hear.
    let here = env.notified().await.expect("a store");
    let elsewhere = env.notified().await.expect("a second store");
    for lock in [JOBS, FENCED] {
        let holder = lock.try_lock(&here, "w").await.unwrap().unwrap();
        let waiter = tokio::spawn({
            let store = elsewhere.clone();
            async move {
                let token = lock.try_lock_for(&store, "w", Duration::from_secs(4)).await;
                (token, Instant::now())
            }
        });
        // Refused, subscribed, refused again and marked; then sleeping on the notification (its
        // safety poll is 1 s, the holder's lease 5 s).
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = publishes(&env).await;
        let released = Instant::now();
        assert!(holder.release().await.unwrap());
        let (token, acquired) = waiter.await.unwrap();
        let handed_off = acquired - released;
        assert!(
            handed_off < Duration::from_millis(200),
            "handed off after {handed_off:?}"
        );
        assert_eq!(publishes(&env).await - before, 1, "the release published");
        let token = token.unwrap().expect("the waiter got the lock");
        // The mark went with the publish: the next release, with nobody waiting, is quiet.
        let before = publishes(&env).await;
        assert!(token.release().await.unwrap());
        assert_eq!(publishes(&env).await - before, 0);
    }
}

/// The same for a full semaphore: the permit's release publishes once and wakes the waiter.
async fn a_permit_waiter_elsewhere_is_told_by_one_publish(env: Backing) {
    let here = env.notified().await.expect("a store");
    let elsewhere = env.notified().await.expect("a second store");
    let first = POOL.try_acquire(&here, "p").await.unwrap().unwrap();
    let second = POOL.try_acquire(&here, "p").await.unwrap().unwrap();
    let waiter = tokio::spawn(async move {
        let permit = POOL
            .try_acquire_for(&elsewhere, "p", Duration::from_secs(4))
            .await;
        (permit, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = publishes(&env).await;
    let released = Instant::now();
    assert!(first.release().await.unwrap());
    let (permit, acquired) = waiter.await.unwrap();
    let handed_off = acquired - released;
    assert!(
        handed_off < Duration::from_millis(200),
        "handed off after {handed_off:?}"
    );
    assert_eq!(publishes(&env).await - before, 1, "the release published");
    let permit = permit.unwrap().expect("the waiter got a permit");
    let before = publishes(&env).await;
    assert!(permit.release().await.unwrap());
    assert!(second.release().await.unwrap());
    assert_eq!(publishes(&env).await - before, 0);
}

/// A backend that holds back the answer of its first refused acquisition until the test says
/// go, and forwards everything else (release notifications included) to `inner`.
struct Paused<B> {
    inner: B,
    refused: mpsc::UnboundedSender<()>,
    go: Arc<Notify>,
    held_back: std::sync::atomic::AtomicBool,
}

impl<B: Backend> Backend for Paused<B> {
    fn acquire<'a>(
        &'a self,
        lease: LeaseRef<'a>,
    ) -> BoxFuture<'a, tower_lease::Result<Acquisition>> {
        Box::pin(async move {
            let answer = self.inner.acquire(lease).await?;
            if matches!(answer, Acquisition::Busy { .. })
                && !self
                    .held_back
                    .swap(true, std::sync::atomic::Ordering::SeqCst)
            {
                let go = self.go.notified();
                let _ = self.refused.send(());
                go.await;
            }
            Ok(answer)
        })
    }

    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, tower_lease::Result<Extended>> {
        self.inner.extend(lease)
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, tower_lease::Result<bool>> {
        self.inner.release(lease)
    }

    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, tower_lease::Result<u32>> {
        self.inner.in_use(lock)
    }

    fn notify_to(&self, sink: NotificationSink) -> bool {
        self.inner.notify_to(sink)
    }

    fn watch<'a>(
        &'a self,
        mode: Mode,
        namespace: &'a str,
        name: &'a [u8],
    ) -> BoxFuture<'a, tower_lease::Result<()>> {
        self.inner.watch(mode, namespace, name)
    }

    fn unwatch(&self, mode: Mode, namespace: &str, name: &[u8]) {
        self.inner.unwatch(mode, namespace, name)
    }

    fn check(&self) -> BoxFuture<'_, tower_lease::Result<Vec<Warning>>> {
        self.inner.check()
    }
}

/// The order that would lose a wake-up, driven by hand: the waiter's attempt is refused, then
/// the holder releases and finds no mark (so it publishes nothing), and only then does the
/// waiter go on (subscribe, mark). It must still get the lock at once, not at its safety poll
/// (1 s) or the holder's lease end (5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_between_the_refusal_and_the_mark_still_wakes_the_waiter() {
    let server = RedisServer::start();
    let raw = server.connection().await;
    let calls = |raw: redis::aio::MultiplexedConnection| async move {
        let stats = tower_lease_harness::server::commandstats(&raw).await;
        tower_lease_harness::server::calls(&stats, "publish")
    };
    let holder_replica: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    for (kind, round) in [("lock", 0), ("permit", 1)] {
        let (refused, mut told) = mpsc::unbounded_channel();
        let go = Arc::new(Notify::new());
        let waiter_replica = Store::from_backend(Paused {
            inner: RedisStore::connect(&server.url()).await.unwrap(),
            refused,
            go: go.clone(),
            held_back: false.into(),
        });
        let name = format!("interleaved-{round}");
        let (lock_holder, permit_holders) = if kind == "lock" {
            (
                Some(
                    JOBS.try_lock(&holder_replica, &name)
                        .await
                        .unwrap()
                        .unwrap(),
                ),
                Vec::new(),
            )
        } else {
            let mut permits = Vec::new();
            for _ in 0..2 {
                permits.push(
                    POOL.try_acquire(&holder_replica, &name)
                        .await
                        .unwrap()
                        .unwrap(),
                );
            }
            (None, permits)
        };
        let waiter = tokio::spawn({
            let name = name.clone();
            async move {
                let wait = Duration::from_secs(4);
                let got = if kind == "lock" {
                    JOBS.try_lock_for(&waiter_replica, &name, wait)
                        .await
                        .unwrap()
                        .is_some()
                } else {
                    POOL.try_acquire_for(&waiter_replica, &name, wait)
                        .await
                        .unwrap()
                        .is_some()
                };
                (got, Instant::now())
            }
        });
        // 1. The waiter's attempt was refused (its answer is held back).
        told.recv().await.unwrap();
        // 2. The release finds no mark: it publishes nothing.
        let before = calls(raw.clone()).await;
        if let Some(holder) = lock_holder {
            assert!(holder.release().await.unwrap());
        }
        let mut permit_holders = permit_holders.into_iter();
        if let Some(permit) = permit_holders.next() {
            assert!(permit.release().await.unwrap());
        }
        assert_eq!(
            calls(raw.clone()).await - before,
            0,
            "{kind}: a release with nobody marked published"
        );
        // 3. The waiter goes on: it marks, and learns of the release.
        let went_on = Instant::now();
        go.notify_one();
        let (got, acquired) = waiter.await.unwrap();
        assert!(got, "{kind}: the waiter got it");
        let handed_off = acquired - went_on;
        assert!(
            handed_off < Duration::from_millis(300),
            "{kind}: acquired {handed_off:?} after the waiter went on"
        );
        for permit in permit_holders {
            assert!(permit.release().await.unwrap());
        }
    }
}
