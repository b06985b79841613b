//! `PgStore` behind PgBouncer in transaction pooling mode (Debian's `pgbouncer`, two server
//! connections shared by every client connection): without
//! [`transaction_pooler`](tower_lease_postgres::PgStoreBuilder::transaction_pooler) the calls
//! fail (their named statements live on one server connection, the next transaction gets
//! another) and the sessions' settings stay on the server connections for other clients; with
//! it, replicas contending for locks, read-write locks and semaphores, with heartbeats, see no
//! error and exclusion holds, the server connections keep their defaults, a release in one
//! store wakes a waiter in another (its listener connects directly), and a part of the
//! conformance suite passes.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tower_lease::{Lock, RwLock, Semaphore, Store};
use tower_lease_harness::{PgBouncer, PgServer};
use tower_lease_postgres::PgStore;

const JOBS: Lock<str> = Lock::new("bouncer", Duration::from_millis(600));
const DOCS: RwLock<str> = RwLock::new("bouncer", Duration::from_millis(600));
const SLOTS: Semaphore<str> = Semaphore::new("bouncer", 2, Duration::from_millis(600));
/// How long the tasks contend.
const CONTEND_FOR: Duration = Duration::from_secs(4);
/// Server connections behind pgbouncer, shared by every client connection.
const SERVER_CONNECTIONS: usize = 2;

/// What contending tasks saw.
#[derive(Debug, Default)]
struct Outcome {
    errors: Vec<String>,
    acquisitions: usize,
    /// Times two holders were inside where one at most may be (or three permits of two).
    overlaps: usize,
    /// Leases their heartbeat lost while held.
    lost: usize,
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
async fn contend(stores: &[Store]) -> Outcome {
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
                let hold = Duration::from_millis(if round % 4 == 0 { 250 } else { 20 });
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
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
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

/// A server with the schema installed (directly), and pgbouncer in front of it.
async fn bouncer() -> (PgServer, PgBouncer) {
    let server = support::server().await;
    support::pg_store(&server).await;
    let bouncer = PgBouncer::start(&server, SERVER_CONNECTIONS);
    (server, bouncer)
}

/// The `statement_timeout` of each server connection behind `bouncer`, read by as many
/// clients inside a transaction at once (so each is on a server connection of its own).
async fn server_statement_timeouts(bouncer: &PgBouncer) -> Vec<String> {
    let mut clients = Vec::new();
    for _ in 0..SERVER_CONNECTIONS {
        let client = support::client(&bouncer.url()).await;
        client.batch_execute("BEGIN").await.expect("begin");
        clients.push(client);
    }
    let mut timeouts = Vec::new();
    for client in &clients {
        let rows = client
            .simple_query("SHOW statement_timeout")
            .await
            .expect("show statement_timeout");
        timeouts.extend(rows.iter().find_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        }));
    }
    for client in &clients {
        client.batch_execute("COMMIT").await.expect("commit");
    }
    timeouts
}

/// Today's store (named statements, session settings, `LISTEN` through the pooler) fails
/// behind a transaction pooler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_option_calls_fail_behind_the_pooler() {
    let (_server, bouncer) = bouncer().await;
    let mut stores = Vec::new();
    let mut connect_errors = Vec::new();
    for _ in 0..3 {
        match PgStore::connect(&bouncer.url()).await {
            Ok(store) => stores.push(Store::from(store)),
            Err(e) => connect_errors.push(chain(&e)),
        }
    }
    let outcome = if stores.is_empty() {
        Outcome::default()
    } else {
        contend(&stores).await
    };
    let timeouts = server_statement_timeouts(&bouncer).await;
    eprintln!(
        "connect errors: {connect_errors:?}\nacquisitions {}, overlaps {}, lost {}, {} errors, \
         the first: {:?}\nserver connections' statement_timeout: {timeouts:?}",
        outcome.acquisitions,
        outcome.overlaps,
        outcome.lost,
        outcome.errors.len(),
        outcome.errors.iter().take(5).collect::<Vec<_>>(),
    );
    assert!(
        !connect_errors.is_empty() || !outcome.errors.is_empty(),
        "named statements went through a transaction pooler unharmed"
    );
    assert!(
        timeouts.iter().any(|timeout| timeout != "0"),
        "no session setting stayed on a server connection: {timeouts:?}"
    );
}
