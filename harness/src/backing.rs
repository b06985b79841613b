//! What a test runs against, its [`Backing`]: a store on a fresh `redis-server`, on a local Redis
//! Cluster, through sentinels or in memory, and for Redis a direct line to look behind the
//! store's back. `store_tests!` declares one test per store for each scenario. (The test kit's
//! `Env` is another thing: what its conformance scenarios are handed.)

use std::time::Duration;

use redis::FromRedisValue;
use tower_lease::store::{KeyLayout, KeyRole};
use tower_lease::{RedisStore, Store};

use crate::server::{Endpoint, RedisServer};

/// The timeout of every store call in the layer's tests: short, so failure tests stay fast.
pub const STORE_TIMEOUT: Duration = Duration::from_millis(500);

/// How a test's store talks to Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setup {
    /// `RedisStore::new` with the defaults over one multiplexed connection, as the core's
    /// conformance suite runs it (in memory: under paused time).
    Core,
    /// A `RedisStore` with the short [`STORE_TIMEOUT`], over a `ConnectionManager` on a single
    /// server: as a service behind the layer runs it.
    Layer,
}

/// A store, and for Redis the servers behind it (stopped when this drops) and a [`Raw`] line to
/// them.
pub struct Backing {
    pub store: Store,
    /// The single server behind the store, for tests that stop it.
    pub server: Option<RedisServer>,
    raw: Option<Raw>,
    #[cfg(feature = "cluster")]
    _cluster: Option<crate::cluster::RedisCluster>,
    #[cfg(feature = "sentinel")]
    sentinel: Option<crate::sentinel::Topology>,
    #[cfg(feature = "postgres")]
    postgres: Option<crate::postgres::PgServer>,
}

impl Backing {
    /// A store in this process's memory.
    pub fn memory() -> Self {
        Backing {
            store: Store::memory(),
            server: None,
            raw: None,
            #[cfg(feature = "cluster")]
            _cluster: None,
            #[cfg(feature = "sentinel")]
            sentinel: None,
            #[cfg(feature = "postgres")]
            postgres: None,
        }
    }

    /// A store on a fresh `redis-server`.
    pub async fn redis(setup: Setup) -> Self {
        let server = RedisServer::start();
        let conn = server.connection().await;
        let store = match setup {
            Setup::Core => Store::from(RedisStore::new(conn.clone())),
            Setup::Layer => RedisStore::new(server.connection_manager().await)
                .timeout(STORE_TIMEOUT)
                .into(),
        };
        Backing {
            store,
            server: Some(server),
            raw: Some(Raw {
                conn: RawConn::Single(conn),
                layout: KeyLayout::default(),
            }),
            #[cfg(feature = "cluster")]
            _cluster: None,
            #[cfg(feature = "sentinel")]
            sentinel: None,
            #[cfg(feature = "postgres")]
            postgres: None,
        }
    }

    /// A store on a local 3-master Redis Cluster: the tests' names hash to slots on every node.
    #[cfg(feature = "cluster")]
    pub async fn cluster(setup: Setup) -> Self {
        let cluster = crate::cluster::RedisCluster::start();
        let conn = cluster.connection().await;
        let store = match setup {
            Setup::Core => Store::from(RedisStore::new(conn.clone())),
            Setup::Layer => RedisStore::new(conn.clone()).timeout(STORE_TIMEOUT).into(),
        };
        Backing {
            store,
            server: None,
            raw: Some(Raw {
                conn: RawConn::Cluster(conn),
                layout: KeyLayout::default(),
            }),
            _cluster: Some(cluster),
            #[cfg(feature = "sentinel")]
            sentinel: None,
            #[cfg(feature = "postgres")]
            postgres: None,
        }
    }

    /// A store through three sentinels watching a primary and its replica: it finds the
    /// primary through them and waits for the replica's acknowledgement of each acquisition
    /// (`wait_for_replicas(1, 300 ms)`), as a replicated deployment runs it.
    #[cfg(feature = "sentinel")]
    pub async fn sentinel() -> Self {
        use crate::Endpoint;
        let topology =
            crate::sentinel::Topology::with_sentinels(crate::sentinel::Link::Direct).await;
        let store = Self::through_sentinels(&topology).await;
        let conn = topology.primary.connection().await;
        Backing {
            store,
            server: None,
            raw: Some(Raw {
                conn: RawConn::Single(conn),
                layout: KeyLayout::default(),
            }),
            #[cfg(feature = "cluster")]
            _cluster: None,
            sentinel: Some(topology),
            #[cfg(feature = "postgres")]
            postgres: None,
        }
    }

    /// A `PgStore` on a fresh PostgreSQL server (with the short [`STORE_TIMEOUT`] under
    /// [`Setup::Layer`]).
    #[cfg(feature = "postgres")]
    pub async fn postgres(setup: Setup) -> Self {
        let server = crate::postgres::PgServer::start();
        let store = tower_lease_postgres::PgStore::connect(&server.url())
            .await
            .expect("a PgStore on the fresh server");
        let store = match setup {
            Setup::Core => store,
            Setup::Layer => store.timeout(STORE_TIMEOUT),
        };
        Backing {
            store: store.into(),
            server: None,
            raw: None,
            #[cfg(feature = "cluster")]
            _cluster: None,
            #[cfg(feature = "sentinel")]
            sentinel: None,
            postgres: Some(server),
        }
    }

