//! An answered request's lease is released: three replicas of a service, each behind its own
//! layer, and a client that sends its next request to another replica the moment it has its
//! answer. Whatever came before (overlapping reads that shared a lease, a write, a permit), the
//! next request never meets the lease of a request already answered: reads spread over the
//! replicas then a write, a read after a write, a write after a write, an exclusive lock after
//! an exclusive lock, permits after permits; many rounds each. A write's own hold still
//! excludes the reads sent during it.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use http::{Method, StatusCode};
use tokio::sync::watch;
use tower_lease::{
    Lock, LockLayer, RwLock, RwLockLayer, Semaphore, SemaphoreLayer, Store, extract,
};

use tower_lease_harness::http::{Http, Reply, serve};
use tower_lease_harness::{Backing, Gate, Witness};

const TTL: Duration = Duration::from_secs(2);
const CATALOG: RwLock<str> = RwLock::new("answered-catalog", TTL);
const INVOICES: Lock<str> = Lock::new("answered-invoices", TTL);
const SEATS: Semaphore<str> = Semaphore::new("answered-seats", 2, TTL);
/// How long each read works: long enough that the reads of a round overlap on every replica.
const READ: Duration = Duration::from_millis(150);
const ROUNDS: usize = 6;

tower_lease_harness::store_tests!(Layer: [
    a_write_right_after_reads_on_other_replicas_gets_in,
    a_write_right_after_reads_gets_in_under_a_long_linger,
    a_write_right_after_reads_held_through_their_bodies_gets_in,
    a_read_right_after_a_write_on_another_replica_gets_in,
    a_write_right_after_a_write_on_another_replica_gets_in,
    an_exclusive_lock_is_free_on_every_replica_once_answered,
    permits_are_free_on_every_replica_once_answered,
]);

/// The three replicas' stores: on Redis each replica has its own connection (with release
/// notifications), in memory they share the process's store.
pub(crate) async fn replica_stores(env: &Backing) -> Vec<Store> {
    let mut stores = vec![env.store.clone()];
    for _ in 1..3 {
        stores.push(env.notified().await.unwrap_or_else(|| env.store.clone()));
    }
    stores
}

#[derive(Clone)]
struct Handlers {
    witness: Witness,
    /// Writes stay inside until it opens.
    writes: Gate,
}

async fn read(State(h): State<Handlers>) -> &'static str {
    let _reader = h.witness.enter();
    tokio::time::sleep(READ).await;
    "read"
}

async fn write(State(h): State<Handlers>) -> &'static str {
    let _writer = h.witness.enter_writer();
    h.writes.pass().await;
    "written"
}

/// Three replicas behind `RwLockLayer`s made by `layer` from each replica's store, and what
/// opens the writes' gate.
async fn rw_replicas(
    env: &Backing,
    layer: impl Fn(Store) -> RwLockLayer<extract::PathSegment>,
) -> (Vec<SocketAddr>, watch::Sender<bool>, Handlers) {
    let (opener, writes) = Gate::new();
    opener.send_replace(true);
    let handlers = Handlers {
        witness: Witness::default(),
        writes,
    };
    let mut addrs = Vec::new();
    for store in replica_stores(env).await {
        let app = Router::new()
            .route("/catalog/{shop}", get(read).put(write))
            .route_layer(layer(store))
            .with_state(handlers.clone());
        addrs.push(serve(app).await);
    }
    (addrs, opener, handlers)
}

fn catalog(store: Store) -> RwLockLayer<extract::PathSegment> {
    RwLockLayer::new(store, CATALOG, extract::path_segment(1)).busy_status(StatusCode::LOCKED)
}

/// Ten GETs of one name spread over the replicas, all at once (so each replica's reads
/// overlap and share a lease); answers them all.
async fn spread_reads(http: &Http, addrs: &[SocketAddr], path: &'static str) -> Vec<Reply> {
    let reads: Vec<_> = (0..10)
        .map(|i| {
            let (http, addr) = (http.clone(), addrs[i % addrs.len()]);
            tokio::spawn(async move { http.get(addr, path).await })
        })
        .collect();
    let mut replies = Vec::new();
    for read in reads {
        replies.push(read.await.unwrap());
    }
    replies
}

/// Rounds of: reads spread over the replicas, then, the moment the last is answered, a PUT to
/// one replica, which must get in; while it holds the lock a GET to another is refused.
async fn reads_then_write(env: &Backing, layer: fn(Store) -> RwLockLayer<extract::PathSegment>) {
    let (addrs, opener, handlers) = rw_replicas(env, layer).await;
    let http = Http::new();
    for round in 0..ROUNDS {
        for reply in spread_reads(&http, &addrs, "/catalog/shop").await {
            assert_eq!((reply.status, reply.text()), (StatusCode::OK, "read"));
        }
        opener.send_replace(false);
        let writer = addrs[round % 3];
        let put = {
            let http = http.clone();
            tokio::spawn(async move { http.put(writer, "/catalog/shop").await })
        };
        let mut put = std::pin::pin!(put);
        tokio::select! {
            () = handlers.writes.until_inside(1) => {}
            refused = &mut put => panic!(
                "round {round}: a PUT right after the reads' answers: {:?}",
                refused.unwrap()
            ),
        }
        let during = http.get(addrs[(round + 1) % 3], "/catalog/shop").await;
        assert_eq!(
            during.status,
            StatusCode::LOCKED,
            "round {round}: {during:?}"
        );
        opener.send_replace(true);
        let put = put.await.unwrap();
        assert_eq!((put.status, put.text()), (StatusCode::OK, "written"));
    }
    assert!(!handlers.witness.read_during_write());
}

