//! A job that must run at most once per interval across replicas, however long it takes: each
//! replica's timer tries the lock, and whoever takes it keeps it alive while the job works
//! (`keep_alive`), then stops the heartbeat without releasing (`into_token`), so the lease runs
//! out one interval after its last extension and the others find it held until then. One lock:
//! the lease, not the job's duration, spaces the runs, and a job longer than the interval never
//! overlaps the next run.
//!
//! ```text
//! cargo run --example cron
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example cron
//! ```
//!
//! Three replicas tick every 100 ms for 5 s; the job takes 200 ms or 1.5 s (longer than the
//! 1 s interval), in turn. The example exits non-zero if two runs overlapped or started less
//! than an interval apart, or if the job did not run about once per interval.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior, interval, sleep};
use tower_lease::{Lock, RedisStore, Store};

/// The TTL is the interval: a lease left to run out blocks the job for one interval from its
/// last extension.
const INTERVAL: Duration = Duration::from_secs(1);
const NIGHTLY_REPORT: Lock<str> = Lock::new("cron", INTERVAL);
const RUN_FOR: Duration = Duration::from_secs(5);

/// When each run started and ended, and whether it kept its lease throughout, from every
/// replica.
type Runs = Arc<Mutex<Vec<(Instant, Instant, bool)>>>;

async fn replica(id: usize, store: Store, job: String, started: Instant, runs: Runs) {
    let mut tick = interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    while started.elapsed() < RUN_FOR {
        tick.tick().await;
        let token = match NIGHTLY_REPORT.try_lock(&store, &job).await {
            Ok(Some(token)) => token,
            Ok(None) => continue,
            Err(error) => {
                eprintln!("replica {id}: lock store failed, skipping this tick: {error}");
                continue;
            }
        };
        let begun = Instant::now();
        let n = runs.lock().unwrap().len();
        let work = if n.is_multiple_of(2) {
            Duration::from_millis(200)
        } else {
            Duration::from_millis(1500)
        };
        println!(
            "{:>6.2} s  replica {id} runs the report ({} ms)",
            started.elapsed().as_secs_f64(),
            work.as_millis()
        );
        // Kept alive while the job works, however long that is.
        let held = token.keep_alive();
        let kept = held.run(sleep(work)).await.is_some();
        if !kept {
            eprintln!("replica {id}: the lease was lost while the report ran");
        }
        runs.lock().unwrap().push((begun, Instant::now(), kept));
        // Not released on purpose: the heartbeat stops, and the lease runs out one interval
        // after its last extension. Dropping a token does not touch the store.
        drop(held.into_token());
    }
}

/// What went wrong with `runs` (sorted by start), if anything.
fn check(runs: &[(Instant, Instant, bool)]) -> Result<(), String> {
    if runs.iter().any(|&(_, _, kept)| !kept) {
        return Err("a run lost its lease".into());
    }
    // A lease taken at `start` (sent a little before) ends no sooner than one interval later.
    let slack = Duration::from_millis(20);
    for pair in runs.windows(2) {
        let ((start, end, _), (next, _, _)) = (pair[0], pair[1]);
        if next < end {
            return Err(format!(
                "a run started {:?} before the last one ended",
                end - next
            ));
        }
        if next - start + slack < INTERVAL {
            return Err(format!("two runs started {:?} apart", next - start));
        }
    }
    // Short and long jobs in turn: about 3.8 s for four runs, plus the ticks' lateness.
    if runs.len() < 3 {
        return Err(format!("only {} runs", runs.len()));
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = match std::env::var("REDIS_URL") {
        Ok(url) => RedisStore::connect(&url).await?.into(),
        Err(_) => Store::memory(),
    };
    // One job name per run, so a Redis shared with earlier runs holds no stale lease.
    let job = format!("report-{}", std::process::id());
    let started = Instant::now();
    let runs = Runs::default();
    let replicas: Vec<_> = (0..3)
        .map(|id| {
            tokio::spawn(replica(
                id,
                store.clone(),
                job.clone(),
                started,
                runs.clone(),
            ))
        })
        .collect();
    for replica in replicas {
        replica.await?;
    }
    let mut runs = runs.lock().unwrap().clone();
    runs.sort();
    println!(
        "{} runs in {RUN_FOR:?} with a {INTERVAL:?} interval",
        runs.len()
    );
    if let Err(failure) = check(&runs) {
        eprintln!("FAILED: {failure}");
        std::process::exit(1);
    }
    Ok(())
}
