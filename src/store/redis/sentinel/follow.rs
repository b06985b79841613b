//! How a [`SentinelConnection`](crate::store::redis::SentinelConnection) finds the primary: asking every
//! sentinel at once, and listening on each for the events it announces a failover with.
//!
//! The sentinels need not agree: one that missed a failover (it was cut off, or has not heard
//! the leader's hello yet) still names the old primary, which Redis keeps a writable primary for
//! ~10 s after a graceful failover. So the answers are tried by their configuration epoch, the
//! newest first, and a node counts only once it says `ROLE` master itself.

use std::time::Duration;

use futures_util::StreamExt;
use futures_util::future::join_all;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo};

/// How long one sentinel may take to answer, and a node to answer `ROLE`: a sentinel that
/// hangs must not hold up the others' answer.
const ASK_TIMEOUT: Duration = Duration::from_millis(500);
const FIRST_RESUBSCRIBE: Duration = Duration::from_millis(50);
const MAX_RESUBSCRIBE: Duration = Duration::from_secs(1);

/// The primary the sentinels name, connected and checked.
pub(in crate::store::redis) struct Found {
    pub(in crate::store::redis) addr: ConnectionAddr,
    pub(in crate::store::redis) conn: MultiplexedConnection,
    /// The configuration epoch of the sentinel answer that named it.
    pub(in crate::store::redis) epoch: u64,
}

/// One sentinel's view of the master: where it is, and the epoch of that configuration.
struct Named {
    host: String,
    port: u16,
    epoch: u64,
}

/// Asks every sentinel at once for `master` and connects to the newest primary they name that
/// says it is one; answers none older than `min_epoch`.
pub(in crate::store::redis) async fn primary(
    sentinels: &[ConnectionInfo],
    master: &str,
    config: &AsyncConnectionConfig,
    min_epoch: u64,
) -> redis::RedisResult<Found> {
    let answers = join_all(sentinels.iter().map(|s| named(s, master))).await;
    let mut named: Vec<Named> = answers.into_iter().flatten().collect();
    named.retain(|n| n.epoch >= min_epoch);
    // Newest first; among equals the first sentinel's, as listed.
    named.sort_by_key(|n| std::cmp::Reverse(n.epoch));
    let mut tried = Vec::new();
    let mut error = None;
    for Named { host, port, epoch } in named {
        if tried.contains(&(host.clone(), port)) {
            continue;
        }
        tried.push((host.clone(), port));
        let addr = ConnectionAddr::Tcp(host, port);
        match connect_primary(addr.clone(), config).await {
            Ok(conn) => return Ok(Found { addr, conn, epoch }),
            Err(e) => error = Some(e),
        }
    }
    Err(error.unwrap_or_else(|| {
        redis::RedisError::from((
            redis::ErrorKind::MasterNameNotFoundBySentinel,
            "no sentinel names a primary",
        ))
    }))
}

/// One sentinel's answer, within [`ASK_TIMEOUT`]: the address from `GET-MASTER-ADDR-BY-NAME`,
/// which names the promoted replica as soon as the leader reconfigures the other replicas
/// (`SENTINEL MASTER` names the old primary until the failover ends), and the epoch from
/// `SENTINEL MASTER`, which the leader raises at the promotion.
async fn named(sentinel: &ConnectionInfo, master: &str) -> Option<Named> {
    let ask = async {
        let client = redis::Client::open(sentinel.clone()).ok()?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&short(ASK_TIMEOUT))
            .await
            .ok()?;
        type Fields = std::collections::HashMap<String, String>;
        let (fields, (host, port)): (Fields, (String, u16)) = redis::pipe()
            .cmd("SENTINEL")
            .arg("MASTER")
            .arg(master)
            .cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(master)
            .query_async(&mut conn)
            .await
            .ok()?;
        Some(Named {
            host,
            port,
            epoch: fields.get("config-epoch")?.parse().ok()?,
        })
    };
    tokio::time::timeout(ASK_TIMEOUT, ask).await.ok().flatten()
}

/// A connection to `addr`, once it answers `ROLE` as a primary.
async fn connect_primary(
    addr: ConnectionAddr,
    config: &AsyncConnectionConfig,
) -> redis::RedisResult<MultiplexedConnection> {
    let client = redis::Client::open(addr.into_connection_info()?)?;
    let connect = async {
        let mut conn = client
            .get_multiplexed_async_connection_with_config(config)
            .await?;
        let role: redis::Value = redis::cmd("ROLE").query_async(&mut conn).await?;
        match role {
            redis::Value::Array(fields) if matches!(fields.first(), Some(redis::Value::BulkString(r)) if r == b"master") => {
                Ok(conn)
            }
            _ => Err(redis::RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
                "the node a sentinel names is not a primary (yet)",
            ))),
        }
    };
    tokio::time::timeout(ASK_TIMEOUT * 2, connect)
        .await
        .unwrap_or_else(|_| Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()))
}

/// A connection to `addr` with the connection's own settings: for a second connection to the
/// primary already found.
pub(in crate::store::redis) async fn connect(
    addr: &ConnectionAddr,
    config: &AsyncConnectionConfig,
) -> redis::RedisResult<MultiplexedConnection> {
    redis::Client::open(addr.clone().into_connection_info()?)?
        .get_multiplexed_async_connection_with_config(config)
        .await
}

fn short(timeout: Duration) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
}

/// The events a failover's leader announces its progress with: the promoted replica is named
/// from the first on, and the second ends the failover (every sentinel sends it once it knows).
const EVENTS: [&str; 2] = ["+failover-state-reconf-slaves", "+switch-master"];

/// Listens on `sentinel` for the [`EVENTS`] of a failover of `master`, calling `switched` for
/// each, until the task is cancelled; subscribes again, with a backoff, whenever the sentinel
/// goes away.
pub(in crate::store::redis) async fn listen(
    sentinel: ConnectionInfo,
    master: String,
    switched: impl Fn(),
) {
    let mut backoff = FIRST_RESUBSCRIBE;
    loop {
        let subscribed = tokio::time::timeout(ASK_TIMEOUT * 2, async {
            let client = redis::Client::open(sentinel.clone())?;
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(&EVENTS[..]).await?;
            Ok::<_, redis::RedisError>(pubsub)
        });
        if let Ok(Ok(mut pubsub)) = subscribed.await {
            backoff = FIRST_RESUBSCRIBE;
            // A failover may have ended while this sentinel was away: ask again.
            switched();
            let mut messages = pubsub.on_message();
            while let Some(message) = messages.next().await {
                // `+switch-master`: `<master> <old ip> <old port> <new ip> <new port>`; the
                // other: `master <master> <ip> <port>`.
                let payload: String = message.get_payload().unwrap_or_default();
                if payload.split(' ').take(2).any(|word| word == master) {
                    tracing::debug!(event = message.get_channel_name(), %payload, "a sentinel announced a failover");
                    switched();
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_RESUBSCRIBE);
    }
}
