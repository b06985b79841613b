//! A catalog behind `RwLockLayer` over real TCP: three replicas (services on separate stores of
//! one backend, where it has more than one), clients that keep sending GETs with some PUTs
//! among them, and never send a refused request again. With the README's catalog line
//! (`.max_wait(2 s)`) every GET and every PUT is answered 2xx well within its wait; with the
//! layer's defaults and nothing else, at least 99 % of each. No read overlaps a write (a marker
//! the handlers check).

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

tower_lease_harness::store_tests!(Layer: [
    every_get_and_put_is_served_and_none_overlap,
    the_defaults_serve_a_catalog_at_first_send,
]);

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

/// What the clients of one run saw.
struct Served {
    gets: usize,
    puts: usize,
    /// The requests not answered 2xx: (a PUT?, status, how long it took).
    refused_gets: Vec<(bool, http::StatusCode, Duration)>,
    refused_puts: Vec<(bool, http::StatusCode, Duration)>,
    /// The longest any request took, from its send to its answer.
    slowest: Duration,
}

/// Serves the catalog on three replicas of `env`, each a layer on its own store with the
/// layer's defaults and, if given, `max_wait`; and lets ten clients send GETs and PUTs (one in
/// `put_every`, over two shops) for `length`, each request once. Asserts that no read
/// overlapped a write, and that there were requests enough.
async fn catalog(
    env: &Backing,
    max_wait: Option<Duration>,
    put_every: usize,
    length: Duration,
) -> Served {
    let markers: Markers = Arc::default();
    let mut replicas = Vec::new();
    for _ in 0..3 {
        let store = match env.notified().await {
            Some(elsewhere) => elsewhere,
            None => env.store.clone(),
        };
        let mut layer = RwLockLayer::new(store, CATALOG, extract::path_segment(1));
        if let Some(wait) = max_wait {
            layer = layer.max_wait(wait);
        }
        let app = Router::new()
            .route("/catalog/{shop}", get(read).put(reprice))
            .route_layer(layer)
            .with_state(markers.clone());
        replicas.push(serve(app).await);
    }
    let http = Http::new();
    let until = Instant::now() + length;
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
                    let put = n % put_every == 0;
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
    let (refused_puts, refused_gets) = refused.into_iter().partition(|r| r.0);
    Served {
        gets,
        puts,
        refused_gets,
        refused_puts,
        slowest,
    }
}

async fn every_get_and_put_is_served_and_none_overlap(env: Backing) {
    // One request in ten is a PUT (two clients' worth of writers).
    let served = catalog(&env, Some(MAX_WAIT), 10, Duration::from_secs(3)).await;
    let Served {
        gets,
        puts,
        refused_gets,
        refused_puts,
        slowest,
    } = served;
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

/// The layer as a team writes it from the crate's description, `RwLockLayer::new(store, lock,
/// extract)` and nothing else, serves the catalog: at least 99 % of the GETs and of the PUTs
/// (one in seven) are answered 2xx at their first send, none overlapping.
async fn the_defaults_serve_a_catalog_at_first_send(env: Backing) {
    let served = catalog(&env, None, 7, Duration::from_secs(2)).await;
    let Served {
        gets,
        puts,
        refused_gets,
        refused_puts,
        slowest,
    } = served;
    let share = |refused: usize, of: usize| 100.0 * (of - refused) as f64 / of as f64;
    let (get_share, put_share) = (
        share(refused_gets.len(), gets),
        share(refused_puts.len(), puts),
    );
    eprintln!(
        "defaults: {get_share:.1} % of {gets} GETs, {put_share:.1} % of {puts} PUTs 2xx; slowest {slowest:?}"
    );
    let first = |refused: &[_]| refused.iter().take(5).copied().collect::<Vec<_>>();
    assert!(
        get_share >= 99.0,
        "{get_share:.1} % of {gets} GETs answered 2xx at first send; the first refused (PUT?, \
         status, time): {:?}",
        first(&refused_gets)
    );
    assert!(
        put_share >= 99.0,
        "{put_share:.1} % of {puts} PUTs answered 2xx at first send; the first refused (PUT?, \
         status, time): {:?}",
        first(&refused_puts)
    );
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_defaults_serve_a_catalog_at_first_send() {
        let env = tower_lease_harness::Backing::sentinel().await;
        super::the_defaults_serve_a_catalog_at_first_send(env).await;
    }
}
