//! What the tests share: a server of their own, stores on it, a direct line to it.

#![allow(dead_code)]

use std::time::Duration;

use tower_lease::backend::{
    Acquisition, Backend, BoxFuture, Extended, LeaseRef, LockRef, Mode, NotificationSink,
};
use tower_lease::{Idempotency, IdempotencyKey, IdempotencyLayer, Result, Store};
use tower_lease_harness::PgServer;
use tower_lease_postgres::PgStore;
use tower_lease_testkit::Env;

pub mod pki;

/// Every table of the schema, for a truncate that loses all the store keeps.
const TABLES: &str = "tower_lease.locks, tower_lease.rwlocks, tower_lease.readers, \
     tower_lease.permits, tower_lease.idempotency, tower_lease.claims";

/// Starts a server, on the test's own thread: the server dies with the thread that started
/// it, and a runtime's blocking threads come and go.
pub async fn server() -> PgServer {
    PgServer::start()
}

/// A store on `server`, with its default options.
pub async fn pg_store(server: &PgServer) -> PgStore {
    PgStore::connect(&server.url())
        .await
        .expect("connect to the test postgres")
}

/// A store on the database at `url` with `timeout`, as a `Store`.
pub async fn pg_store_timeout(url: &str, timeout: Duration) -> Store {
    PgStore::connect(url)
        .await
        .expect("connect to the test postgres")
        .timeout(timeout)
        .into()
}

/// A direct connection to `url`, outside any store.
pub async fn client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect to the test postgres");
    tokio::spawn(connection);
    client
}

/// The test kit's `Env` on a fresh server: a store, a second one as another process would
/// make it, a look at the write intents, and `TRUNCATE` of every table as its data loss.
pub async fn testkit_env() -> Env {
    let server = server().await;
    let store: Store = pg_store(&server).await.into();
    let elsewhere: Store = pg_store(&server).await.into();
    env_on(&server.url(), store, elsewhere).holding(server)
}

/// The test kit's `Env` of `store` and `elsewhere` (another process's), whose intent probe and
/// data loss go to the database at `url` directly.
pub fn env_on(url: &str, store: Store, elsewhere: Store) -> Env {
    let probe_url = url.to_owned();
    let loss_url = url.to_owned();
    Env::new(store)
        .with_elsewhere(elsewhere)
        .with_intent_probe(move |namespace, name| {
            let (url, namespace, name) = (probe_url.clone(), namespace.to_owned(), name.to_vec());
            Box::pin(async move {
                let client = client(&url).await;
                client
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
                let client = client(&url).await;
                client
                    .batch_execute(&format!("TRUNCATE {TABLES}"))
                    .await
                    .expect("truncate");
            })
        })
}

/// How many leases (of every kind) are live in the database behind `url`.
pub async fn live_leases(url: &str) -> i64 {
    client(url)
        .await
        .query_one(
            "SELECT (SELECT count(*) FROM tower_lease.locks WHERE expires > clock_timestamp()) \
             + (SELECT count(*) FROM tower_lease.rwlocks WHERE writer_expires > clock_timestamp()) \
             + (SELECT count(*) FROM tower_lease.readers WHERE expires > clock_timestamp()) \
             + (SELECT count(*) FROM tower_lease.permits WHERE expires > clock_timestamp()) \
             + (SELECT count(*) FROM tower_lease.idempotency WHERE lease_expires > clock_timestamp())",
            &[],
        )
        .await
        .expect("count the live leases")
        .get(0)
}

/// A deadline a loaded 2-core machine keeps: the store's timeout and this much more.
pub const MARGIN: Duration = Duration::from_millis(400);

/// The `IdempotencyKey` a request with `key` runs under, under `idempotency`, as the layer
/// hands it to handlers.
pub async fn claimed_key(idempotency: Idempotency, key: &str) -> IdempotencyKey {
    use axum::routing::post;
    use axum::{Extension, Router};

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let app = Router::new()
        .route(
            "/key",
            post(move |Extension(key): Extension<IdempotencyKey>| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send(key);
                    "ok"
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(Store::memory(), idempotency));
    let addr = tower_lease_harness::http::serve(app).await;
    reqwest::Client::new()
        .post(format!("http://{addr}/key"))
        .header("idempotency-key", key)
        .send()
        .await
        .unwrap();
    rx.recv().await.unwrap()
}

/// A `PgStore` that counts its acquisitions: how often a waiter looked. Everything else, its
/// notifications and what they announce included, is the store's.
pub struct Counting {
    pub store: PgStore,
    pub acquisitions: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Backend for Counting {
    fn acquire<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Acquisition>> {
        self.acquisitions
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.store.acquire(lease)
    }
    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Extended>> {
        self.store.extend(lease)
    }
    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        self.store.release(lease)
    }
    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, Result<u32>> {
        self.store.in_use(lock)
    }
    fn notify_to(&self, sink: NotificationSink) -> bool {
        self.store.notify_to(sink)
    }
    fn announces_every_release(&self) -> bool {
        self.store.announces_every_release()
    }
    fn watch<'a>(&'a self, mode: Mode, ns: &'a str, name: &'a [u8]) -> BoxFuture<'a, Result<()>> {
        self.store.watch(mode, ns, name)
    }
    fn timeout(&self) -> Duration {
        Backend::timeout(&self.store)
    }
}

/// Holds `name` of `lock` in `holder`, lets `waiter` wait for it for 1.5 s (polling, 5 ms
/// backing off to 100 ms, would attempt about twenty times in it), releases it: answers how
/// many times the waiter looked (`looks` counts its attempts), and how long after the release
/// it got the lock.
pub async fn wait_for_release(
    lock: &tower_lease::Lock<str>,
    holder: &Store,
    waiter: &Store,
    looks: &std::sync::atomic::AtomicUsize,
    name: &str,
) -> (usize, Duration) {
    use std::sync::atomic::Ordering;
    const WAIT: Duration = Duration::from_millis(1500);
    let held = lock.try_lock(holder, name).await.unwrap().expect("free");
    let before = looks.load(Ordering::SeqCst);
    let waiting = {
        let (lock, waiter, name) = (*lock, waiter.clone(), name.to_owned());
        tokio::spawn(async move {
            let token = lock.try_lock_for(&waiter, &name, WAIT * 3).await.unwrap();
            (
                tokio::time::Instant::now(),
                token.expect("acquired once released"),
            )
        })
    };
    tokio::time::sleep(WAIT).await;
    let released = tokio::time::Instant::now();
    assert!(held.release().await.unwrap());
    let (got, token) = waiting.await.unwrap();
    assert!(token.release().await.unwrap());
    (looks.load(Ordering::SeqCst) - before, got - released)
}

/// `sql` with each call of a function of the schema (`tower_lease.lock_class(`) named as the
/// installed version's (`tower_lease.lock_class_v9(`), for statements that call them directly.
pub fn versioned(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 32);
    let mut rest = sql;
    while let Some(at) = rest.find("tower_lease.") {
        let after = at + "tower_lease.".len();
        out.push_str(&rest[..after]);
        rest = &rest[after..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        out.push_str(&rest[..end]);
        if rest[end..].starts_with('(') {
            out.push_str(&format!("_v{}", tower_lease_postgres::SCHEMA_VERSION));
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}
