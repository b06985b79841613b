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
use tower_lease::backend::{
    Acquisition, Backend, BoxFuture, Extended, LeaseRef, LockRef, Mode, NotificationSink,
};
use tower_lease::{Lock, RwLock, Semaphore, Store};
use tower_lease_harness::{PgBouncer, PgServer};
use tower_lease_postgres::PgStore;
use tower_lease_testkit::Env;

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

/// A store through `bouncer` with the option, listening on the server directly.
async fn pooled_store(bouncer: &PgBouncer, server: &PgServer) -> PgStore {
    let direct: tokio_postgres::Config = server.url().parse().expect("the server's URL");
    PgStore::builder()
        .transaction_pooler(true)
        .connect(&bouncer.url())
        .await
        .expect("connect through pgbouncer")
        .listen(direct)
}

/// With the option, three replicas through the pooler contend for a lock, a read-write lock
/// and a semaphore, holding past their heartbeats: no error, no overlap, no lost lease, and
/// the server connections keep their defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_option_replicas_contend_without_error() {
    let (server, bouncer) = bouncer().await;
    let mut stores = Vec::new();
    for _ in 0..3 {
        stores.push(Store::from(pooled_store(&bouncer, &server).await));
    }
    let outcome = contend(&stores).await;
    eprintln!(
        "acquisitions {}, overlaps {}, lost {}, errors {:?}",
        outcome.acquisitions, outcome.overlaps, outcome.lost, outcome.errors
    );
    assert!(outcome.errors.is_empty(), "errors: {:?}", outcome.errors);
    assert_eq!(outcome.overlaps, 0, "two holders inside at once");
    assert_eq!(outcome.lost, 0, "a heartbeat lost a held lease");
    // Eight tasks for 4 s with holds of 20 ms to 250 ms: far more than this, even loaded.
    assert!(
        outcome.acquisitions >= 40,
        "only {} acquisitions",
        outcome.acquisitions
    );
    assert_eq!(
        server_statement_timeouts(&bouncer).await,
        vec!["0"; SERVER_CONNECTIONS],
        "a store's setting stayed on a server connection"
    );
}

/// A `PgStore` that counts its acquisitions: how often a waiter looked.
struct Counting {
    store: PgStore,
    acquisitions: Arc<AtomicUsize>,
}

impl Backend for Counting {
    fn acquire<'a>(
        &'a self,
        lease: LeaseRef<'a>,
    ) -> BoxFuture<'a, tower_lease::Result<Acquisition>> {
        self.acquisitions.fetch_add(1, Ordering::SeqCst);
        self.store.acquire(lease)
    }
    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, tower_lease::Result<Extended>> {
        self.store.extend(lease)
    }
    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, tower_lease::Result<bool>> {
        self.store.release(lease)
    }
    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, tower_lease::Result<u32>> {
        self.store.in_use(lock)
    }
    fn notify_to(&self, sink: NotificationSink) -> bool {
        self.store.notify_to(sink)
    }
    fn watch<'a>(
        &'a self,
        mode: Mode,
        ns: &'a str,
        name: &'a [u8],
    ) -> BoxFuture<'a, tower_lease::Result<()>> {
        self.store.watch(mode, ns, name)
    }
    fn timeout(&self) -> Duration {
        Backend::timeout(&self.store)
    }
}

/// A release through the pooler in one store wakes a waiter in another, whose listener
/// connects to the server directly: it looks a few times, not every 100 ms of a poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_through_the_pooler_wakes_a_waiter_listening_directly() {
    const WAITED: Lock<str> = Lock::new("bouncer-wait", Duration::from_secs(5));
    let (server, bouncer) = bouncer().await;
    let holder: Store = pooled_store(&bouncer, &server).await.into();
    let looks = Arc::new(AtomicUsize::new(0));
    let waiter = Store::from_backend(Counting {
        store: pooled_store(&bouncer, &server).await,
        acquisitions: looks.clone(),
    });
    // Both listeners are up before the first release.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for name in ["a", "b"] {
        let held = WAITED.try_lock(&holder, name).await.unwrap().expect("free");
        let before = looks.load(Ordering::SeqCst);
        let waiting = {
            let (waiter, name) = (waiter.clone(), name.to_owned());
            tokio::spawn(async move {
                let token = WAITED
                    .try_lock_for(&waiter, &name, Duration::from_secs(10))
                    .await
                    .unwrap();
                (Instant::now(), token.expect("acquired once released"))
            })
        };
        // Polling (5 ms backing off to 100 ms) would look about twenty times meanwhile.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let released = Instant::now();
        assert!(held.release().await.unwrap());
        let (got, token) = waiting.await.unwrap();
        assert!(token.release().await.unwrap());
        let (looked, after) = (looks.load(Ordering::SeqCst) - before, got - released);
        // The first attempt, a look once watching, the woken one; a fallback look a second.
        assert!(looked <= 5, "the waiter polled: {looked} attempts");
        assert!(
            after < Duration::from_millis(500),
            "woken {after:?} after the release"
        );
    }
}

/// The test kit's `Env` through the pooler with the option: both stores through it, listening
/// directly; the intent probe and the data loss on the server directly.
async fn pooled_env() -> Env {
    let (server, bouncer) = bouncer().await;
    let url = server.url();
    let store: Store = pooled_store(&bouncer, &server).await.into();
    let elsewhere: Store = pooled_store(&bouncer, &server).await.into();
    let (probe_url, loss_url) = (url.clone(), url);
    Env::new(store)
        .with_elsewhere(elsewhere)
        .with_intent_probe(move |namespace, name| {
            let (url, namespace, name) = (probe_url.clone(), namespace.to_owned(), name.to_vec());
            Box::pin(async move {
                support::client(&url)
                    .await
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM tower_lease.rwlocks WHERE namespace = $1 \
                         AND name = $2 AND intent_expires > clock_timestamp())",
                        &[&namespace, &name],
                    )
                    .await
                    .expect("look at the intents")
                    .get(0)
            })
        })
        .with_data_loss(move || {
            let url = loss_url.clone();
            Box::pin(async move {
                support::client(&url)
                    .await
                    .batch_execute(
                        "TRUNCATE tower_lease.locks, tower_lease.rwlocks, tower_lease.readers, \
                         tower_lease.permits, tower_lease.idempotency, tower_lease.claims",
                    )
                    .await
                    .expect("truncate");
            })
        })
        .holding((bouncer, server))
}

/// A part of the conformance suite through the pooler: one scenario or two of each kind.
mod conformance {
    use super::pooled_env;

    macro_rules! through_the_pooler {
        ($($module:ident::$name:ident),* $(,)?) => {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    tower_lease_testkit::$module::$name(pooled_env().await).await
                }
            )*
        };
    }

    through_the_pooler!(
        exclusive::mutual_exclusion,
        exclusive::stale_release_leaves_next_holder_alone,
        exclusive::fences_increase_per_name,
        rw::writer_excludes_everyone,
        rw::readers_block_writer_until_released,
        semaphore::permits_up_to_the_limit,
        semaphore::a_waiter_gets_the_slot_a_release_frees,
        idempotency::complete_then_replay_or_mismatch,
        fairness::waiters_side_by_side_in_one_process_all_hear_their_release,
        fairness::writers_queued_in_one_process_hand_on_promptly,
    );
}
