//! A job that must run at most once per interval across replicas: each replica's timer tries
//! the lease, and whoever takes it runs the job and *keeps* the lease, so the others find it
//! held until the interval is over.
//!
//! ```text
//! cargo run --example cron
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example cron
//! ```
//!
//! Three replicas tick every 500 ms for 7 s; the report runs about once every 2 s.

use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior, interval};
use tower_lease::{Lock, RedisStore, Store};

/// The TTL is the interval: a taken lease blocks the job for one interval.
const NIGHTLY_REPORT: Lock<str> = Lock::new("cron", Duration::from_secs(2));

async fn replica(id: usize, store: Store, job: String, started: Instant) -> usize {
    let mut tick = interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut runs = 0;
    while started.elapsed() < Duration::from_secs(7) {
        tick.tick().await;
        match NIGHTLY_REPORT.try_lock(&store, &job).await {
            Ok(Some(token)) => {
                runs += 1;
                println!(
                    "{:>6.2} s  replica {id} runs the report",
                    started.elapsed().as_secs_f64()
                );
                // Not released on purpose: the lease, not the job's duration, spaces the runs.
                // Dropping a token does not touch the store.
                drop(token);
            }
            Ok(None) => {}
            Err(error) => eprintln!("replica {id}: lock store failed, skipping this tick: {error}"),
        }
    }
    runs
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
    let replicas: Vec<_> = (0..3)
        .map(|id| tokio::spawn(replica(id, store.clone(), job.clone(), started)))
        .collect();
    let mut runs = 0;
    for replica in replicas {
        runs += replica.await?;
    }
    println!("{runs} runs in 7 s with a 2 s interval");
    if !(3..=4).contains(&runs) {
        eprintln!("FAILED: expected 3 or 4 runs");
        std::process::exit(1);
    }
    Ok(())
}
