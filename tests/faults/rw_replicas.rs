//! Writer preference across replica processes: three `replica` examples serve documents under
//! an `RwLockLayer` with shared reads, readers loop on one document through all three, and a
//! writer tries every 10 ms. A witness in Redis counts reads and writes that found the other
//! inside (it must stay 0). On a writer-preferred lock the writer gets in within one read's
//! duration plus one heartbeat, every round; on a plain one it starves every round while the
//! reads are handed on like a baton (`RELAY_READS`), so that they overlap whatever the
//! machine's pauses.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use tower_lease::store::{KeyLayout, KeyRole};

use crate::replicas::Replica;
use tower_lease_harness::http::Http;
use tower_lease_harness::{Endpoint, RedisServer};

const READ: Duration = Duration::from_millis(100);
/// The lease TTL of the replicas; their heartbeat is a third of it.
const TTL_MS: &str = "600";
const BEAT: Duration = Duration::from_millis(200);
const ROUNDS: usize = 5;
/// How long a round's writer keeps trying.
const GIVE_UP: Duration = Duration::from_secs(2);

/// What one run found: per round, how long the writer took to get in (`None`: it gave up), the
/// witness's overlaps, the most reader leases seen at once in Redis, and the reads served.
#[derive(Debug)]
struct Run {
    rounds: Vec<Option<Duration>>,
    overlaps: i64,
    /// Reads refused (while a writer held or waited).
    refused: i64,
    most_leases: usize,
    reads: usize,
}

impl Run {
    /// Asserts that the writer got in, within `bound`, in every round.
    fn writer_got_in_within(&self, bound: Duration) {
        for (round, took) in self.rounds.iter().enumerate() {
            let took = took.unwrap_or_else(|| panic!("round {round}: the writer never got in"));
            assert!(
                took < bound,
                "round {round}: in after {took:?}, over {bound:?}"
            );
        }
    }
}

async fn run(preferred: bool, ttl_ms: &str) -> Run {
    run_with(preferred, ttl_ms, 12, ROUNDS, false).await
}

