//! A reader's or a permit's live release (`Backend::release_live`), which sends plain commands
//! instead of a script: `ZREM` pipelined with `EXISTS` of the waiter's mark, and the `PUBLISH`
//! in a second trip only when the mark was there. A waiter in another store is woken within the
//! bound whichever order its mark and the release come in; nobody waiting, nothing is published.

use std::time::{Duration, Instant};

use tower_lease::backend::{Acquisition, LeaseRef, LockRef, Mode, Secret};
use tower_lease::{RedisStore, RwLock, Semaphore, Store};

use tower_lease_harness::RedisServer;
use tower_lease_harness::server::{Endpoint, commandstats};

use super::publishes::{channel, heard, publishes, subscriber};

/// Long enough that only a notification hands the name over within the test: a waiter's own
/// wake-up at the holder's lease end is 10 s away.
const LONG: Duration = Duration::from_secs(10);

/// Well under a waiter's next poll, with room for a loaded 2-core machine.
const WOKEN_WITHIN: Duration = Duration::from_millis(500);

/// How long after the release a waiter in another store got the name.
async fn woken_after(
    release: impl std::future::Future<Output = bool>,
    waiter: tokio::task::JoinHandle<Instant>,
) -> Duration {
    // The waiter's refused attempt marks the name before it waits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert!(release.await);
    let acquired = waiter.await.unwrap();
    acquired.saturating_duration_since(released)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_release_wakes_a_waiter_in_another_store_within_the_bound() {
    let server = RedisServer::start();
    let holder: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let waiter: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let wait = Duration::from_secs(8);

    let permits: Semaphore<str> = Semaphore::new("live-sem", 1, LONG);
    let permit = permits.try_acquire(&holder, "n").await.unwrap().unwrap();
    let store = waiter.clone();
    let waiting = tokio::spawn(async move {
        let permit = permits.try_acquire_for(&store, "n", wait).await.unwrap();
        let acquired = Instant::now();
        assert!(
            permit
                .expect("the waiter got a permit")
                .release()
                .await
                .unwrap()
        );
        acquired
    });
    let after = woken_after(async { permit.release().await.unwrap() }, waiting).await;
    assert!(
        after < WOKEN_WITHIN,
        "a permit's waiter got it {after:?} after the release"
    );

    let rw: RwLock<str> = RwLock::new("live-rw", LONG);
    let read = rw.try_read(&holder, "n").await.unwrap().unwrap();
    let store = waiter.clone();
    let waiting = tokio::spawn(async move {
        let write = rw.try_write_for(&store, "n", wait).await.unwrap();
        let acquired = Instant::now();
        assert!(
            write
                .expect("the writer got the lock")
                .release()
                .await
                .unwrap()
        );
        acquired
    });
    let after = woken_after(async { read.release().await.unwrap() }, waiting).await;
    assert!(
        after < WOKEN_WITHIN,
        "a writer got the lock {after:?} after the last read's release"
    );
}

fn lease<'a>(lock: LockRef<'a>, mode: Mode, secret: &'a Secret) -> LeaseRef<'a> {
    LeaseRef::new(lock, mode, secret)
}

/// The orders a waiter's mark and a live release can come in, driven through `Backend` calls
/// and a raw subscriber: marked before the release, published; no mark, nothing published (and
/// an attempt after the release finds the name free); a release of a lease already gone answers
/// `false`.
#[tokio::test]
async fn a_live_release_publishes_only_for_a_mark_made_before_it() {
    let server = RedisServer::start();
    let raw = server.connection().await;
    let store: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let backend = store.backend();
    let sem = LockRef::new("live-order-sem", b"a", LONG).permits(1);
    let rw = LockRef::new("live-order-rw", b"a", LONG);
    for (lock, mode, blocked) in [
        (sem, Mode::Permit, Mode::Permit),
        (rw, Mode::Read, Mode::Write),
    ] {
        let mut pubsub = subscriber(&server, channel(mode, lock.namespace, lock.name)).await;
        let (holder, waiter) = (Secret::random(), Secret::queued());

        // Nobody waiting: released, nothing published.
        let taken = backend.acquire(lease(lock, mode, &holder)).await.unwrap();
        assert!(matches!(taken, Acquisition::Acquired { .. }), "{taken:?}");
        let before = commandstats(&raw).await;
        assert!(
            backend
                .release_live(lease(lock, mode, &holder))
                .await
                .unwrap()
        );
        let published = publishes(&commandstats(&raw).await) - publishes(&before);
        assert_eq!(
            published, 0,
            "{mode:?}: a live release with nobody waiting published"
        );

        // A waiting attempt after that release finds the name free: it needs no message.
        let after = backend
            .acquire(lease(lock, blocked, &waiter).waiting())
            .await
            .unwrap();
        assert!(matches!(after, Acquisition::Acquired { .. }), "{after:?}");
        assert!(
            backend
                .release(lease(lock, blocked, &waiter))
                .await
                .unwrap()
        );

        // Gone already: `false`.
        assert!(
            !backend
                .release_live(lease(lock, mode, &holder))
                .await
                .unwrap()
        );

        // Marked by a waiting refusal before the release: published.
        let taken = backend.acquire(lease(lock, mode, &holder)).await.unwrap();
        assert!(matches!(taken, Acquisition::Acquired { .. }), "{taken:?}");
        let refused = backend
            .acquire(lease(lock, blocked, &waiter).waiting())
            .await
            .unwrap();
        assert!(matches!(refused, Acquisition::Busy { .. }), "{refused:?}");
        // A refused writer that leaves an intent says so on the channel: drained first.
        while heard(&mut pubsub, Duration::from_millis(50)).await {}
        assert!(
            backend
                .release_live(lease(lock, mode, &holder))
                .await
                .unwrap()
        );
        assert!(
            heard(&mut pubsub, Duration::from_secs(1)).await,
            "{mode:?}: a live release after a waiting refusal publishes"
        );
        let taken = backend
            .acquire(lease(lock, blocked, &waiter).waiting())
            .await
            .unwrap();
        assert!(matches!(taken, Acquisition::Acquired { .. }), "{taken:?}");
        assert!(
            backend
                .release(lease(lock, blocked, &waiter))
                .await
                .unwrap()
        );
    }
}

/// A reader released live while another live reader remains and a writer waits publishes all
/// the same (without a script the release cannot ask the server's clock whether the reader left
/// is live): the writer's attempt is refused again and marks again, and the last reader's
/// release wakes it for good.
#[tokio::test]
async fn a_reader_released_beside_a_live_one_wakes_the_writer_spuriously_and_the_last_for_good() {
    let server = RedisServer::start();
    let store: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let backend = store.backend();
    let rw = LockRef::new("live-spurious", b"a", LONG);
    let mut pubsub = subscriber(&server, channel(Mode::Read, "live-spurious", b"a")).await;
    let (first, second, writer) = (Secret::random(), Secret::random(), Secret::queued());
    for reader in [&first, &second] {
        let taken = backend
            .acquire(lease(rw, Mode::Read, reader))
            .await
            .unwrap();
        assert!(matches!(taken, Acquisition::Acquired { .. }), "{taken:?}");
    }
    let refused = backend
        .acquire(lease(rw, Mode::Write, &writer).waiting())
        .await
        .unwrap();
    assert!(matches!(refused, Acquisition::Busy { .. }), "{refused:?}");
    while heard(&mut pubsub, Duration::from_millis(50)).await {}

    assert!(
        backend
            .release_live(lease(rw, Mode::Read, &first))
            .await
            .unwrap()
    );
    assert!(
        heard(&mut pubsub, Duration::from_secs(1)).await,
        "the chosen behaviour: a marked reader's release publishes even with a live reader left"
    );
    let refused = backend
        .acquire(lease(rw, Mode::Write, &writer).waiting())
        .await
        .unwrap();
    assert!(matches!(refused, Acquisition::Busy { .. }), "{refused:?}");
    while heard(&mut pubsub, Duration::from_millis(50)).await {}

    assert!(
        backend
            .release_live(lease(rw, Mode::Read, &second))
            .await
            .unwrap()
    );
    assert!(
        heard(&mut pubsub, Duration::from_secs(1)).await,
        "the last reader's release wakes the writer"
    );
    let taken = backend
        .acquire(lease(rw, Mode::Write, &writer).waiting())
        .await
        .unwrap();
    assert!(matches!(taken, Acquisition::Acquired { .. }), "{taken:?}");
    assert!(
        backend
            .release(lease(rw, Mode::Write, &writer))
            .await
            .unwrap()
    );
}
