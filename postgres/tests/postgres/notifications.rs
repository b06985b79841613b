//! Release notifications across processes: a waiter in one store is woken by a release in
//! another (`LISTEN`/`NOTIFY`), rather than polling, also after its listening connection was
//! terminated; two waiters in two other stores are both woken, one release each; and a release
//! nobody waited for sends no `NOTIFY`.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tower_lease::backend::BoxFuture;
use tower_lease::{Lock, Semaphore, Store};

const JOBS: Lock<str> = Lock::new("notified", Duration::from_secs(5));
const SLOTS: Semaphore<str> = Semaphore::new("notified", 1, Duration::from_secs(5));
/// How long each of two waiters holds what it got: a waiter that heard no release would look
/// again only after a second (its fallback poll), well past it.
const HOLD: Duration = Duration::from_millis(300);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_elsewhere_wakes_the_waiter_here() {
    let server = support::server().await;
    let holder: Store = support::pg_store(&server).await.into();
    let acquisitions = Arc::new(AtomicUsize::new(0));
    let waiter = Store::from_backend(support::Counting {
        store: support::pg_store(&server).await,
        acquisitions: acquisitions.clone(),
    });

    let (looks, after) =
        support::wait_for_release(&JOBS, &holder, &waiter, &acquisitions, "a").await;
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
    let (looks, after) =
        support::wait_for_release(&JOBS, &holder, &waiter, &acquisitions, "b").await;
    assert!(
        looks <= 5,
        "the waiter polled after the reconnect: {looks} attempts"
    );
    assert!(
        after < Duration::from_millis(300),
        "woken {after:?} after the release"
    );
}

/// Two waiters in two stores other than the holder's, both refused: the first release wakes
/// both, one gets in and the other, refused again, must be woken by the next release (it
/// marked the name again), not by its fallback poll a second later.
async fn two_waiters_elsewhere<T, F, R>(acquire: F, release: R)
where
    T: Send + 'static,
    F: Fn(Store, &'static str) -> BoxFuture<'static, T> + Send + Sync + Clone + 'static,
    R: Fn(T) -> BoxFuture<'static, bool> + Send + Sync + Clone + 'static,
{
    let server = support::server().await;
    let holder: Store = support::pg_store(&server).await.into();
    let held = acquire(holder.clone(), "immediate").await;
    let mut waiting = Vec::new();
    for _ in 0..2 {
        let waiter: Store = support::pg_store(&server).await.into();
        let (acquire, release) = (acquire.clone(), release.clone());
        waiting.push(tokio::spawn(async move {
            let got = acquire(waiter, "waiting").await;
            let at = Instant::now();
            tokio::time::sleep(HOLD).await;
            let released = Instant::now();
            assert!(release(got).await);
            (at, released)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    assert!(release(held).await);
    let mut served = Vec::new();
    for waiter in waiting {
        served.push(waiter.await.unwrap());
    }
    served.sort();
    let [(first, first_released), (second, _)] = served[..] else {
        unreachable!()
    };
    let limit = Duration::from_millis(250);
    assert!(
        first - released < limit,
        "first woken {:?} after the release",
        first - released
    );
    assert!(
        second - first_released < limit,
        "second woken {:?} after the first's release",
        second - first_released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_lock_waiters_elsewhere_are_each_woken_by_a_release() {
    two_waiters_elsewhere(
        |store: Store, how: &'static str| -> BoxFuture<'static, _> {
            Box::pin(async move {
                let wait = if how == "immediate" {
                    Duration::ZERO
                } else {
                    Duration::from_secs(4)
                };
                JOBS.try_lock_for(&store, "two", wait)
                    .await
                    .unwrap()
                    .expect("acquired")
            })
        },
        |token| -> BoxFuture<'static, bool> {
            Box::pin(async move { token.release().await.unwrap() })
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_permit_waiters_elsewhere_are_each_woken_by_a_release() {
    two_waiters_elsewhere(
        |store: Store, how: &'static str| -> BoxFuture<'static, _> {
            Box::pin(async move {
                let wait = if how == "immediate" {
                    Duration::ZERO
                } else {
                    Duration::from_secs(4)
                };
                SLOTS
                    .try_acquire_for(&store, "two", wait)
                    .await
                    .unwrap()
                    .expect("acquired")
            })
        },
        |permit| -> BoxFuture<'static, bool> {
            Box::pin(async move { permit.release().await.unwrap() })
        },
    )
    .await;
}

/// The point of the marks: an uncontended cycle never notifies (a notifying commit takes a
/// database-wide lock); a contended one does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_release_someone_waited_for_notifies() {
    let server = support::server().await;
    let (client, mut connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    let heard = Arc::new(AtomicUsize::new(0));
    let counted = heard.clone();
    tokio::spawn(async move {
        use futures_util::StreamExt;
        let mut messages = futures_util::stream::poll_fn(|cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(_) = message {
                counted.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    client.batch_execute("LISTEN tower_lease").await.unwrap();
    let store: Store = support::pg_store(&server).await.into();
    for _ in 0..20 {
        let token = JOBS.try_lock(&store, "quiet").await.unwrap().expect("free");
        assert!(token.release().await.unwrap());
    }
    let permit = SLOTS
        .try_acquire(&store, "quiet")
        .await
        .unwrap()
        .expect("free");
    assert!(permit.release().await.unwrap());
    // A round trip on the listening connection: notifications committed before it are in.
    client.batch_execute("SELECT 1").await.unwrap();
    assert_eq!(
        heard.load(Ordering::SeqCst),
        0,
        "an uncontended release notified"
    );

    let token = JOBS.try_lock(&store, "quiet").await.unwrap().expect("free");
    let other: Store = support::pg_store(&server).await.into();
    assert!(JOBS.try_lock(&other, "quiet").await.unwrap().is_none());
    assert!(token.release().await.unwrap());
    client.batch_execute("SELECT 1").await.unwrap();
    assert_eq!(
        heard.load(Ordering::SeqCst),
        1,
        "the refused call's release"
    );
}
