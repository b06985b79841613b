//! [`SentinelConnection`]: a multiplexed connection to the primary that Redis Sentinel names,
//! which finds the new primary after a failover.

use std::fmt;
use std::sync::{Arc, Mutex};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelServerType};
use redis::{AsyncConnectionConfig, Cmd, Pipeline, RedisFuture, RedisResult, Value};

use super::RedisStore;
use super::deadline::connection_lost;
use super::redis::DEFAULT_TIMEOUT;
use crate::Result;

/// A connection to the primary of one Sentinel-monitored master, for [`RedisStore`].
///
/// It asks the sentinels for the primary when it first connects, and again whenever the
/// connection it has is found dropped or refused, or the node answers `READONLY` (an old
/// primary that came back as a replica). The store sends a call whose connection was lost once
/// more at once, so the first call after a promotion reaches the new primary; calls during the
/// failover itself fail (the sentinels still name the dead primary until they promote one).
///
/// Clones share the connection.
#[derive(Clone)]
pub struct SentinelConnection {
    shared: Arc<Shared>,
    /// The connection this clone uses, and the generation it was taken at.
    cached: Option<(u64, MultiplexedConnection)>,
}

struct Shared {
    sentinel: tokio::sync::Mutex<SentinelClient>,
    config: AsyncConnectionConfig,
    /// The live connection to the primary, and how many connections were made before it.
    current: Mutex<(u64, Option<MultiplexedConnection>)>,
}

impl fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let current = self
            .shared
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        f.debug_struct("SentinelConnection")
            .field("generation", &current.0)
            .field("connected", &current.1.is_some())
            .finish()
    }
}

impl SentinelConnection {
    /// Connects to the primary that the sentinels of `sentinel` name.
    pub async fn new(sentinel: SentinelClient) -> RedisResult<Self> {
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(Some(DEFAULT_TIMEOUT))
            .set_connection_timeout(Some(DEFAULT_TIMEOUT));
        let mut conn = SentinelConnection {
            shared: Arc::new(Shared {
                sentinel: tokio::sync::Mutex::new(sentinel),
                config,
                current: Mutex::new((0, None)),
            }),
            cached: None,
        };
        conn.connection().await?;
        Ok(conn)
    }

    /// The live connection, asking the sentinels for the primary first if there is none.
    async fn connection(&mut self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(cached) = self.live() {
            return Ok(cached);
        }
        // One resolution at a time: the callers that waited find the connection it made.
        let shared = self.shared.clone();
        let mut sentinel = shared.sentinel.lock().await;
        if let Some(cached) = self.live() {
            return Ok(cached);
        }
        let client = sentinel.async_get_client().await?;
        let conn = client
            .get_multiplexed_async_connection_with_config(&self.shared.config)
            .await?;
        let mut current = self
            .shared
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        current.0 += 1;
        current.1 = Some(conn.clone());
        tracing::debug!(addr = ?client.get_connection_info().addr(), "connected to the primary Sentinel names");
        self.cached = Some((current.0, conn.clone()));
        Ok((current.0, conn))
    }

    /// The shared live connection, refreshed into this clone's cache.
    fn live(&mut self) -> Option<(u64, MultiplexedConnection)> {
        let current = self
            .shared
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let conn = current.1.as_ref()?;
        match &self.cached {
            Some((generation, _)) if *generation == current.0 => {}
            _ => self.cached = Some((current.0, conn.clone())),
        }
        self.cached.clone()
    }

    /// Drops the connection of `generation` when `error` says it no longer reaches the primary,
    /// so the next call asks the sentinels again.
    fn forget_if_stale(&mut self, generation: u64, error: Option<&redis::RedisError>) {
        let stale = error
            .is_some_and(|e| connection_lost(e) || e.kind() == redis::ErrorKind::Server(READ_ONLY));
        if !stale {
            return;
        }
        self.cached = None;
        let mut current = self
            .shared
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if current.0 == generation {
            current.1 = None;
        }
    }
}

const READ_ONLY: redis::ServerErrorKind = redis::ServerErrorKind::ReadOnly;

/// The first `READONLY` among a pipeline's replies, as an error.
fn read_only(replies: &[Value]) -> Option<redis::RedisError> {
    replies.iter().find_map(|reply| match reply {
        Value::ServerError(e) if e.kind() == Some(READ_ONLY) => Some(e.clone().into()),
        _ => None,
    })
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut conn) = self.connection().await?;
            let reply = conn.req_packed_command(cmd).await;
            let error = match &reply {
                Err(e) => Some(e.clone()),
                Ok(reply) => read_only(std::slice::from_ref(reply)),
            };
            self.forget_if_stale(generation, error.as_ref());
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut conn) = self.connection().await?;
            let reply = conn.req_packed_commands(pipeline, offset, count).await;
            let error = match &reply {
                Err(e) => Some(e.clone()),
                Ok(replies) => read_only(replies),
            };
            self.forget_if_stale(generation, error.as_ref());
            reply
        })
    }

    fn get_db(&self) -> i64 {
        self.cached.as_ref().map_or(0, |(_, conn)| conn.get_db())
    }
}

impl RedisStore<SentinelConnection> {
    /// Connects to the primary of `master_name` through the Redis Sentinels at `sentinel_urls`
    /// (`redis://host:port`; any reachable one answers), and follows failovers: see
    /// [`SentinelConnection`]. Fails when no sentinel names a reachable primary now.
    ///
    /// Release notifications are not set up: a subscriber would stay on the old primary after
    /// a failover, so waiters find releases by polling. Pair it with
    /// [`wait_for_replicas`](Self::wait_for_replicas): without `WAIT`, a failover can lose a
    /// lease the old primary had not yet sent on.
    pub async fn connect_sentinel<T>(
        master_name: &str,
        sentinel_urls: impl IntoIterator<Item = T>,
    ) -> Result<Self>
    where
        T: redis::IntoConnectionInfo,
    {
        let urls: Vec<T> = sentinel_urls.into_iter().collect();
        // redis-rs takes a `String` or any `AsRef<str>`, depending on its TLS features.
        let name: String = master_name.into();
        let client = SentinelClient::build(urls, name, None, SentinelServerType::Master)?;
        Ok(Self::new(SentinelConnection::new(client).await?))
    }
}
