//! Releases and write intents in one process reach the others through the backend's
//! notifications: a waiter elsewhere tries again when the lock is released, not at its next
//! poll, and a writer-preferred writer elsewhere closes this process's shared reads at once,
//! not at their next heartbeat.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use http::StatusCode;
use tower_lease::{Lock, RwLock, RwLockLayer, extract};
use tower_lease_harness::Witness;
use tower_lease_harness::http::{Http, serve};

use crate::relay::Relay;

const LOCK: Lock<str> = Lock::new("relay", Duration::from_secs(2));

/// A waiter in one process, a holder in another that keeps the lock 600 ms: the waiter gets
/// in just after the release, having asked the server a handful of times, where polling asks
/// every 5 to 100 ms (about ten times in 600 ms).
#[tokio::test]
async fn a_release_elsewhere_wakes_the_waiter() {
    let relay = Relay::default();
    let (here, _) = relay.store();
    let (elsewhere, probe) = relay.store();
    for round in 0..3 {
        let name = format!("invoice-{round}");
        let held = LOCK.try_lock(&here, &name).await.unwrap().unwrap();
        let before = probe.acquisitions.load(Ordering::SeqCst);
        let waiter = {
            let (elsewhere, name) = (elsewhere.clone(), name.clone());
            tokio::spawn(async move {
                let token = LOCK
                    .try_lock_for(&elsewhere, &name, Duration::from_secs(3))
                    .await;
                (Instant::now(), token)
            })
        };
        tokio::time::sleep(Duration::from_millis(600)).await;
        let released_at = Instant::now();
        assert!(held.release().await.unwrap());
        let (acquired_at, token) = waiter.await.unwrap();
        assert!(
            token.unwrap().is_some(),
            "round {round}: the waiter got the lock"
        );
        let attempts = probe.acquisitions.load(Ordering::SeqCst) - before;
        let late = acquired_at.saturating_duration_since(released_at);
        assert!(
            attempts <= 4,
            "round {round}: the waiter asked {attempts} times in 600 ms: it polled"
        );
        assert!(
            late < Duration::from_millis(200),
            "round {round}: acquired {late:?} after the release"
        );
    }
}

const TTL: Duration = Duration::from_secs(3);
const PREFERRED: RwLock<str> =
    RwLock::new("relay-docs", TTL).fairness(tower_lease::Fairness::WritersFirst);
const READ: Duration = Duration::from_millis(100);

async fn read(State(w): State<Witness>) -> &'static str {
    let _reader = w.enter();
    tokio::time::sleep(READ).await;
    "read"
}

async fn write(State(w): State<Witness>) -> &'static str {
    let _writer = w.enter_writer();
    tokio::time::sleep(Duration::from_millis(20)).await;
    "written"
}

/// Four clients keep GETs overlapping on one process (its reads share one lease, heartbeated
/// every second); 300 ms in, a PUT to the other process waits. It gets in once the reads in
/// flight end (about one read, 100 ms), where hearing of the writer only through the
/// heartbeat's extension takes the rest of the beat (700 ms) first. No reader is inside
/// during the write.
#[tokio::test]
async fn a_writer_elsewhere_closes_the_shared_reads_at_once() {
    let relay = Relay::default();
    let witness = Witness::default();
    let app = |store| {
        let layer = RwLockLayer::new(store, PREFERRED, extract::path_segment(1))
            .max_wait(Duration::from_secs(2));
        Router::new()
            .route("/docs/{id}", get(read).put(write))
            .route_layer(layer)
            .with_state(witness.clone())
    };
    let reading = serve(app(relay.store().0)).await;
    let writing = serve(app(relay.store().0)).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for i in 0..4u32 {
        let stop = stop.clone();
        readers.push(tokio::spawn(async move {
            tokio::time::sleep(READ / 4 * i).await;
            let http = Http::new();
            while !stop.load(Ordering::SeqCst) {
                http.get(reading, "/docs/1").await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let put = Http::new().put(writing, "/docs/1").await;
    let took = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    for reader in readers {
        reader.await.unwrap();
    }
    assert_eq!(put.status, StatusCode::OK, "{}", put.text());
    assert!(
        !witness.read_during_write(),
        "a reader was inside during the write"
    );
    assert!(
        took < Duration::from_millis(450),
        "the PUT waited {took:?} behind reads in another process"
    );
}
