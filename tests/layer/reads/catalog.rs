//! A catalog behind `RwLockLayer` with its defaults (phase-fair) and `.max_wait(..)`, over real
//! TCP: three replicas (services on separate stores of one backend, where it has more than
//! one), clients that keep sending GETs with some PUTs among them. Every GET and every PUT is
//! answered 2xx well within its wait, and no read overlaps a write (a marker the handlers
//! check).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::get;
use tokio::time::{Instant, sleep};
use tower_lease::{RwLock, RwLockLayer, extract};

use tower_lease_harness::Backing;
use tower_lease_harness::http::{Http, serve};

const CATALOG: RwLock<str> = RwLock::new("shop-catalog", Duration::from_secs(2));
/// How long a request may wait for the lock, reads as writes.
const MAX_WAIT: Duration = Duration::from_secs(2);
/// The slowest answer allowed: three quarters of the wait, generous for a loaded 2-core
/// machine running other suites beside it (a few 30 ms writes queued, each handed on by a
/// notification or, without one, a poll): a PUT of 1.33 s was seen on the cluster there.
const SLOWEST: Duration = Duration::from_millis(1500);

tower_lease_harness::store_tests!(Layer: [every_get_and_put_is_served_and_none_overlap]);

/// What the handlers see inside the lock of one shop, across the replicas.
#[derive(Default)]
struct Marker {
    readers: AtomicUsize,
    writers: AtomicUsize,
    overlaps: AtomicUsize,
}

/// The markers of the shops, by the shop's number.
type Markers = Arc<[Marker; 2]>;

async fn read(State(markers): State<Markers>, Path(shop): Path<usize>) -> &'static str {
    let marker = &markers[shop];
    marker.readers.fetch_add(1, Ordering::SeqCst);
    if marker.writers.load(Ordering::SeqCst) > 0 {
        marker.overlaps.fetch_add(1, Ordering::SeqCst);
    }
    sleep(Duration::from_millis(5)).await;
    marker.readers.fetch_sub(1, Ordering::SeqCst);
    "price list"
}

async fn reprice(State(markers): State<Markers>, Path(shop): Path<usize>) -> &'static str {
    let marker = &markers[shop];
    let writers = marker.writers.fetch_add(1, Ordering::SeqCst);
    if writers > 0 || marker.readers.load(Ordering::SeqCst) > 0 {
        marker.overlaps.fetch_add(1, Ordering::SeqCst);
    }
    sleep(Duration::from_millis(30)).await;
    if marker.readers.load(Ordering::SeqCst) > 0 {
        marker.overlaps.fetch_add(1, Ordering::SeqCst);
    }
    marker.writers.fetch_sub(1, Ordering::SeqCst);
    "repriced"
}

async fn every_get_and_put_is_served_and_none_overlap(env: Backing) {
    let markers: Markers = Arc::default();
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let store = match env.notified().await {
            Some(elsewhere) => elsewhere,
            None => env.store.clone(),
        };
        let layer = RwLockLayer::new(store, CATALOG, extract::path_segment(1)).max_wait(MAX_WAIT);
        let app = Router::new()
            .route("/catalog/{shop}", get(read).put(reprice))
            .route_layer(layer)
            .with_state(markers.clone());
        replicas.push(serve(app).await);
    }
    let http = Http::new();
    let until = Instant::now() + Duration::from_secs(3);
    let clients: Vec<_> = (0..10)
        .map(|client| {
            let (http, replicas) = (http.clone(), replicas.clone());
            tokio::spawn(async move {
                let (mut gets, mut puts, mut refused) = (0, 0, Vec::new());
                let mut slowest = Duration::ZERO;
                let mut n = client;
                while Instant::now() < until {
                    n += 1;
                    let addr = replicas[n % replicas.len()];
                    // One request in ten is a PUT (two clients' worth of writers).
                    let put = n % 10 == 0;
                    let path = format!("/catalog/{}", n % 2);
                    let sent = Instant::now();
                    let reply = if put {
                        http.put(addr, &path).await
                    } else {
                        http.get(addr, &path).await
                    };
                    let took = sent.elapsed();
                    slowest = slowest.max(took);
                    if !reply.status.is_success() {
                        refused.push((put, reply.status, took));
                    }
                    if put { puts += 1 } else { gets += 1 }
                }
                (gets, puts, refused, slowest)
            })
        })
        .collect();
    let (mut gets, mut puts, mut refused, mut slowest) = (0, 0, Vec::new(), Duration::ZERO);
    for client in clients {
        let (g, p, r, s) = client.await.unwrap();
        gets += g;
        puts += p;
        refused.extend(r);
        slowest = slowest.max(s);
    }
    for (shop, marker) in markers.iter().enumerate() {
        let overlaps = marker.overlaps.load(Ordering::SeqCst);
        assert_eq!(overlaps, 0, "a read overlapped a write of shop {shop}");
    }
    assert!(
        gets > 50 && puts > 5,
        "too few requests: {gets} GETs, {puts} PUTs"
    );
    let (refused_puts, refused_gets): (Vec<_>, Vec<_>) = refused.into_iter().partition(|r| r.0);
    assert!(
        refused_gets.is_empty(),
        "{} of {gets} GETs not answered 2xx (PUT?, status, time): {refused_gets:?}",
        refused_gets.len()
    );
    assert!(
        refused_puts.is_empty(),
        "{} of {puts} PUTs not answered 2xx (PUT?, status, time): {refused_puts:?}",
        refused_puts.len()
    );
    // A write waits for the reads in flight and the writes queued before it, each handed on
    // when the one before ends: well under its wait, never the wait's end.
    assert!(slowest <= SLOWEST, "a request took {slowest:?}");
}

/// The same catalog on Sentinel: each replica's store finds the primary through the sentinels
/// and waits for a replica's acknowledgement of each acquisition.
#[cfg(feature = "sentinel")]
mod on_sentinel {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_get_and_put_is_served_and_none_overlap() {
        let env = tower_lease_harness::Backing::sentinel().await;
        super::every_get_and_put_is_served_and_none_overlap(env).await;
    }
}