async fn a_write_right_after_reads_on_other_replicas_gets_in(env: Backing) {
    reads_then_write(&env, catalog).await;
}

/// A linger set by hand keeps a share for the next reads; an answered read is still released.
async fn a_write_right_after_reads_gets_in_under_a_long_linger(env: Backing) {
    reads_then_write(&env, |store| {
        catalog(store).linger_reads(Duration::from_millis(20))
    })
    .await;
}

/// Leases held until the response body ends: the body's end is reported once the lease (or
/// the read's part in a share) is given back.
async fn a_write_right_after_reads_held_through_their_bodies_gets_in(env: Backing) {
    reads_then_write(&env, |store| catalog(store).hold_through_body()).await;
}

async fn a_read_right_after_a_write_on_another_replica_gets_in(env: Backing) {
    let (addrs, _opener, handlers) = rw_replicas(&env, catalog).await;
    let http = Http::new();
    for round in 0..ROUNDS {
        let put = http.put(addrs[round % 3], "/catalog/shop").await;
        assert_eq!(put.status, StatusCode::OK, "round {round}: {put:?}");
        let get = http.get(addrs[(round + 1) % 3], "/catalog/shop").await;
        assert_eq!(
            (get.status, get.text()),
            (StatusCode::OK, "read"),
            "round {round}: a GET right after the PUT's answer: {get:?}"
        );
    }
    assert!(!handlers.witness.read_during_write());
}

async fn a_write_right_after_a_write_on_another_replica_gets_in(env: Backing) {
    let (addrs, _opener, _handlers) = rw_replicas(&env, catalog).await;
    let http = Http::new();
    for round in 0..ROUNDS {
        for replica in [round % 3, (round + 1) % 3] {
            let put = http.put(addrs[replica], "/catalog/shop").await;
            assert_eq!(
                (put.status, put.text()),
                (StatusCode::OK, "written"),
                "round {round}, replica {replica}: {put:?}"
            );
        }
    }
}

async fn finalize(State(witness): State<Witness>) -> &'static str {
    let _inside = witness.enter();
    tokio::time::sleep(Duration::from_millis(20)).await;
    "done"
}

/// Three replicas serving `POST /invoices/{id}` (and `/seats/{id}`) behind layers made by
/// `layer`.
async fn post_replicas(
    env: &Backing,
    path: &str,
    layer: impl Fn(Store, Router<Witness>) -> Router<Witness>,
) -> (Vec<SocketAddr>, Witness) {
    let witness = Witness::default();
    let mut addrs = Vec::new();
    for store in replica_stores(env).await {
        let routes = Router::new().route(path, post(finalize));
        let app = layer(store, routes).with_state(witness.clone());
        addrs.push(serve(app).await);
    }
    (addrs, witness)
}

async fn an_exclusive_lock_is_free_on_every_replica_once_answered(env: Backing) {
    let (addrs, witness) = post_replicas(&env, "/invoices/{id}", |store, routes| {
        routes.route_layer(LockLayer::new(store, INVOICES, extract::path_segment(1)))
    })
    .await;
    let http = Http::new();
    for round in 0..ROUNDS * 2 {
        let reply = http.post(addrs[round % 3], "/invoices/7").await;
        assert_eq!(
            (reply.status, reply.text()),
            (StatusCode::OK, "done"),
            "round {round}: a POST right after the last one's answer: {reply:?}"
        );
    }
    assert_eq!(witness.most(), 1);
}

async fn permits_are_free_on_every_replica_once_answered(env: Backing) {
    let (addrs, witness) = post_replicas(&env, "/seats/{id}", |store, routes| {
        routes.route_layer(SemaphoreLayer::new(store, SEATS, extract::path_segment(1)))
    })
    .await;
    let http = Http::new();
    for round in 0..ROUNDS {
        // Both permits taken at once on two replicas, then both again on the next two.
        let both = [round % 3, (round + 1) % 3].map(|replica| {
            let (http, addr) = (http.clone(), addrs[replica]);
            tokio::spawn(async move { http.send(addr, Method::POST, "/seats/9", &[]).await })
        });
        for reply in both {
            let reply = reply.await.unwrap();
            assert_eq!(
                (reply.status, reply.text()),
                (StatusCode::OK, "done"),
                "round {round}: permits right after the last ones' answers: {reply:?}"
            );
        }
    }
    assert!(witness.most() <= 2);
}

/// The same rounds on Sentinel: each replica's store finds the primary through the sentinels
/// and waits for a replica's acknowledgement.
#[cfg(feature = "sentinel")]
mod on_sentinel {
    macro_rules! on_sentinel {
        ($($name:ident),*) => {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                super::$name(tower_lease_harness::Backing::sentinel().await).await;
            }
        )*};
    }

    on_sentinel!(
        a_write_right_after_reads_on_other_replicas_gets_in,
        a_write_right_after_reads_gets_in_under_a_long_linger,
        a_write_right_after_reads_held_through_their_bodies_gets_in,
        a_read_right_after_a_write_on_another_replica_gets_in,
        a_write_right_after_a_write_on_another_replica_gets_in,
        an_exclusive_lock_is_free_on_every_replica_once_answered,
        permits_are_free_on_every_replica_once_answered
    );
}
