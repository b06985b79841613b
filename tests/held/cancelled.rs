//! A release whose future is dropped after its first poll (a `select!` whose shutdown branch
//! won, a timeout) still releases: the call runs to its end in the background, and the name is
//! free at once rather than after its TTL. On a single server, the cluster and in memory, on a
//! current-thread runtime: there the connection's task cannot send the command before the
//! future is dropped, so a release that did not go on by itself would never leave.

use std::time::Duration;

use tower_lease::{Lock, RwLock, Semaphore, Store};

use tower_lease_harness::{Backing, Setup, poll};

/// Far longer than the test: only a release frees the name in time.
const TTL: Duration = Duration::from_secs(10);
const JOB: Lock<str> = Lock::new("cancelled-job", TTL);
const DOCS: RwLock<str> = RwLock::new("cancelled-docs", TTL);
const SLOTS: Semaphore<str> = Semaphore::new("cancelled-slots", 1, TTL);

/// How soon the name must be free again.
const SOON: Duration = Duration::from_secs(1);

macro_rules! on_every_store {
    ($($name:ident),* $(,)?) => {
        mod on_redis {
            $(
                #[tokio::test(flavor = "current_thread")]
                async fn $name() {
                    super::$name(tower_lease_harness::Backing::redis(super::Setup::Layer).await).await
                }
            )*
        }

        #[cfg(feature = "cluster")]
        mod on_cluster {
            $(
                #[tokio::test(flavor = "current_thread")]
                async fn $name() {
                    super::$name(tower_lease_harness::Backing::cluster(super::Setup::Layer).await).await
                }
            )*
        }

        mod on_memory {
            $(
                #[tokio::test(flavor = "current_thread")]
                async fn $name() {
                    super::$name(tower_lease_harness::Backing::memory()).await
                }
            )*
        }
    };
}

on_every_store!(
    a_cancelled_release_of_a_held_lease_frees_the_name_at_once,
    a_cancelled_release_of_a_token_frees_the_name_at_once,
    a_cancelled_release_of_a_reader_lets_the_writer_in_at_once,
    a_cancelled_release_of_a_permit_frees_it_at_once,
);

/// Polls `release` once, then drops it, as a `select!` does whose shutdown branch is ready.
async fn cancel_after_first_poll<T>(release: impl Future<Output = T>) {
    let shutdown = std::future::ready(());
    tokio::select! {
        biased;
        _ = release => {}
        () = shutdown => {}
    }
}

/// Another store on the same Redis (another process, as it were); in memory the same store.
async fn elsewhere(env: &Backing) -> Store {
    env.notified().await.unwrap_or_else(|| env.store.clone())
}

/// Answers once `acquire` gets in, or panics after [`SOON`].
async fn soon<T, Fut>(what: &str, acquire: impl FnMut() -> Fut) -> T
where
    Fut: Future<Output = Option<T>>,
{
    let started = tokio::time::Instant::now();
    let got = poll(Duration::from_millis(10), SOON, acquire).await;
    let waited = started.elapsed();
    got.unwrap_or_else(|| panic!("{what} was still taken {waited:?} after the cancelled release"))
        .0
}

async fn a_cancelled_release_of_a_held_lease_frees_the_name_at_once(env: Backing) {
    let token = JOB.try_lock(&env.store, "a").await.unwrap().unwrap();
    cancel_after_first_poll(token.keep_alive().release()).await;
    let other = elsewhere(&env).await;
    let next = soon("the lock", || async {
        JOB.try_lock(&other, "a").await.unwrap()
    })
    .await;
    assert!(next.release().await.unwrap());
}

async fn a_cancelled_release_of_a_token_frees_the_name_at_once(env: Backing) {
    let token = JOB.try_lock(&env.store, "b").await.unwrap().unwrap();
    cancel_after_first_poll(token.release()).await;
    let other = elsewhere(&env).await;
    let next = soon("the lock", || async {
        JOB.try_lock(&other, "b").await.unwrap()
    })
    .await;
    assert!(next.release().await.unwrap());
}

async fn a_cancelled_release_of_a_reader_lets_the_writer_in_at_once(env: Backing) {
    let reader = DOCS.try_read(&env.store, "c").await.unwrap().unwrap();
    cancel_after_first_poll(reader.release()).await;
    let other = elsewhere(&env).await;
    let writer = soon("the reader's lease", || async {
        DOCS.try_write(&other, "c").await.unwrap()
    })
    .await;
    assert!(writer.release().await.unwrap());
}

async fn a_cancelled_release_of_a_permit_frees_it_at_once(env: Backing) {
    let permit = SLOTS.try_acquire(&env.store, "d").await.unwrap().unwrap();
    let held = permit.keep_alive();
    cancel_after_first_poll(held.release()).await;
    let other = elsewhere(&env).await;
    let next = soon("the permit", || async {
        SLOTS.try_acquire(&other, "d").await.unwrap()
    })
    .await;
    assert!(next.release().await.unwrap());
}
