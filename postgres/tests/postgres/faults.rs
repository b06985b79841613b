//! Faults of the server under a `PgStore`: PostgreSQL restarted (killed and recovered), the
//! store's backends terminated, PostgreSQL paused (`SIGSTOP`) past the deadline. Calls answer
//! an error within the store's timeout (and a margin a loaded machine keeps), no lease is
//! left held by a call that failed, and the first call once the server is back succeeds.

use crate::support;

use std::time::Duration;

use tokio::time::Instant;
use tower_lease::{Error, Lock, Store};
use tower_lease_postgres::PgStore;

use support::{MARGIN, live_leases};

const TIMEOUT: Duration = Duration::from_millis(300);
/// Long, so a lease a failed call took would still be held when the test looks.
const JOBS: Lock<str> = Lock::new("faults", Duration::from_secs(20)).fenced();

async fn connect(url: &str) -> Store {
    PgStore::connect(url)
        .await
        .expect("connect")
        .timeout(TIMEOUT)
        .into()
}

/// One lock cycle, so the pool and the statement caches are warm.
async fn cycle(store: &Store, name: &str) {
    let token = JOBS.try_lock(store, name).await.unwrap().expect("free");
    assert!(token.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_fails_calls_within_the_deadline_and_keeps_its_leases() {
    let mut server = support::server().await;
    let url = server.url();
    let store = connect(&url).await;
    cycle(&store, "warm").await;
    let held = JOBS.try_lock(&store, "held").await.unwrap().expect("free");

    server.stop();
    let started = Instant::now();
    let refused = JOBS.try_lock(&store, "down").await;
    assert!(refused.is_err(), "{refused:?}");
    assert!(
        started.elapsed() < TIMEOUT + MARGIN,
        "{:?}",
        started.elapsed()
    );

    server.restart();
    let started = Instant::now();
    let token = JOBS.try_lock(&store, "down").await;
    let token = token
        .expect("the first call after the restart")
        .expect("free");
    assert!(started.elapsed() < TIMEOUT, "{:?}", started.elapsed());
    assert!(token.release().await.unwrap());
    // Committed before the crash: still held after it.
    let other = connect(&url).await;
    assert!(JOBS.try_lock(&other, "held").await.unwrap().is_none());
    assert!(held.release().await.unwrap());
    assert_eq!(live_leases(&url).await, 0, "a lease left held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_backends_cost_no_call() {
    let server = support::server().await;
    let url = server.url();
    let store = connect(&url).await;
    // Several connections in the pool: calls at once.
    let warm = (0..4).map(|i| {
        let store = store.clone();
        async move { cycle(&store, &format!("warm-{i}")).await }
    });
    futures_util::future::join_all(warm).await;

    for round in 0..3 {
        let killed: i64 = support::client(&url)
            .await
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        assert!(killed >= 1, "no backend of the store to terminate");
        // The first call after: sent again on a new connection, within its deadline.
        let name = format!("after-{round}");
        let token = JOBS.try_lock(&store, &name).await;
        let token = token
            .expect("the first call after the termination")
            .expect("free");
        assert!(token.release().await.unwrap());
    }
    assert_eq!(live_leases(&url).await, 0, "a lease left held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_times_calls_out_and_leaves_no_ghost() {
    let mut server = support::server().await;
    let url = server.url();
    let store = connect(&url).await;
    let warm = (0..4).map(|i| {
        let store = store.clone();
        async move { cycle(&store, &format!("name-{i}")).await }
    });
    futures_util::future::join_all(warm).await;
    let before = fences(&url).await;

    server.pause();
    let started = Instant::now();
    let attempts = (0..4).map(|i| {
        let store = store.clone();
        async move { JOBS.try_lock(&store, &format!("name-{i}")).await }
    });
    for attempt in futures_util::future::join_all(attempts).await {
        assert!(
            matches!(attempt, Err(Error::Timeout(_))),
            "{:?}",
            attempt.map(|t| t.is_some())
        );
    }
    assert!(
        started.elapsed() < TIMEOUT + MARGIN,
        "{:?}",
        started.elapsed()
    );
    // Paused well past the deadline, then back: the stalled acquisitions run now, and the
    // releases that give them back run after them, on their connections.
    tokio::time::sleep(TIMEOUT * 2).await;
    server.resume();

    let started = Instant::now();
    let token = JOBS.try_lock(&store, "fresh").await;
    let token = token
        .expect("the first call after the pause")
        .expect("free");
    assert!(started.elapsed() < TIMEOUT, "{:?}", started.elapsed());
    assert!(token.release().await.unwrap());
    // Every name free again long before its 20 s lease would have run out.
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left = live_leases(&url).await;
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} ghost leases held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The stalled acquisitions that were on the wire did run once the server was back (their
    // fences moved on), and were given back.
    let after = fences(&url).await;
    assert!(
        after
            .iter()
            .zip(&before)
            .any(|(after, before)| after > before),
        "no stalled acquisition ran: the test shows nothing ({before:?}, {after:?})"
    );
    for i in 0..4 {
        cycle(&store, &format!("name-{i}")).await;
    }
}

/// The fence counters of `name-0` to `name-3`.
async fn fences(url: &str) -> Vec<i64> {
    let client = support::client(url).await;
    let mut fences = Vec::new();
    for i in 0..4 {
        let name = format!("name-{i}").into_bytes();
        let row = client
            .query_one(
                "SELECT fence FROM tower_lease.locks WHERE namespace = 'faults' AND name = $1",
                &[&name],
            )
            .await
            .unwrap();
        fences.push(row.get(0));
    }
    fences
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_stalled_acquisition_runs_after_it() {
    use tower_lease::backend::{Acquisition, Backend, LeaseRef, LockRef, Secret};
    let mut server = support::server().await;
    let url = server.url();
    let store = PgStore::connect(&url).await.unwrap().timeout(TIMEOUT);
    let names: Vec<Vec<u8>> = (0..8)
        .map(|i| format!("stalled-{i}").into_bytes())
        .collect();
    let secrets: Vec<Secret> = names.iter().map(|_| Secret::random()).collect();
    let lease = |i: usize| {
        let lock = LockRef::new("faults", &names[i], Duration::from_secs(20));
        LeaseRef::new(lock, tower_lease::backend::Mode::Exclusive, &secrets[i])
    };
    // Sixteen connections in the pool, each with its statements prepared: without the
    // stalled calls' connections kept for their releases, the releases would go on the eight
    // idle ones, and race the acquisitions when the server wakes.
    let (store, lease) = (&store, &lease);
    let warm = (0..16).map(|i| async move {
        let secret = Secret::random();
        let name = format!("warm-{i}").into_bytes();
        let lock = LockRef::new("faults", &name, Duration::from_secs(20));
        let lease = LeaseRef::new(lock, tower_lease::backend::Mode::Exclusive, &secret);
        let taken = store.acquire(lease).await.unwrap();
        assert!(matches!(taken, Acquisition::Acquired { .. }));
        assert!(store.release(lease).await.unwrap());
    });
    futures_util::future::join_all(warm).await;

    server.pause();
    let stalled = futures_util::future::join_all((0..8).map(|i| store.acquire(lease(i)))).await;
    assert!(stalled.iter().all(|a| matches!(a, Err(Error::Timeout(_)))));
    // Given back once each, as the core does, while the server still sleeps.
    let given = futures_util::future::join_all((0..8).map(|i| store.release(lease(i)))).await;
    assert!(given.iter().all(|r| matches!(r, Err(Error::Timeout(_)))));
    server.resume();

    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let left = live_leases(&url).await;
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} leases taken by stalled acquisitions were not given back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
