//! The conformance suite: every behaviour of the core, run against a real `redis-server`
//! (started per test on a free loopback port) and against `Store::memory()` (under paused time).
//! Tests that look at Redis itself (key names, PTTL, SCRIPT FLUSH) run on Redis only.

#[path = "../support/mod.rs"]
mod support;

mod exclusive;
mod input;
mod redis_only;
mod rw;

use std::time::Duration;

use redis::FromRedisValue;
use tokio::time::Instant;
use tower_lease::store::{KeyLayout, KeyRole};
use tower_lease::{RedisStore, Store};

/// What a test runs against: a store, and for Redis a raw connection to look behind it.
pub struct Fixture {
    pub store: Store,
    pub raw: Option<Raw>,
    _servers: Option<Box<dyn std::any::Any + Send>>,
}

/// A direct line to the Redis behind a store, and the store's key layout.
pub struct Raw {
    conn: RawConn,
    layout: KeyLayout,
}

enum RawConn {
    Single(redis::aio::MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Fixture {
    pub async fn redis() -> Self {
        let server = support::RedisServer::start();
        let conn = server.connection().await;
        Fixture {
            store: Store::redis(conn.clone()),
            raw: Some(Raw {
                conn: RawConn::Single(conn),
                layout: KeyLayout::default(),
            }),
            _servers: Some(Box::new(server)),
        }
    }

    /// A local 3-master Redis Cluster: the suite's names hash to slots on every node.
    #[cfg(feature = "cluster")]
    pub async fn cluster() -> Self {
        let cluster = support::cluster::RedisCluster::start();
        let conn = cluster.connection().await;
        Fixture {
            store: Store::redis(conn.clone()),
            raw: Some(Raw {
                conn: RawConn::Cluster(conn),
                layout: KeyLayout::default(),
            }),
            _servers: Some(Box::new(cluster)),
        }
    }

    pub fn memory() -> Self {
        Fixture {
            store: Store::memory(),
            raw: None,
            _servers: None,
        }
    }

    /// The raw Redis line of a Redis-only test.
    pub fn raw(&self) -> &Raw {
        self.raw.as_ref().expect("this test runs on Redis only")
    }
}

impl Raw {
    pub async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let result = match &self.conn {
            RawConn::Single(conn) => cmd.query_async(&mut conn.clone()).await,
            #[cfg(feature = "cluster")]
            RawConn::Cluster(conn) => cmd.query_async(&mut conn.clone()).await,
        };
        result.unwrap_or_else(|e| panic!("raw redis command failed: {e}"))
    }

    /// A second store over the same Redis, with another key prefix.
    pub fn store_with_prefix(&self, prefix: &str) -> Store {
        match &self.conn {
            RawConn::Single(conn) => RedisStore::new(conn.clone()).prefix(prefix).into(),
            #[cfg(feature = "cluster")]
            RawConn::Cluster(conn) => RedisStore::new(conn.clone()).prefix(prefix).into(),
        }
    }

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
}

/// Polls `attempt` every 5 ms until it answers `Some`, for at most `limit`; returns when it did.
pub async fn first_success<T, F, Fut>(limit: Duration, mut attempt: F) -> Option<(T, Instant)>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let sent = Instant::now();
        if let Some(value) = attempt().await {
            return Some((value, sent));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// Redis and the clocks count whole milliseconds; allow that much rounding in comparisons.
pub const ROUNDING: Duration = Duration::from_millis(3);

macro_rules! suite {
    (all: [$($a:ident :: $at:ident),* $(,)?], redis: [$($r:ident :: $rt:ident),* $(,)?] $(,)?) => {
        mod on_redis {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $at() {
                    $a::$at(Fixture::redis().await).await
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rt() {
                    $r::$rt(Fixture::redis().await).await
                }
            )*
        }

        #[cfg(feature = "cluster")]
        mod on_cluster {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $at() {
                    $a::$at(Fixture::cluster().await).await
                }
            )*
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rt() {
                    $r::$rt(Fixture::cluster().await).await
                }
            )*
        }

        mod on_memory {
            use super::*;
            $(
                #[tokio::test(start_paused = true)]
                async fn $at() {
                    $a::$at(Fixture::memory()).await
                }
            )*
        }
    };
}

suite! {
    all: [
        exclusive::mutual_exclusion,
        exclusive::only_the_holder_releases_or_extends,
        exclusive::stale_release_leaves_next_holder_alone,
        exclusive::extend_after_expiry_does_not_reacquire,
        exclusive::extend_keeps_the_lease,
        exclusive::abandoned_lease_frees_itself_after_ttl,
        exclusive::retry_after_is_the_holders_remaining_lease,
        exclusive::fences_increase_per_name,
        rw::readers_share,
        rw::writer_excludes_everyone,
        rw::readers_block_writer_until_released,
        rw::crashed_reader_stops_blocking_after_ttl,
        rw::reader_and_writer_tokens_are_holder_only,
        rw::retry_after_for_read_and_write,
        rw::write_fences_increase_and_readers_see_the_generation,
        input::names_out_of_range_are_errors,
        input::binary_names_lock_independently,
    ],
    redis: [
        redis_only::pttl_right_after_acquire_is_the_ttl,
        redis_only::crashed_reader_member_is_removed,
        redis_only::reader_set_key_expires,
        redis_only::every_operation_survives_script_flush,
        redis_only::exact_key_names,
        redis_only::custom_prefix,
        redis_only::abandoned_lock_key_is_gone_after_ttl,
    ],
}