    #[cfg(feature = "sentinel")]
    async fn through_sentinels(topology: &crate::sentinel::Topology) -> Store {
        let replicated = Duration::from_millis(300);
        let store = topology.through_sentinels().await;
        store
            .wait_for_replicas(1, replicated)
            .timeout(STORE_TIMEOUT)
            .into()
    }

    /// A second store on the same Redis with release notifications, as `RedisStore::connect`
    /// (`connect_cluster`, `connect_sentinel`) makes it for another process; `None` in memory.
    pub async fn notified(&self) -> Option<Store> {
        #[cfg(feature = "postgres")]
        if let Some(server) = &self.postgres {
            let store = tower_lease_postgres::PgStore::connect(&server.url()).await;
            return Some(store.expect("a second PgStore").into());
        }
        #[cfg(feature = "sentinel")]
        if let Some(topology) = &self.sentinel {
            return Some(Self::through_sentinels(topology).await);
        }
        #[cfg(feature = "cluster")]
        if let Some(cluster) = &self._cluster {
            let store = RedisStore::connect_cluster(cluster.urls()).await.unwrap();
            return Some(store.into());
        }
        let server = self.server.as_ref()?;
        Some(RedisStore::connect(&server.url()).await.unwrap().into())
    }

    /// Pauses the writes of every client on every server behind the store for `ms`
    /// (`CLIENT PAUSE ms WRITE`): their write commands and scripts queue, and run when the
    /// pause ends, as on a slow or stalled Redis. Reads and this call's own line go on.
    pub async fn pause_writes(&self, ms: u64) {
        let servers: Vec<&RedisServer> = self.server.iter().collect();
        #[cfg(feature = "cluster")]
        let servers = {
            let mut servers = servers;
            if let Some(cluster) = &self._cluster {
                servers.extend(cluster.nodes());
            }
            servers
        };
        assert!(!servers.is_empty(), "this test runs on Redis only");
        for server in servers {
            let mut conn = server.connection().await;
            let pause = redis::cmd("CLIENT")
                .arg("PAUSE")
                .arg(ms)
                .arg("WRITE")
                .clone();
            let () = pause.query_async(&mut conn).await.unwrap();
        }
    }

    /// Takes the exclusive lease of `name` in `namespace` away behind the store's back, as an
    /// eviction or a failover that lost it would; `true` if one was held. On a single Redis,
    /// the cluster or Postgres.
    pub async fn steal_lock(&self, namespace: &str, name: &[u8]) -> bool {
        #[cfg(feature = "postgres")]
        if let Some(server) = &self.postgres {
            let (client, connection) = tower_lease_postgres::tokio_postgres::connect(
                &server.url(),
                tower_lease_postgres::tokio_postgres::NoTls,
            )
            .await
            .expect("a line to the test's Postgres");
            tokio::spawn(connection);
            let taken = client
                .execute(
                    "UPDATE tower_lease.locks SET secret = NULL \
                     WHERE namespace = $1 AND name = $2 AND secret IS NOT NULL",
                    &[&namespace, &name],
                )
                .await
                .expect("the lock's row");
            return taken == 1;
        }
        self.raw().delete(KeyRole::Lock, namespace, name).await
    }

    /// Stops the single server behind the store (Redis or Postgres), as a crash would.
    pub fn stop_server(&mut self) {
        #[cfg(feature = "postgres")]
        if let Some(server) = &mut self.postgres {
            server.stop();
            return;
        }
        self.server.as_mut().expect("a single server").stop();
    }

    /// Whether the store is on Redis (a single server or the cluster).
    pub fn is_redis(&self) -> bool {
        self.raw.is_some()
    }

    /// The direct line to Redis, for a test (or a part of one) that runs on Redis only.
    pub fn raw(&self) -> &Raw {
        self.raw.as_ref().expect("this test runs on Redis only")
    }
}

/// A direct line to the Redis behind a store, and the store's key layout.
#[derive(Clone)]
pub struct Raw {
    conn: RawConn,
    layout: KeyLayout,
}