/// [`run`] with `readers` looping readers (spread over the replicas) and `rounds` writes;
/// `relay`: each read stays until a later one entered (or a read was refused).
async fn run_with(
    preferred: bool,
    ttl_ms: &str,
    readers: usize,
    rounds: usize,
    relay: bool,
) -> Run {
    let server = RedisServer::start();
    let env = [
        ("LOCK_TTL_MS", ttl_ms),
        ("READ_MS", "100"),
        ("WORK_MS", "20"),
        (
            "FAIRNESS",
            if preferred {
                "writers_first"
            } else {
                "readers_first"
            },
        ),
        ("RELAY_READS", if relay { "1" } else { "0" }),
    ];
    let replicas: Vec<Replica> = (0..3)
        .map(|_| Replica::start(&server.url(), &env))
        .collect();
    let addrs: Vec<_> = replicas.iter().map(|r| r.addr).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicUsize::new(0));

    // Readers spread over the replicas, staggered by a quarter of a read, so reads always
    // overlap.
    let reader_count = readers;
    let mut readers = Vec::new();
    for (i, &addr) in addrs.iter().cycle().take(reader_count).enumerate() {
        let (stop, reads) = (stop.clone(), reads.clone());
        let mut raw = server.connection().await;
        readers.push(tokio::spawn(async move {
            tokio::time::sleep(READ / 4 * (i / 3 % 4) as u32).await;
            let http = Http::new();
            while !stop.load(Ordering::SeqCst) {
                let reply = http.get(addr, "/docs/d").await;
                match reply.status {
                    StatusCode::OK => {
                        reads.fetch_add(1, Ordering::SeqCst);
                    }
                    // Refused while the writer holds or waits: look again shortly.
                    StatusCode::CONFLICT => {
                        // Counted where relayed reads look: a refused read lets them go.
                        let () = redis::cmd("INCR")
                            .arg("docs:d:refused")
                            .query_async(&mut raw)
                            .await
                            .unwrap();
                        tokio::time::sleep(Duration::from_millis(5)).await
                    }
                    other => panic!("a read answered {other}: {reply:?}"),
                }
            }
        }));
    }
    // Samples the reader leases in Redis while the run goes on.
    let sampler = {
        let stop = stop.clone();
        let mut raw = server.connection().await;
        let key = KeyLayout::default().key(KeyRole::Readers, "docs", b"d");
        tokio::spawn(async move {
            let mut most = 0;
            while !stop.load(Ordering::SeqCst) {
                let n: usize = redis::cmd("ZCARD")
                    .arg(&key)
                    .query_async(&mut raw)
                    .await
                    .unwrap();
                most = most.max(n);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            most
        })
    };
    tokio::time::sleep(Duration::from_millis(400)).await;

    let http = Http::new();
    let round_count = rounds;
    let mut rounds = Vec::new();
    for round in 0..round_count {
        let addr = addrs[round % addrs.len()];
        let started = Instant::now();
        let took = loop {
            let reply = http.send(addr, Method::PUT, "/docs/d", &[]).await;
            match reply.status {
                StatusCode::OK => break Some(started.elapsed()),
                StatusCode::CONFLICT if started.elapsed() < GIVE_UP => {}
                StatusCode::CONFLICT => break None,
                other => panic!("the write answered {other}: {reply:?}"),
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        rounds.push(took);
        // Let the reads overlap again before the next round.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let () = redis::cmd("SET")
        .arg("docs:d:stop")
        .arg(1)
        .query_async(&mut server.connection().await)
        .await
        .unwrap();
    for reader in readers {
        reader.await.unwrap();
    }
    let most_leases = sampler.await.unwrap();
    let (overlaps, refused): (Option<i64>, Option<i64>) = redis::pipe()
        .get("docs:d:overlaps")
        .get("docs:d:refused")
        .query_async(&mut server.connection().await)
        .await
        .unwrap();
    Run {
        rounds,
        overlaps: overlaps.unwrap_or(0),
        refused: refused.unwrap_or(0),
        most_leases,
        reads: reads.load(Ordering::SeqCst),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preferred_writer_gets_in_within_a_read_and_a_beat_across_three_replicas() {
    let run = run(true, TTL_MS).await;
    eprintln!("writer-preferred: {run:?}");
    assert_eq!(run.overlaps, 0, "a read and a write were inside together");
    assert!(run.reads > 50, "the readers kept reading: {run:?}");
    // Each replica shares one lease among its reads: at most one per replica, and one more
    // for a moment when a new share is taken while the last one's release is on the wire.
    assert!(run.most_leases <= 6, "{run:?}");
    // The extension that finds the intent closes each replica's share (within a beat), the
    // reads inside end (within a read), the last release lets the next attempt in (10 ms).
    let bound = READ + BEAT + Duration::from_millis(300);
    run.writer_got_in_within(bound);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_writer_starves_across_three_replicas() {
    let run = run_with(false, TTL_MS, 12, ROUNDS, true).await;
    eprintln!("plain, relayed reads: {run:?}");
    assert_eq!(run.overlaps, 0, "a read and a write were inside together");
    assert!(run.reads > 50, "the readers kept reading: {run:?}");
    assert_eq!(run.refused, 0, "a plain lock refused a read: {run:?}");
    assert!(
        run.rounds.iter().all(Option::is_none),
        "the writer got in while reads overlapped: {run:?}"
    );
}

/// With a TTL of 2 s (a heartbeat every 667 ms), the writer still gets in within one read and a
/// margin: its refused attempt publishes the intent, and every replica's share stops admitting
/// readers at once, not at its next extend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preferred_writer_gets_in_within_a_read_whatever_the_ttl() {
    let run = run(true, "2000").await;
    eprintln!("writer-preferred, TTL 2 s: {run:?}");
    assert_eq!(run.overlaps, 0, "a read and a write were inside together");
    assert!(run.reads > 50, "the readers kept reading: {run:?}");
    // The reads inside end (within a read), the last release lets the next attempt in (10 ms).
    let bound = READ + Duration::from_millis(300);
    run.writer_got_in_within(bound);
}

/// Thirty looping readers on three replicas with a TTL of 9 s (a heartbeat every 3 s): a
/// preferred writer gets in within 800 ms in each of six rounds, whatever the TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preferred_writer_gets_in_under_thirty_readers_with_a_nine_second_ttl() {
    let run = run_with(true, "9000", 30, 6, false).await;
    eprintln!("writer-preferred, 30 readers, TTL 9 s: {run:?}");
    assert_eq!(run.overlaps, 0, "a read and a write were inside together");
    assert!(run.reads > 50, "the readers kept reading: {run:?}");
    let bound = Duration::from_millis(800);
    run.writer_got_in_within(bound);
}
