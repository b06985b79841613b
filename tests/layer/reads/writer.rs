//! Writer preference over real TCP: GETs that keep overlapping starve a waiting PUT on a
//! plain `RwLock` (reads handed on like a baton, so that they overlap whatever the machine's
//! pauses), and let it in on a writer-preferred one: within about
//! one read's duration when each read has a lease of its own, within one read's duration plus one
//! heartbeat when the reads share one (the extension that finds the intent closes the share); a
//! witness counts readers inside during the write (it must stay 0). A waiting `PUT` whose client
//! disconnects takes its write intent with it: `GET`s are answered at once, not refused for the
//! rest of the intent's window (or, before the window, for two thirds of the TTL).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::routing::{get, put};
use http::{Method, StatusCode};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tower_lease::{RwLock, RwLockLayer, extract};

use tower_lease_harness::http::{Http, serve};
use tower_lease_harness::{Backing, Witness, poll};

const TTL: Duration = Duration::from_millis(900);
const PLAIN: RwLock<str> = RwLock::new("docs", TTL).fairness(tower_lease::Fairness::ReadersFirst);
const PREFERRED: RwLock<str> =
    RwLock::new("docs-preferred", TTL).fairness(tower_lease::Fairness::WritersFirst);
const READ: Duration = Duration::from_millis(100);
/// The layer's default heartbeat: a third of the TTL.
const BEAT: Duration = Duration::from_millis(300);

tower_lease_harness::store_tests!(
    Layer: [
        a_preferred_writer_gets_in,
        a_plain_writer_starves_while_reads_overlap,
        a_waiting_put_whose_client_left_lets_reads_in_at_once,
    ]
);

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

