//! Where a notifier's subscriber connection comes from, and how
//! it subscribes: `SUBSCRIBE` on one server, or `SSUBSCRIBE` through a cluster connection.

use redis::aio::{PubSubSink, PubSubStream};

#[cfg(feature = "cluster")]
use super::sharded::Sharded;

/// Where a notifier's subscriber connection comes from.
// One per store, inside its notifier's `Arc`: boxing a variant would save nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Subscriber {
    /// `SUBSCRIBE` on one server: a single Redis, or any node of a cluster whose scripts
    /// `PUBLISH` (the cluster bus copies every message to every node).
    Plain(redis::Client),
    /// `SSUBSCRIBE` through a cluster connection, for scripts that `SPUBLISH`.
    #[cfg(feature = "cluster")]
    Sharded(Sharded),
}

/// The live subscriber connection's handle for subscribing and unsubscribing.
#[derive(Clone)]
pub(super) enum Sink {
    Plain(PubSubSink),
    #[cfg(feature = "cluster")]
    Sharded(redis::cluster_async::ClusterConnection),
}

impl Sink {
    /// Resolves once the server confirmed the subscription.
    pub(super) async fn subscribe(&mut self, channels: &[Vec<u8>]) -> redis::RedisResult<()> {
        match self {
            Sink::Plain(sink) => sink.subscribe(channels).await,
            // One channel per command: a cluster routes each by its own slot.
            #[cfg(feature = "cluster")]
            Sink::Sharded(conn) => {
                for channel in channels {
                    conn.ssubscribe(channel).await?;
                }
                Ok(())
            }
        }
    }

    pub(super) async fn unsubscribe(&mut self, channel: &[u8]) -> redis::RedisResult<()> {
        match self {
            Sink::Plain(sink) => sink.unsubscribe(channel).await,
            #[cfg(feature = "cluster")]
            Sink::Sharded(conn) => conn.sunsubscribe(channel).await,
        }
    }
}

/// What reads the messages of a connection just made.
pub(super) enum Reader {
    /// A plain connection's messages, and the client to connect again with when it ends.
    Plain(Box<(redis::Client, PubSubStream)>),
    /// A sharded subscriber's pushes.
    #[cfg(feature = "cluster")]
    Sharded(tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>),
    /// A sharded subscriber's pushes, already read since an earlier connection.
    #[cfg(feature = "cluster")]
    Running,
}

impl Subscriber {
    /// A connection to subscribe on, and what reads its messages.
    pub(super) async fn connect(&self) -> redis::RedisResult<(Sink, Reader)> {
        match self {
            Subscriber::Plain(client) => {
                let (sink, stream) = client.get_async_pubsub().await?.split();
                Ok((
                    Sink::Plain(sink),
                    Reader::Plain(Box::new((client.clone(), stream))),
                ))
            }
            #[cfg(feature = "cluster")]
            Subscriber::Sharded(sharded) => {
                let (conn, pushes) = sharded.connect().await?;
                let reader = pushes.map_or(Reader::Running, Reader::Sharded);
                Ok((Sink::Sharded(conn), reader))
            }
        }
    }
}
