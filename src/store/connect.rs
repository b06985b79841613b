//! Connections built the way a lock store needs them: [`RedisStore::connect`] and its kin.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::RedisStore;
use super::redis::DEFAULT_TIMEOUT;
use crate::Result;

/// The longest wait between reconnect attempts: a lock store should be usable again within
/// a fraction of a second of Redis coming back, not after a backoff that doubled for as long
/// as the outage lasted.
const MAX_RECONNECT_DELAY: Duration = Duration::from_millis(100);

/// The first wait before a reconnect attempt.
const MIN_RECONNECT_DELAY: Duration = Duration::from_millis(10);

/// How many times one reconnection tries again (after 10 and 20 ms) before the calls waiting
/// for it fail: few, so a call with Redis down fails within tens of milliseconds rather than
/// after a backoff, and a bounded wait ends with the error at once. The next call starts the
/// next reconnection, and the store retries a call at once when it finds the connection lost,
/// so the first call after Redis comes back succeeds.
const RECONNECT_RETRIES: usize = 2;

impl RedisStore<ConnectionManager> {
    /// Connects to the Redis at `url` (`redis://host:port/db`, `rediss://…` with TLS features)
    /// the way a lock store needs it; see [`from_client`](Self::from_client).
    pub async fn connect(url: &str) -> Result<Self> {
        Self::from_client(redis::Client::open(url)?).await
    }

    /// Connects through `client` with a [`ConnectionManager`] set up for a lock store:
    ///
    /// - reconnects after a failure with a backoff from 10 ms capped at 100 ms, trying a
    ///   reconnection twice again before its calls fail, so with Redis down a call fails
    ///   within tens of milliseconds, and the store answers again as soon as Redis is back,
    ///   however long it was gone (the first call after the restart included: the store
    ///   retries once, at once, a call whose connection it found lost);
    /// - a response timeout and a connection timeout equal to the store's deadline (1 s), so
    ///   redis-rs's own timeout neither fires first nor waits longer.
    ///
    /// - [release notifications](Self::notifications) for bounded waits, through a subscriber
    ///   connection of the same client.
    ///
    /// A shorter [`timeout`](Self::timeout) set afterwards still bounds every call. Fails when
    /// Redis cannot be reached now, so a misconfigured URL shows at startup.
    pub async fn from_client(client: redis::Client) -> Result<Self> {
        let config = ConnectionManagerConfig::new()
            .set_min_delay(MIN_RECONNECT_DELAY)
            .set_max_delay(MAX_RECONNECT_DELAY)
            .set_number_of_retries(RECONNECT_RETRIES)
            .set_response_timeout(Some(DEFAULT_TIMEOUT))
            .set_connection_timeout(Some(DEFAULT_TIMEOUT));
        let conn = ConnectionManager::new_with_config(client.clone(), config).await?;
        Ok(Self::new(conn).notifications(client))
    }
}

#[cfg(feature = "cluster")]
impl RedisStore<redis::cluster_async::ClusterConnection> {
    /// Connects to the Redis Cluster that `nodes` belong to (any reachable subset seeds it),
    /// with the client [`cluster_client_builder`](Self::cluster_client_builder) sets up, and
    /// [release notifications](Self::notifications) subscribed on the first node (a cluster
    /// forwards every `PUBLISH` to all its nodes).
    pub async fn connect_cluster<T>(nodes: impl IntoIterator<Item = T>) -> Result<Self>
    where
        T: redis::IntoConnectionInfo,
    {
        let nodes = nodes
            .into_iter()
            .map(|node| node.into_connection_info())
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let subscriber = nodes
            .first()
            .cloned()
            .map(redis::Client::open)
            .transpose()?;
        let client = Self::cluster_client_builder(nodes).build()?;
        let store = Self::new(client.get_async_connection().await?);
        Ok(match subscriber {
            Some(subscriber) => store.notifications(subscriber),
            None => store,
        })
    }

    /// A cluster client builder set up for a lock store: retry waits capped at 100 ms, and
    /// response and connection timeouts equal to the store's deadline (1 s). Add credentials or
    /// TLS to it, then `build()` it and pass the connection to [`RedisStore::new`].
    pub fn cluster_client_builder<T>(
        nodes: impl IntoIterator<Item = T>,
    ) -> redis::cluster::ClusterClientBuilder
    where
        T: redis::IntoConnectionInfo,
    {
        redis::cluster::ClusterClient::builder(nodes)
            .min_retry_wait(MIN_RECONNECT_DELAY.as_millis() as u64)
            .max_retry_wait(MAX_RECONNECT_DELAY.as_millis() as u64)
            .response_timeout(DEFAULT_TIMEOUT)
            .connection_timeout(DEFAULT_TIMEOUT)
    }
}
