//! How a client process reaches the lock store: one Redis (through the fault proxy), the
//! primary that the sentinels name, with every lease acknowledged by a replica (`WAIT`), or
//! PostgreSQL through `tower-lease-postgres`'s `PgStore`; under `--broken-lock`, through the
//! [broken](crate::broken) backend.

use std::time::Duration;

use tower_lease::{RedisStore, Store};
use tower_lease_postgres::PgStore;

/// The connections each client process's `PgStore` pools (besides the one it listens on): the
/// ten processes of a history stay within the test server's `max_connections` (60), and one
/// process makes at most a few calls at once (the layer's server, three requests and their
/// heartbeats). A call waits for a connection within its timeout.
const PG_POOL: usize = 4;

/// Where the lock store is.
#[derive(Clone, Debug)]
pub enum Locks {
    /// One Redis at this URL.
    Url(String),
    /// The primary of the sentinels' master, found through these sentinels.
    Sentinel(Vec<String>),
    /// PostgreSQL at this URL, through `PgStore`.
    Postgres(String),
}

impl Locks {
    /// From the process's arguments: `--locks URL`, `--sentinels URL,URL,..` or
    /// `--postgres URL`.
    pub fn from_args(
        locks: Option<String>,
        sentinels: Option<String>,
        postgres: Option<String>,
    ) -> Self {
        match (locks, sentinels, postgres) {
            (_, _, Some(url)) => Locks::Postgres(url),
            (_, Some(urls), None) => Locks::Sentinel(urls.split(',').map(str::to_owned).collect()),
            (Some(url), None, None) => Locks::Url(url),
            (None, None, None) => panic!("--locks URL, --sentinels URLS or --postgres URL"),
        }
    }

    /// The arguments that [`from_args`](Self::from_args) reads back.
    pub fn to_args(&self) -> [String; 2] {
        match self {
            Locks::Url(url) => ["--locks".to_owned(), url.clone()],
            Locks::Sentinel(urls) => ["--sentinels".to_owned(), urls.join(",")],
            Locks::Postgres(url) => ["--postgres".to_owned(), url.clone()],
        }
    }
}

/// The store for leases of `ttl`, retried until it connects.
pub async fn connect(locks: &Locks, ttl: Duration, broken: bool) -> Store {
    loop {
        let store = match locks {
            Locks::Url(url) => RedisStore::connect(url)
                .await
                .map(|s| Store::from(s.timeout(call_timeout(ttl)))),
            // A lease counts once the replica has it, so a failover keeps it; a call waits for
            // that at most half its timeout.
            Locks::Sentinel(urls) => RedisStore::connect_sentinel(
                crate::sentinel::MASTER,
                urls.iter().map(String::as_str),
            )
            .await
            .map(|s| {
                let timeout = call_timeout(ttl);
                Store::from(s.timeout(timeout).wait_for_replicas(1, timeout / 2))
            }),
            // `connect` installs the schema (once, under an advisory lock, however many
            // processes start at once) and listens for releases on a connection of its own.
            Locks::Postgres(url) => PgStore::connect(url).await.map(|s| {
                s.pool().resize(PG_POOL);
                Store::from(s.timeout(call_timeout(ttl)))
            }),
        };
        match store {
            Ok(store) if broken => {
                let Locks::Url(url) = locks else {
                    panic!("the broken lock runs on one Redis")
                };
                let client = redis::Client::open(url.as_str()).expect("the lock store's URL");
                let raw = loop {
                    match redis::aio::ConnectionManager::new(client.clone()).await {
                        Ok(raw) => break raw,
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                };
                return crate::broken::broken(store, raw);
            }
            Ok(store) => return store,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Each store call's timeout: within the lease, so that two heartbeats can fail before it ends.
pub fn call_timeout(ttl: Duration) -> Duration {
    (ttl * 5 / 6).min(Duration::from_millis(1_000))
}

/// `ms` milliseconds of the timings made for 300 ms leases, stretched to leases of `ttl`.
pub fn scaled(ttl: Duration, ms: u64) -> Duration {
    Duration::from_millis(ms * ttl.as_millis() as u64 / 300)
}
