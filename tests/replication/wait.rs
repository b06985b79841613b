//! `wait_for_replicas` without a failover: what a frozen replica (`SIGSTOP`) does to
//! acquisitions of every kind, to extensions, to bounded waits and to the layer, and that a
//! store without it sends no `WAIT`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use tower_lease::backend::{Extended, LeaseRef, LockRef, Mode, Secret};
use tower_lease::{Error, Lock, LockLayer, RedisStore, RwLock, Semaphore, Store, extract};

use crate::{WAIT, replicated};
use tower_lease_harness::http::{Http, count, serve};
use tower_lease_harness::sentinel::{Link, Topology, freeze};
use tower_lease_harness::server::{calls, commandstats};
use tower_lease_harness::{Endpoint, RedisServer};

const TTL: Duration = Duration::from_secs(2);
const JOBS: Lock<str> = Lock::new("jobs", TTL);
const FENCED: Lock<str> = Lock::new("fenced-jobs", TTL).fenced();
const CATALOG: RwLock<str> = RwLock::new("catalog", TTL);
const SLOTS: Semaphore<str> = Semaphore::new("slots", 2, TTL);

async fn plain(server: &RedisServer) -> Store {
    RedisStore::connect(&server.url()).await.unwrap().into()
}

/// `result` is `NotReplicated { acked: 0, wanted: 1 }`, and took the whole `WAIT` but not much
/// more.
fn not_replicated<T: std::fmt::Debug>(what: &str, result: tower_lease::Result<T>, took: Duration) {
    assert!(
        matches!(
            result,
            Err(Error::NotReplicated {
                acked: 0,
                wanted: 1
            })
        ),
        "{what}: {result:?}"
    );
    assert!(
        took >= WAIT - Duration::from_millis(10),
        "{what} took {took:?}, under WAIT"
    );
    assert!(took < Duration::from_millis(900), "{what} took {took:?}");
}

#[tokio::test]
async fn with_the_replica_frozen_every_acquisition_fails_within_the_bound_and_leaves_the_name_free()
{
    let topology = Topology::start(Link::Direct).await;
    let store = replicated(&topology.primary).await;
    let other = plain(&topology.primary).await;

    // With the replica up, every kind is acknowledged.
    let token = JOBS.try_lock(&store, "warm").await.unwrap().expect("free");
    assert!(token.release().await.unwrap());

    let _frozen = freeze(&topology.replica);
    macro_rules! refused {
        ($what:literal, $call:expr, $free:expr) => {{
            let started = Instant::now();
            let result = $call.await;
            not_replicated($what, result, started.elapsed());
            let taken = $free.await.unwrap();
            assert!(taken.is_some(), "{}: the name was left taken", $what);
        }};
    }
    refused!(
        "lock",
        JOBS.try_lock(&store, "a"),
        JOBS.try_lock(&other, "a")
    );
    refused!(
        "fenced lock",
        FENCED.try_lock(&store, "a"),
        FENCED.try_lock(&other, "a")
    );
    refused!(
        "write",
        CATALOG.try_write(&store, "a"),
        CATALOG.try_write(&other, "a")
    );
    refused!(
        "read",
        CATALOG.try_read(&store, "b"),
        CATALOG.try_write(&other, "b")
    );
    // Two permits: had the refused one stayed, only one would be left.
    refused!("permit", SLOTS.try_acquire(&store, "a"), async {
        let first = SLOTS.try_acquire(&other, "a").await?;
        let second = SLOTS.try_acquire(&other, "a").await?;
        Ok::<_, Error>(first.and(second))
    });
}

