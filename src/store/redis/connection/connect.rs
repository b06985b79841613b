//! Connections built the way a lock store needs them: [`RedisStore::connect`] and its kin.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::Result;
use crate::store::redis::DEFAULT_TIMEOUT;
use crate::store::redis::RedisStore;

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
    /// - a response timeout and a connection timeout equal to the store's timeout (1 s), so
    ///   redis-rs's own timeout neither fires first nor waits longer.
    ///
    /// - [release notifications](Self::notifications) for bounded waits, through a subscriber
    ///   connection of the same client;
    /// - native compare-and-set where the server has it (asked here; see
    ///   [`RedisStore`](Self#native-compare-and-set)).
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
        let store = Self::new(conn).notifications(client);
        store.probe_native().await;
        Ok(store)
    }
}

#[cfg(feature = "cluster")]
impl RedisStore<redis::cluster_async::ClusterConnection> {
    /// Connects to the Redis Cluster that `nodes` belong to (any reachable subset seeds it;
    /// credentials and TLS come with their connection info), with retry waits capped at 100 ms
    /// and redis-rs's response and connection timeouts equal to the store's timeout (1 s),
    /// and release notifications:
    ///
    /// - sharded when every master runs Redis 7.0 or later (by its `INFO server`, asked once
    ///   here): the scripts publish with `SPUBLISH`, a release reaches the master that owns its
    ///   name only, and one subscriber, a cluster connection of its own, listens with
    ///   `SSUBSCRIBE` there, following slots that move;
    /// - otherwise (or when `INFO` is refused) [plain](Self::notifications), subscribed on the
    ///   first node, since the cluster bus forwards every `PUBLISH` to all its nodes.
    ///
    /// Every store of the cluster should publish alike: a sharded subscriber does not hear a
    /// plain `PUBLISH` (from a store made by [`new`](Self::new), or one of an older release
    /// during a rolling upgrade), nor a plain subscriber a `SPUBLISH`. Waiters that miss a
    /// release still get in, at the holder's lease end or within a second.
    pub async fn connect_cluster<T>(nodes: impl IntoIterator<Item = T>) -> Result<Self>
    where
        T: redis::IntoConnectionInfo,
    {
        let nodes = nodes
            .into_iter()
            .map(|node| node.into_connection_info())
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let client = cluster_client_builder(nodes.clone()).build()?;
        let mut conn = client.get_async_connection().await?;
        let store = Self::new(conn.clone());
        store.probe_native().await;
        if crate::store::redis::cluster::sharded::supported(&mut conn)
            .await
            .unwrap_or(false)
        {
            return store.sharded_notifications(cluster_client_builder(nodes));
        }
        Ok(match nodes.into_iter().next() {
            Some(subscriber) => store.notifications(redis::Client::open(subscriber)?),
            None => store,
        })
    }

    /// Sharded release notifications: one subscriber connection, a cluster connection made
    /// from `builder` (set to RESP3 with a push sender of its own), subscribes with
    /// `SSUBSCRIBE` on the master that owns each waited-for name, and subscribes again on a node
    /// it reconnects to and on the new owner of a slot that moved. Needs Redis 7.0 on every
    /// master (`SPUBLISH` fails the scripts' releases on older ones).
    fn sharded_notifications(
        mut self,
        builder: redis::cluster::ClusterClientBuilder,
    ) -> Result<Self> {
        let sharded = crate::store::redis::cluster::sharded::Sharded::new(builder)?;
        let subscriber = crate::store::redis::notify::Subscriber::Sharded(sharded);
        self.notifier = Some(crate::store::redis::notify::Notifier::new(subscriber));
        self.sharded = true;
        Ok(self)
    }
}

/// A cluster client builder set up for a lock store: retry waits capped at 100 ms, and response
/// and connection timeouts equal to the store's timeout (1 s).
#[cfg(feature = "cluster")]
fn cluster_client_builder<T>(
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
