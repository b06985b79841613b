//! Replicas contending through the pooler: a lock, a read-write lock and a semaphore taken,
//! held (past their heartbeats at times) and released by eight tasks, every error, overlap and
//! lost lease counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tower_lease::{Lock, RwLock, Semaphore, Store};

pub const JOBS: Lock<str> = Lock::new("bouncer", Duration::from_millis(600));
const DOCS: RwLock<str> = RwLock::new("bouncer", Duration::from_millis(600));
const SLOTS: Semaphore<str> = Semaphore::new("bouncer", 2, Duration::from_millis(600));
/// How long the tasks contend.
const CONTEND_FOR: Duration = Duration::from_secs(4);

/// What contending tasks saw.
#[derive(Debug, Default)]
pub struct Outcome {
    pub errors: Vec<String>,
    pub acquisitions: usize,
    /// Times two holders were inside where one at most may be (or three permits of two).
    pub overlaps: usize,
    /// Leases their heartbeat lost while held.
    pub lost: usize,
}

/// Who is inside each lock, counted by the tasks holding it.
#[derive(Default)]
struct Inside {
    lock: AtomicUsize,
    readers: AtomicUsize,
    writers: AtomicUsize,
    permits: AtomicUsize,
}

/// Eight tasks over `stores` take the lock, read and write the read-write lock and take
/// permits of the semaphore (hold times past a third of the TTL, so heartbeats extend them)
/// for [`CONTEND_FOR`]; every error, overlap and lost lease counted.
pub async fn contend(stores: &[Store]) -> Outcome {
    let inside = Arc::new(Inside::default());
    let deadline = Instant::now() + CONTEND_FOR;
    let mut tasks = Vec::new();
    for task in 0..8usize {
        let store = stores[task % stores.len()].clone();
        let inside = inside.clone();
        tasks.push(tokio::spawn(async move {
            let mut seen = Outcome::default();
            let mut round = 0usize;
            while Instant::now() < deadline {
                round += 1;
                let hold = Duration::from_millis(if round.is_multiple_of(4) { 250 } else { 20 });
                let answer = match (task + round) % 4 {
                    0 => hold_lock(&store, &inside, hold, &mut seen).await,
                    1 => hold_read(&store, &inside, hold, &mut seen).await,
                    2 => hold_write(&store, &inside, hold, &mut seen).await,
                    _ => hold_permit(&store, &inside, hold, &mut seen).await,
                };
                if let Err(e) = answer {
                    seen.errors.push(chain(&e));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            seen
        }));
    }
    let mut outcome = Outcome::default();
    for task in tasks {
        let seen = task.await.expect("a contending task");
        outcome.errors.extend(seen.errors);
        outcome.acquisitions += seen.acquisitions;
        outcome.overlaps += seen.overlaps;
        outcome.lost += seen.lost;
    }
    outcome
}

/// How long a task waits for what it takes.
const WAIT: Duration = Duration::from_secs(3);

/// `error` and each of its sources.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

async fn hold_lock(
    store: &Store,
    inside: &Inside,
    hold: Duration,
    seen: &mut Outcome,
) -> tower_lease::Result<()> {
    let Some(token) = JOBS.try_lock_for(store, "a", WAIT).await? else {
        return Ok(());
    };
    seen.acquisitions += 1;
    if inside.lock.fetch_add(1, Ordering::SeqCst) != 0 {
        seen.overlaps += 1;
    }
    let held = token.keep_alive();
    tokio::time::sleep(hold).await;
    inside.lock.fetch_sub(1, Ordering::SeqCst);
    if !held.is_held() {
        seen.lost += 1;
    }
    held.release().await?;
    Ok(())
}

async fn hold_read(
    store: &Store,
    inside: &Inside,
    hold: Duration,
    seen: &mut Outcome,
) -> tower_lease::Result<()> {
    let Some(token) = DOCS.try_read_for(store, "a", WAIT).await? else {
        return Ok(());
    };
    seen.acquisitions += 1;
    inside.readers.fetch_add(1, Ordering::SeqCst);
    if inside.writers.load(Ordering::SeqCst) != 0 {
        seen.overlaps += 1;
    }
    let held = token.keep_alive();
    tokio::time::sleep(hold).await;
    inside.readers.fetch_sub(1, Ordering::SeqCst);
    if !held.is_held() {
        seen.lost += 1;
    }
    held.release().await?;
    Ok(())
}

async fn hold_write(
    store: &Store,
    inside: &Inside,
    hold: Duration,
    seen: &mut Outcome,
) -> tower_lease::Result<()> {
    let Some(token) = DOCS.try_write_for(store, "a", WAIT).await? else {
        return Ok(());
    };
    seen.acquisitions += 1;
    if inside.writers.fetch_add(1, Ordering::SeqCst) != 0
        || inside.readers.load(Ordering::SeqCst) != 0
    {
        seen.overlaps += 1;
    }
    let held = token.keep_alive();
    tokio::time::sleep(hold).await;
    inside.writers.fetch_sub(1, Ordering::SeqCst);
    if !held.is_held() {
        seen.lost += 1;
    }
    held.release().await?;
    Ok(())
}

async fn hold_permit(
    store: &Store,
    inside: &Inside,
    hold: Duration,
    seen: &mut Outcome,
) -> tower_lease::Result<()> {
    let Some(permit) = SLOTS.try_acquire_for(store, "a", WAIT).await? else {
        return Ok(());
    };
    seen.acquisitions += 1;
    if inside.permits.fetch_add(1, Ordering::SeqCst) >= 2 {
        seen.overlaps += 1;
    }
    let held = permit.keep_alive();
    tokio::time::sleep(hold).await;
    inside.permits.fetch_sub(1, Ordering::SeqCst);
    if !held.is_held() {
        seen.lost += 1;
    }
    held.release().await?;
    Ok(())
}
