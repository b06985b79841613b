//! Sessions whose default isolation is not read committed (`ALTER DATABASE … SET
//! default_transaction_isolation`, `ALTER ROLE … SET`, a pool's own settings): the calls take
//! the name's lock and then read its rows, so they must read what committed while they waited.
//! Many replicas contend on one name, on pools the store makes (`connect`) and on pools of the
//! application (`from_pool`): a semaphore never admits more than its permits, a reader never
//! enters beside a writer, nobody holds a lock beside another, and no call fails (a
//! serialization error is a failure too); replicas install the schema at once; a call cut off
//! mid-way leaves no transaction open on its connection.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use tower_lease::{Lock, RwLock, Semaphore, Store};
use tower_lease_harness::PgServer;
use tower_lease_postgres::deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tower_lease_postgres::tokio_postgres::NoTls;
use tower_lease_postgres::{PgStore, PgWarning};

const TTL: Duration = Duration::from_secs(10);
const PERMITS: u32 = 2;
const SLOTS: Semaphore<str> = Semaphore::new("slots", PERMITS, TTL);
const DOCS: RwLock<str> = RwLock::new("docs", TTL);
const JOBS: Lock<str> = Lock::new("jobs", TTL);

/// Replicas, and tasks on each: every task tries again at once, so calls queue on the name's
/// lock.
const REPLICAS: usize = 4;
const TASKS: usize = 4;
/// How long the tasks contend.
const CONTENTION: Duration = Duration::from_millis(1500);

/// How the replicas' pools are made.
#[derive(Clone, Copy, Debug)]
enum Pools {
    /// `PgStore::connect`.
    Connect,
    /// The application's pool, given to `PgStore::from_pool`.
    FromPool,
}