/// Four readers looping GETs, staggered so that reads always overlap, and after 300 ms one
/// PUT that waits up to a second; answers the PUT's status and how long it took.
async fn contend(
    env: &Backing,
    lock: RwLock<str>,
    coalesce: bool,
) -> (StatusCode, Duration, Witness) {
    let witness = Witness::default();
    let layer = RwLockLayer::new(env.store.clone(), lock, extract::path_segment(1))
        .max_wait(Duration::from_secs(1))
        .coalesce_reads(coalesce);
    let app = Router::new()
        .route("/docs/{id}", get(read).put(write))
        .route_layer(layer)
        .with_state(witness.clone());
    let addr = serve(app).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::new();
    for i in 0..4u64 {
        let stop = stop.clone();
        readers.push(tokio::spawn(async move {
            tokio::time::sleep(READ / 4 * i as u32).await;
            let http = Http::new();
            while !stop.load(Ordering::SeqCst) {
                http.get(addr, "/docs/1").await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let put = Http::new().send(addr, Method::PUT, "/docs/1", &[]).await;
    let took = started.elapsed();
    stop.store(true, Ordering::SeqCst);
    for reader in readers {
        reader.await.unwrap();
    }
    (put.status, took, witness)
}

async fn a_preferred_writer_gets_in(env: Backing) {
    for coalesce in [false, true] {
        preferred(&env, coalesce).await;
    }
}

async fn preferred(env: &Backing, coalesce: bool) {
    let (status, took, witness) = contend(env, PREFERRED, coalesce).await;
    eprintln!("preferred writer (coalesced: {coalesce}): {status} after {took:?}");
    assert_eq!(status, StatusCode::OK, "the preferred writer gets in");
    // The reads in progress end within one read's duration; the last one's release wakes it.
    // Sharing one lease, new reads keep joining it until its next extension finds the intent.
    let bound = match coalesce {
        false => READ + Duration::from_millis(300),
        true => READ + BEAT + Duration::from_millis(300),
    };
    assert!(
        took < bound,
        "it got in after {took:?} (coalesced: {coalesce})"
    );
    assert!(!witness.read_during_write(), "no reader during the write");
}

/// The reads of [`a_plain_writer_starves_while_reads_overlap`]: each stays inside until a later
/// read has entered, so one is always inside, however long the machine pauses; or until a read
/// was refused after it entered (which a plain lock never does to a read, and a writer-preferred
/// one does once its writer waits), so that a writer let in is seen to get in.
#[derive(Clone, Default)]
struct Relay {
    witness: Witness,
    entered: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

async fn relayed_read(State(relay): State<Relay>) -> &'static str {
    let _reader = relay.witness.enter();
    let me = relay.entered.fetch_add(1, Ordering::SeqCst) + 1;
    let refused = relay.refused.load(Ordering::SeqCst);
    tokio::time::sleep(READ).await;
    while relay.entered.load(Ordering::SeqCst) == me
        && relay.refused.load(Ordering::SeqCst) == refused
        && !relay.stop.load(Ordering::SeqCst)
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    "read"
}

async fn relayed_write(State(relay): State<Relay>) -> &'static str {
    let _writer = relay.witness.enter_writer();
    "written"
}

async fn a_plain_writer_starves_while_reads_overlap(env: Backing) {
    for coalesce in [false, true] {
        let relay = Relay::default();
        let wait = Duration::from_secs(1);
        let layer = |wait| {
            RwLockLayer::new(env.store.clone(), PLAIN, extract::path_segment(1))
                .max_wait(wait)
                .coalesce_reads(coalesce)
        };
        // Reads are answered at once (a read that waited would hold up its relay rather
        // than be refused); the write waits.
        let app = Router::new()
            .route("/docs/{id}", get(relayed_read))
            .route_layer(layer(Duration::ZERO))
            .merge(
                Router::new()
                    .route("/edit/{id}", put(relayed_write))
                    .route_layer(layer(wait)),
            )
            .with_state(relay.clone());
        let addr = serve(app).await;
        let mut readers = Vec::new();
        for _ in 0..4 {
            let relay = relay.clone();
            readers.push(tokio::spawn(async move {
                let http = Http::new();
                while !relay.stop.load(Ordering::SeqCst) {
                    if http.get(addr, "/docs/1").await.status != StatusCode::OK {
                        relay.refused.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }));
        }
        let inside = poll(Duration::from_millis(5), Duration::from_secs(5), || async {
            (relay.witness.inside() > 0).then_some(())
        })
        .await;
        assert!(inside.is_some(), "no read got in");
        let started = Instant::now();
        let put = Http::new().send(addr, Method::PUT, "/edit/1", &[]).await;
        let took = started.elapsed();
        relay.stop.store(true, Ordering::SeqCst);
        for reader in readers {
            reader.await.unwrap();
        }
        assert_eq!(
            put.status,
            StatusCode::CONFLICT,
            "the plain writer got in (coalesced: {coalesce}) after {took:?}: {put:?}"
        );
        assert!(
            took >= wait,
            "refused after {took:?}, before its whole wait"
        );
        assert_eq!(
            relay.refused.load(Ordering::SeqCst),
            0,
            "a read was refused"
        );
        assert!(!relay.witness.read_during_write());
    }
}

/// A lock whose intent, at two thirds of the TTL, would last 1333 ms; its window is 500 ms.
const LONG: RwLock<str> =
    RwLock::new("docs-long", Duration::from_secs(2)).fairness(tower_lease::Fairness::WritersFirst);
const WINDOW: Duration = Duration::from_millis(500);

async fn a_waiting_put_whose_client_left_lets_reads_in_at_once(env: Backing) {
    let layer =
        |wait| RwLockLayer::new(env.store.clone(), LONG, extract::path_segment(1)).max_wait(wait);
    // Reads answer at once; writes wait up to 5 s.
    let app = Router::new()
        .route("/docs/{id}", get(|| async { "read" }))
        .route_layer(layer(Duration::ZERO))
        .merge(
            Router::new()
                .route("/edit/{id}", put(|| async { "written" }))
                .route_layer(layer(Duration::from_secs(5))),
        );
    let addr = serve(app).await;
    let http = Http::new();
    // A reader elsewhere keeps the writer waiting.
    let reader = LONG.try_read(&env.store, "1").await.unwrap().unwrap();

    let mut client = TcpStream::connect(addr).await.unwrap();
    let request = "PUT /edit/1 HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\n\r\n";
    client.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = http.get(addr, "/docs/1").await.status;
    assert_eq!(
        refused,
        StatusCode::CONFLICT,
        "reads wait for the waiting writer"
    );
    drop(client);
    let left = Instant::now();

    let refusals = AtomicUsize::new(0);
    let every = Duration::from_millis(10);
    let answered = poll(every, Duration::from_secs(3), || async {
        let status = http.get(addr, "/docs/1").await.status;
        if status != StatusCode::OK {
            refusals.fetch_add(1, Ordering::SeqCst);
        }
        (status == StatusCode::OK).then_some(())
    })
    .await;
    let took = left.elapsed();
    let refusals = refusals.load(Ordering::SeqCst);
    eprintln!("GETs answered 200 {took:?} after the client left ({refusals} refused)");
    assert!(answered.is_some(), "reads never came back");
    assert!(
        took < WINDOW + Duration::from_millis(200),
        "reads refused for {took:?} after the client left ({refusals} refused)"
    );
    assert!(reader.release().await.unwrap());
}