#[derive(Clone)]
enum RawConn {
    Single(redis::aio::MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Raw {
    /// Runs `cmd` on the Redis behind the store, a single server or the cluster.
    pub async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let result = match &self.conn {
            RawConn::Single(conn) => cmd.query_async(&mut conn.clone()).await,
            #[cfg(feature = "cluster")]
            RawConn::Cluster(conn) => cmd.query_async(&mut conn.clone()).await,
        };
        result.unwrap_or_else(|e| panic!("raw redis command failed: {e}"))
    }

    /// How many times the server (every node of a cluster) ran `command`, from
    /// `INFO commandstats`; commands a script runs count too.
    pub async fn command_calls(&self, command: &str) -> u64 {
        let info: redis::Value = self.query(redis::cmd("INFO").arg("commandstats")).await;
        let mut texts = Vec::new();
        match info {
            redis::Value::Map(nodes) => {
                texts.extend(nodes.into_iter().map(|(_, text)| text));
            }
            text => texts.push(text),
        }
        let field = format!("cmdstat_{}:calls=", command.to_lowercase());
        texts
            .into_iter()
            .map(|text| redis::from_redis_value::<String>(text).expect("INFO answers text"))
            .flat_map(|text| {
                text.lines().find_map(|line| {
                    let rest = line.strip_prefix(&field)?;
                    rest.split(',').next()?.parse::<u64>().ok()
                })
            })
            .sum()
    }

    /// A second store over the same Redis, with another key prefix.
    pub fn store_with_prefix(&self, prefix: &str) -> Store {
        match &self.conn {
            RawConn::Single(conn) => RedisStore::new(conn.clone()).prefix(prefix).into(),
            #[cfg(feature = "cluster")]
            RawConn::Cluster(conn) => RedisStore::new(conn.clone()).prefix(prefix).into(),
        }
    }

    /// The key of a lease's `role` under the default prefix.
    pub fn key(&self, role: KeyRole, namespace: &str, name: &[u8]) -> Vec<u8> {
        self.layout.key(role, namespace, name)
    }

    /// PTTL of a key, in ms (-2 when it does not exist).
    pub async fn pttl(&self, key: &[u8]) -> i64 {
        self.query(redis::cmd("PTTL").arg(key)).await
    }

    pub async fn exists(&self, key: &[u8]) -> bool {
        self.query::<i64>(redis::cmd("EXISTS").arg(key)).await == 1
    }

    /// Deletes a lease's key behind the store's back; `true` if it was there.
    pub async fn delete(&self, role: KeyRole, namespace: &str, name: &[u8]) -> bool {
        let key = self.key(role, namespace, name);
        self.query::<i64>(redis::cmd("DEL").arg(key)).await == 1
    }

    /// The raw value of a lease's key.
    pub async fn get(&self, role: KeyRole, namespace: &str, name: &[u8]) -> Option<Vec<u8>> {
        let key = self.key(role, namespace, name);
        self.query(redis::cmd("GET").arg(key)).await
    }
}

/// The Postgres arm of [`store_tests!`]: `on_postgres`, where the harness has the `postgres`
/// feature (decided here, in the harness: a `cfg` in `store_tests!` would test the caller's
/// features).
#[cfg(feature = "postgres")]
#[doc(hidden)]
#[macro_export]
macro_rules! __postgres_arm {
    ($setup:ident: [$($all:ident),*]) => {
        mod on_postgres {
            $($crate::store_tests!(@test $all, $crate::Backing::postgres($crate::Setup::$setup).await);)*
        }
    };
}

/// Without the `postgres` feature, [`store_tests!`] has no Postgres arm.
#[cfg(not(feature = "postgres"))]
#[doc(hidden)]
#[macro_export]
macro_rules! __postgres_arm {
    ($setup:ident: [$($all:ident),*]) => {};
}

/// Declares one test per store for each scenario, an `async fn(Backing)` of the calling module:
///
/// ```ignore
/// store_tests!(Core: [every_store_a, every_store_b], redis: [redis_and_cluster_only]);
/// ```
///
/// gives `on_redis::every_store_a`, `on_cluster::every_store_a` (feature `cluster`),
/// `on_postgres::every_store_a` (the harness's feature `postgres`) and
/// `on_memory::every_store_a`, and the scenarios after `redis:` on Redis and the cluster only.
/// The [`Setup`] (`Core` or `Layer`) says how the store talks to Redis; under `Core` the memory
/// runs start with tokio's clock paused.
#[macro_export]
macro_rules! store_tests {
    ($setup:ident: [$($all:ident),* $(,)?] $(, redis: [$($redis:ident),* $(,)?])? $(,)?) => {
        mod on_redis {
            $($crate::store_tests!(@test $all, $crate::Backing::redis($crate::Setup::$setup).await);)*
            $($($crate::store_tests!(@test $redis, $crate::Backing::redis($crate::Setup::$setup).await);)*)?
        }

        #[cfg(feature = "cluster")]
        mod on_cluster {
            $($crate::store_tests!(@test $all, $crate::Backing::cluster($crate::Setup::$setup).await);)*
            $($($crate::store_tests!(@test $redis, $crate::Backing::cluster($crate::Setup::$setup).await);)*)?
        }

        mod on_memory {
            $($crate::store_tests!(@memory $setup $all);)*
        }

        $crate::__postgres_arm!($setup: [$($all),*]);
    };
    (@test $name:ident, $env:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            super::$name($env).await
        }
    };
    (@memory Core $name:ident) => {
        #[tokio::test(start_paused = true)]
        async fn $name() {
            super::$name($crate::Backing::memory()).await
        }
    };
    (@memory Layer $name:ident) => {
        $crate::store_tests!(@test $name, $crate::Backing::memory());
    };
}