/// Sets the default isolation of every new session, as an operator would: `ALTER DATABASE` for
/// repeatable read, `ALTER ROLE` for serializable.
async fn default_isolation(server: &PgServer, isolation: &str) {
    let sql = match isolation {
        "serializable" => {
            format!("ALTER ROLE postgres SET default_transaction_isolation = '{isolation}'")
        }
        _ => format!("ALTER DATABASE postgres SET default_transaction_isolation = '{isolation}'"),
    };
    let client = support::client(&server.url()).await;
    client
        .batch_execute(&sql)
        .await
        .expect("set the default isolation");
    // A new session has it.
    let client = support::client(&server.url()).await;
    let found: String = client
        .query_one("SELECT current_setting('transaction_isolation')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(found, isolation);
}

/// An application's pool on `url`, as `deadpool-postgres` builds one.
fn app_pool(url: &str, size: usize) -> Pool {
    let manager = Manager::from_config(
        url.parse().expect("a URL"),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager).max_size(size).build().unwrap()
}

async fn replica(url: &str, pools: Pools) -> PgStore {
    let store = match pools {
        Pools::Connect => PgStore::connect(url).await,
        Pools::FromPool => PgStore::from_pool(app_pool(url, 8)).await,
    };
    // A loaded 2-core machine: a call never waits this long but for a bug.
    store
        .expect("the replica connects")
        .timeout(Duration::from_secs(5))
}

/// Replicas on a fresh server whose sessions default to `isolation`.
async fn replicas(isolation: &str, pools: Pools) -> (PgServer, Vec<Store>) {
    let server = support::server().await;
    let url = server.url();
    // The schema first, at the server's defaults: the contention tests are about the calls.
    drop(support::pg_store(&server).await);
    default_isolation(&server, isolation).await;
    let mut stores = Vec::new();
    for _ in 0..REPLICAS {
        stores.push(replica(&url, pools).await.into());
    }
    (server, stores)
}

/// What the contending tasks saw.
#[derive(Default)]
struct Seen {
    /// Holders now: `[readers or permits or lock holders, writers]`.
    holding: [AtomicUsize; 2],
    /// The most holders seen at once, and whether a reader and a writer were seen together.
    most: AtomicUsize,
    most_writers: AtomicUsize,
    beside: AtomicUsize,
    acquired: AtomicUsize,
    errors: std::sync::Mutex<Vec<String>>,
}

impl Seen {
    fn error(&self, e: tower_lease::Error) {
        self.errors.lock().unwrap().push(chain(&e));
    }

    /// Counts a holder in (`writer`: of the second kind); counted after the acquisition answered
    /// and out before the release is sent, so an overlap seen here is an overlap in the store.
    fn enter(&self, writer: bool) {
        self.acquired.fetch_add(1, Ordering::SeqCst);
        let (mine, other) = if writer { (1, 0) } else { (0, 1) };
        let now = self.holding[mine].fetch_add(1, Ordering::SeqCst) + 1;
        if writer {
            self.most_writers.fetch_max(now, Ordering::SeqCst);
        } else {
            self.most.fetch_max(now, Ordering::SeqCst);
        }
        if self.holding[other].load(Ordering::SeqCst) > 0 {
            self.beside.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn leave(&self, writer: bool) {
        self.holding[usize::from(writer)].fetch_sub(1, Ordering::SeqCst);
    }

    /// The errors, the first few of them.
    fn no_errors(&self) {
        let errors = self.errors.lock().unwrap();
        assert!(
            errors.is_empty(),
            "{} calls failed, the first: {:?}",
            errors.len(),
            &errors[..errors.len().min(3)]
        );
    }

    fn made_progress(&self) {
        let acquired = self.acquired.load(Ordering::SeqCst);
        assert!(
            acquired >= 10,
            "only {acquired} acquisitions in {CONTENTION:?}"
        );
    }
}

/// An error and its sources, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut words = e.to_string();
    let mut source = e.source();
    while let Some(e) = source {
        words.push_str(&format!(": {e}"));
        source = e.source();
    }
    words
}

/// A short hold, as a task does its work.
async fn hold() {
    tokio::time::sleep(Duration::from_millis(3)).await;
}

/// Runs `task(store, task index)` on every task of every replica until the contention ends.
async fn contend<F, Fut>(stores: &[Store], task: F)
where
    F: Fn(Store, usize) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut running = Vec::new();
    for (r, store) in stores.iter().enumerate() {
        for t in 0..TASKS {
            running.push(tokio::spawn(task(store.clone(), r * TASKS + t)));
        }
    }
    for task in running {
        task.await.expect("a contending task panicked");
    }
}

async fn semaphore(isolation: &str, pools: Pools) {
    let (_server, stores) = replicas(isolation, pools).await;
    let seen = Arc::new(Seen::default());
    let until = Instant::now() + CONTENTION;
    contend(&stores, |store, _| {
        let seen = seen.clone();
        async move {
            while Instant::now() < until {
                match SLOTS.try_acquire(&store, "export").await {
                    Ok(Some(permit)) => {
                        seen.enter(false);
                        hold().await;
                        seen.leave(false);
                        if let Err(e) = permit.release().await {
                            seen.error(e);
                        }
                    }
                    Ok(None) => tokio::task::yield_now().await,
                    Err(e) => seen.error(e),
                }
            }
        }
    })
    .await;
    let most = seen.most.load(Ordering::SeqCst);
    assert!(
        most <= PERMITS as usize,
        "{most} permits held at once of a semaphore of {PERMITS} ({isolation}, {pools:?})"
    );
    seen.no_errors();
    seen.made_progress();
}

async fn rwlock(isolation: &str, pools: Pools) {
    let (_server, stores) = replicas(isolation, pools).await;
    let seen = Arc::new(Seen::default());
    let until = Instant::now() + CONTENTION;
    contend(&stores, |store, task| {
        let seen = seen.clone();
        // One task in four writes.
        let writer = task % 4 == 0;
        async move {
            while Instant::now() < until {
                let taken = if writer {
                    DOCS.try_write(&store, "catalog")
                        .await
                        .map(|t| t.map(|t| t.release().boxed()))
                } else {
                    DOCS.try_read(&store, "catalog")
                        .await
                        .map(|t| t.map(|t| t.release().boxed()))
                };
                match taken {
                    Ok(Some(release)) => {
                        seen.enter(writer);
                        hold().await;
                        seen.leave(writer);
                        if let Err(e) = release.await {
                            seen.error(e);
                        }
                    }
                    Ok(None) => tokio::task::yield_now().await,
                    Err(e) => seen.error(e),
                }
            }
        }
    })
    .await;
    let beside = seen.beside.load(Ordering::SeqCst);
    assert_eq!(
        beside, 0,
        "{beside} times a reader and a writer held at once ({isolation}, {pools:?})"
    );
    let writers = seen.most_writers.load(Ordering::SeqCst);
    assert!(
        writers <= 1,
        "{writers} writers at once ({isolation}, {pools:?})"
    );
    seen.no_errors();
    seen.made_progress();
}

async fn lock(isolation: &str, pools: Pools) {
    let (_server, stores) = replicas(isolation, pools).await;
    let seen = Arc::new(Seen::default());
    let until = Instant::now() + CONTENTION;
    contend(&stores, |store, _| {
        let seen = seen.clone();
        async move {
            while Instant::now() < until {
                match JOBS.try_lock(&store, "nightly").await {
                    Ok(Some(token)) => {
                        seen.enter(false);
                        hold().await;
                        seen.leave(false);
                        if let Err(e) = token.release().await {
                            seen.error(e);
                        }
                    }
                    Ok(None) => tokio::task::yield_now().await,
                    Err(e) => seen.error(e),
                }
            }
        }
    })
    .await;
    let most = seen.most.load(Ordering::SeqCst);
    assert!(
        most <= 1,
        "{most} holders of one lock at once ({isolation}, {pools:?})"
    );
    seen.no_errors();
    seen.made_progress();
}

macro_rules! contended {
    ($($test:ident: $scenario:ident($isolation:literal, $pools:ident);)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            $scenario($isolation, Pools::$pools).await;
        }
    )*};
}

