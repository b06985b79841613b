//! Sharded release notifications on a Redis Cluster (7.0 and later): the scripts publish with
//! `SPUBLISH`, which only the master that owns the name's slot (and its replicas) hears, where a
//! `PUBLISH` crosses the cluster bus to every node; and the notifier listens with `SSUBSCRIBE`
//! through a cluster connection of its own (RESP3, its pushes sent into a channel the notifier's
//! task reads), which sends each subscription to the master that owns the channel's slot.
//!
//! redis-rs subscribes a node's channels again after it reconnects to that node, and after a
//! topology refresh on the nodes that own them then. A master that gives a slot away drops the
//! slot's subscriptions itself, with an `sunsubscribe` push that redis-rs takes as final: the
//! notifier then subscribes again, which follows the slot to its new owner.

use std::sync::Mutex;

use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::{PushInfo, PushKind, RedisResult, Value};
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use crate::store::redis::connection::check::at_least;

/// The first Redis with sharded channels (`SPUBLISH`, `SSUBSCRIBE`).
const MIN_VERSION: (u32, u32) = (7, 0);

/// The client of a sharded subscriber, and the pushes of its one connection.
pub(crate) struct Sharded {
    client: ClusterClient,
    /// Taken by the task that reads them, when the connection is first made.
    pushes: Mutex<Option<UnboundedReceiver<PushInfo>>>,
}

impl Sharded {
    /// A subscriber from `builder`, set to RESP3 (pushes) with a push sender of its own.
    pub(crate) fn new(builder: ClusterClientBuilder) -> RedisResult<Self> {
        let (sender, pushes) = unbounded_channel();
        let client = builder
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(sender)
            .build()?;
        let pushes = Mutex::new(Some(pushes));
        Ok(Self { client, pushes })
    }

    /// Connects; the pushes come with the first connection made (there is one per notifier:
    /// the cluster connection reconnects to its nodes by itself).
    pub(crate) async fn connect(
        &self,
    ) -> RedisResult<(ClusterConnection, Option<UnboundedReceiver<PushInfo>>)> {
        let conn = self.client.get_async_connection().await?;
        let pushes = self.pushes.lock().unwrap_or_else(|e| e.into_inner()).take();
        Ok((conn, pushes))
    }
}

/// What a push of the subscriber connection means to the notifier.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Push {
    /// A message published on a shard channel.
    Message {
        channel: Vec<u8>,
        payload: Vec<u8>,
    },
    /// A subscription confirmed: ours, or redis-rs's after a reconnect.
    Subscribed(Vec<u8>),
    /// A subscription ended: ours, or the server's when the channel's slot moved away.
    Unsubscribed(Vec<u8>),
    /// The connection to a node was lost; redis-rs reconnects and subscribes again.
    Disconnected,
    Other,
}

impl From<PushInfo> for Push {
    fn from(push: PushInfo) -> Self {
        let mut data = push.data.into_iter();
        let mut bytes = || match data.next() {
            Some(Value::BulkString(bytes)) => Some(bytes),
            _ => None,
        };
        match push.kind {
            PushKind::SMessage => match (bytes(), bytes()) {
                (Some(channel), Some(payload)) => Push::Message { channel, payload },
                _ => Push::Other,
            },
            PushKind::SSubscribe => bytes().map_or(Push::Other, Push::Subscribed),
            PushKind::SUnsubscribe => bytes().map_or(Push::Other, Push::Unsubscribed),
            PushKind::Disconnection => Push::Disconnected,
            _ => Push::Other,
        }
    }
}

/// Whether every master of the cluster behind `conn` has sharded channels (Redis 7.0), by its
/// `INFO server`; a master that does not say counts as one that has not.
pub(crate) async fn supported(conn: &mut ClusterConnection) -> RedisResult<bool> {
    let reply: Value = redis::cmd("INFO").arg("server").query_async(conn).await?;
    // One reply per master, keyed by its address.
    let infos = match reply {
        Value::Map(nodes) => nodes.into_iter().map(|(_, info)| info).collect(),
        info => vec![info],
    };
    let mut all = true;
    for info in infos {
        let info: String = redis::from_redis_value(info)?;
        all &= version(&info).is_some_and(|version| at_least(version, MIN_VERSION));
    }
    Ok(all)
}

fn version(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|line| line.strip_prefix("redis_version:"))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(kind: PushKind, data: &[&[u8]]) -> Push {
        let data = data.iter().map(|d| Value::BulkString(d.to_vec())).collect();
        Push::from(PushInfo { kind, data })
    }

    #[test]
    fn reads_messages_subscriptions_and_lost_nodes_from_pushes() {
        assert_eq!(
            push(PushKind::SMessage, &[b"ch", b"w"]),
            Push::Message {
                channel: b"ch".to_vec(),
                payload: b"w".to_vec()
            }
        );
        let subscribed = PushInfo {
            kind: PushKind::SSubscribe,
            data: vec![Value::BulkString(b"ch".to_vec()), Value::Int(1)],
        };
        assert_eq!(Push::from(subscribed), Push::Subscribed(b"ch".to_vec()));
        assert_eq!(
            push(PushKind::SUnsubscribe, &[b"ch"]),
            Push::Unsubscribed(b"ch".to_vec())
        );
        assert_eq!(push(PushKind::Disconnection, &[]), Push::Disconnected);
        // A plain channel's message is not ours: the scripts publish on shard channels.
        assert_eq!(push(PushKind::Message, &[b"ch", b""]), Push::Other);
    }

    #[test]
    fn sharded_channels_need_redis_7_0() {
        assert_eq!(
            version("# Server\r\nredis_version:6.2.14\r\n"),
            Some("6.2.14")
        );
        assert!(!at_least("6.2.14", MIN_VERSION));
        assert!(at_least("7.0.15", MIN_VERSION));
        assert_eq!(version("redis_mode:cluster\r\n"), None);
    }
}