#[tokio::test]
async fn an_extension_that_is_not_replicated_is_a_store_error() {
    let topology = Topology::start(Link::Direct).await;
    let store = replicated(&topology.primary).await;
    let token = JOBS.try_lock(&store, "a").await.unwrap().expect("free");
    let backend = store.backend();
    let secrets = [Secret::random(), Secret::random()];
    let names: [&[u8]; 3] = [b"b", b"c", b"gone"];
    let lease = |i: usize, secret| {
        LeaseRef::new(LockRef::new("jobs", names[i], TTL), Mode::Exclusive, secret)
    };
    for (i, secret) in secrets.iter().enumerate() {
        backend.acquire(lease(i, secret)).await.unwrap();
    }
    let stranger = Secret::random();
    let batch = [
        lease(0, &secrets[0]),
        lease(1, &secrets[1]),
        lease(2, &stranger),
    ];

    let frozen = freeze(&topology.replica);
    let started = Instant::now();
    not_replicated("extend", token.extend().await, started.elapsed());
    let started = Instant::now();
    let answers = backend.extend_many(&batch).await;
    let took = started.elapsed();
    let mut answers = answers.into_iter();
    not_replicated("first of a batch", answers.next().unwrap(), took);
    not_replicated("second of a batch", answers.next().unwrap(), took);
    // A lease found gone wrote nothing, and is gone whatever WAIT says.
    assert!(matches!(answers.next(), Some(Ok(Extended::Gone))));

    drop(frozen);
    topology.until_synced().await;
    assert!(
        token.extend().await.unwrap(),
        "extended once the replica is back"
    );
    let answers = backend.extend_many(&batch[..2]).await;
    assert!(
        answers.iter().all(|a| matches!(a, Ok(Extended::Held))),
        "{answers:?}"
    );
}

#[tokio::test]
async fn a_bounded_wait_ends_at_once_on_not_replicated() {
    let topology = Topology::start(Link::Direct).await;
    let store = replicated(&topology.primary).await;
    let other = plain(&topology.primary).await;
    let holder = JOBS.try_lock(&other, "a").await.unwrap().expect("free");
    let waiter = tokio::spawn({
        let store = store.clone();
        async move {
            JOBS.try_lock_for(&store, "a", Duration::from_secs(10))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _frozen = freeze(&topology.replica);
    let released = Instant::now();
    assert!(holder.release().await.unwrap());
    let result = waiter.await.unwrap();
    let took = released.elapsed();
    assert!(
        matches!(
            result,
            Err(Error::NotReplicated {
                acked: 0,
                wanted: 1
            })
        ),
        "{result:?}"
    );
    assert!(
        took < Duration::from_secs(3),
        "the wait went on for {took:?}"
    );
    assert!(
        JOBS.try_lock(&other, "a").await.unwrap().is_some(),
        "left free"
    );
}

#[tokio::test]
async fn the_layer_answers_503_not_replicated_with_retry_after() {
    let topology = Topology::start(Link::Direct).await;
    let store = replicated(&topology.primary).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/jobs/{id}", post(count))
        .route_layer(LockLayer::new(store, JOBS, extract::path_segment(1)))
        .with_state(runs.clone());
    let addr = serve(app).await;
    let http = Http::new();
    assert_eq!(http.post(addr, "/jobs/warm").await.status, StatusCode::OK);

    let _frozen = freeze(&topology.replica);
    let reply = http.post(addr, "/jobs/1").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(reply.problem()["type"], "urn:tower-lease:not-replicated");
    assert_eq!(reply.retry_after(), Some(1));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the handler ran without a replicated lease"
    );
}

#[tokio::test]
async fn wait_goes_with_acquisitions_and_extensions_only() {
    let topology = Topology::start(Link::Direct).await;
    let raw = topology.primary.connection().await;
    let (replicated, plain) = (
        replicated(&topology.primary).await,
        plain(&topology.primary).await,
    );
    for store in [&plain, &replicated] {
        let token = JOBS.try_lock(store, "a").await.unwrap().expect("free");
        assert!(JOBS.try_lock(store, "a").await.unwrap().is_none());
        let fenced = FENCED.try_lock(store, "a").await.unwrap().expect("free");
        assert!(token.extend().await.unwrap());
        assert!(token.release().await.unwrap());
        assert!(fenced.release().await.unwrap());
        // A permit's and a reader's live release are plain commands: no `WAIT` after them,
        // as none after the scripts' release.
        let permit = SLOTS.try_acquire(store, "a").await.unwrap().expect("free");
        let read = CATALOG.try_read(store, "a").await.unwrap().expect("free");
        assert!(permit.release().await.unwrap());
        assert!(read.release().await.unwrap());
        assert_eq!(SLOTS.in_use(store, "a").await.unwrap(), 0);
        if std::ptr::eq(store, &plain) {
            assert_eq!(
                calls(&commandstats(&raw).await, "wait"),
                0,
                "WAIT off sends none"
            );
        }
    }
    // Four acquisitions, one refusal (its pipeline carries the WAIT too) and one extension.
    assert_eq!(calls(&commandstats(&raw).await, "wait"), 6);
}
