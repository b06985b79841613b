//! Writer preference over real TCP: GETs that keep overlapping can starve a waiting PUT on a
//! plain `RwLock` (shown, not asserted), and let it in on a writer-preferred one: within about
//! one read's duration when each read has a lease of its own, within one read's duration plus one
//! heartbeat when the reads share one (the extension that finds the intent closes the share); a
//! witness counts readers inside during the write (it must stay 0).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use http::{Method, StatusCode};
use tower_lease::{RwLock, RwLockLayer, extract};

use crate::support::http::{Http, serve};
use crate::support::{Env, Witness};

const TTL: Duration = Duration::from_millis(900);
const PLAIN: RwLock<str> = RwLock::new("docs", TTL);
const PREFERRED: RwLock<str> = RwLock::new("docs-preferred", TTL).writer_preferred();
const READ: Duration = Duration::from_millis(100);
/// The layer's default heartbeat: a third of the TTL.
const BEAT: Duration = Duration::from_millis(300);

crate::store_tests!(Layer: [a_preferred_writer_gets_in_and_a_plain_one_starves]);

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
async fn contend(env: &Env, lock: RwLock<str>, coalesce: bool) -> (StatusCode, Duration, Witness) {
    let witness = Witness::default();
    let layer = RwLockLayer::new(env.store.clone(), lock, extract::path_segment(1))
        .wait(Duration::from_secs(1))
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

async fn a_preferred_writer_gets_in_and_a_plain_one_starves(env: Env) {
    for coalesce in [false, true] {
        plain_and_preferred(&env, coalesce).await;
    }
}

async fn plain_and_preferred(env: &Env, coalesce: bool) {
    let (status, took, witness) = contend(env, PLAIN, coalesce).await;
    // Starving is what overlapping reads do to a plain writer, but not a promise: a pause of
    // the loaded test machine between two reads lets it in. Shown, not asserted.
    eprintln!("plain writer (coalesced: {coalesce}): {status} after {took:?}");
    assert!(
        status == StatusCode::OK || took >= Duration::from_secs(1),
        "refused only after its whole wait: {status} after {took:?}"
    );
    assert!(!witness.read_during_write());

    let (status, took, witness) = contend(env, PREFERRED, coalesce).await;
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