contended! {
    a_semaphore_never_over_admits_under_repeatable_read: semaphore("repeatable read", Connect);
    a_semaphore_never_over_admits_under_serializable: semaphore("serializable", Connect);
    a_semaphore_on_your_pool_never_over_admits_under_repeatable_read: semaphore("repeatable read", FromPool);
    a_semaphore_on_your_pool_never_over_admits_under_serializable: semaphore("serializable", FromPool);
    a_reader_never_enters_beside_a_writer_under_repeatable_read: rwlock("repeatable read", Connect);
    a_reader_never_enters_beside_a_writer_under_serializable: rwlock("serializable", Connect);
    a_reader_on_your_pool_never_enters_beside_a_writer_under_repeatable_read: rwlock("repeatable read", FromPool);
    a_reader_on_your_pool_never_enters_beside_a_writer_under_serializable: rwlock("serializable", FromPool);
    a_contended_lock_answers_without_errors_under_repeatable_read: lock("repeatable read", Connect);
    a_contended_lock_answers_without_errors_under_serializable: lock("serializable", Connect);
    a_contended_lock_on_your_pool_answers_without_errors_under_repeatable_read: lock("repeatable read", FromPool);
    a_contended_lock_on_your_pool_answers_without_errors_under_serializable: lock("serializable", FromPool);
}

/// Replicas that start at once install the schema once, also when their sessions default to
/// repeatable read: the installer reads what the one before it installed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_install_the_schema_at_once_under_repeatable_read() {
    for pools in [Pools::Connect, Pools::FromPool] {
        let server = support::server().await;
        default_isolation(&server, "repeatable read").await;
        let url = server.url();
        let connects = (0..8).map(|_| replica(&url, pools));
        let stores: Vec<Store> = futures_util::future::join_all(connects)
            .await
            .into_iter()
            .map(Store::from)
            .collect();
        let token = JOBS.try_lock(&stores[0], "x").await.unwrap().expect("free");
        for store in &stores[1..] {
            assert!(JOBS.try_lock(store, "x").await.unwrap().is_none());
        }
        assert!(token.release().await.unwrap());
    }
}

/// A call on an application's pool cut off by the store's deadline, while it waited for the
/// name's lock inside its transaction, leaves no transaction open on the connection it gives
/// back: the next checkout of the pool's one connection runs at the session's default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_cut_off_leaves_no_transaction_open() {
    let server = support::server().await;
    drop(support::pg_store(&server).await);
    default_isolation(&server, "repeatable read").await;
    let store = PgStore::from_pool(app_pool(&server.url(), 1))
        .await
        .unwrap()
        .timeout(Duration::from_millis(300));
    let pool = store.pool().clone();
    let store: Store = store.into();
    let permit = SLOTS
        .try_acquire(&store, "cut")
        .await
        .unwrap()
        .expect("free");
    // Another session holds the name's lock: the extension waits for it past its deadline.
    let mut holder = support::client(&server.url()).await;
    let tx = holder.transaction().await.unwrap();
    tx.execute(
        &support::versioned(
            "SELECT pg_advisory_xact_lock(tower_lease.lock_class(), \
             tower_lease.name_key('p', 'slots', 'cut'::bytea))",
        ),
        &[],
    )
    .await
    .unwrap();
    let cut = permit.extend().await;
    assert!(
        matches!(cut, Err(tower_lease::Error::Timeout(_))),
        "the extension waits past its deadline: {cut:?}"
    );
    tx.commit().await.unwrap();
    let client = pool.get().await.unwrap();
    let isolation: String = client
        .query_one("SELECT current_setting('transaction_isolation')", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        isolation, "repeatable read",
        "a transaction of the store left open"
    );
    drop(client);
    assert!(permit.release().await.unwrap(), "the store goes on");
}

/// `check` notes sessions that default to another isolation on an application's pool, and not
/// on the store's own (which sets read committed on each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_notes_the_default_isolation() {
    let server = support::server().await;
    drop(support::pg_store(&server).await);
    default_isolation(&server, "repeatable read").await;
    let own = replica(&server.url(), Pools::Connect).await;
    assert!(
        !own.check()
            .await
            .unwrap()
            .iter()
            .any(|w| matches!(w, PgWarning::DefaultIsolation { .. })),
        "the store's own sessions default to read committed"
    );
    let yours = replica(&server.url(), Pools::FromPool).await;
    let found = yours.check().await.unwrap();
    assert!(
        found.contains(&PgWarning::DefaultIsolation {
            default: "repeatable read".into()
        }),
        "{found:?}"
    );
}
