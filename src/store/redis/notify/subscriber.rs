//! Where a notifier's subscriber connection comes from, and how
//! it subscribes: `SUBSCRIBE` on one server (or on the primary Sentinel names, following it),
//! or `SSUBSCRIBE` through a cluster connection.

use redis::aio::{PubSubSink, PubSubStream};

#[cfg(feature = "cluster")]
use crate::store::redis::cluster::sharded::Sharded;

/// Where a notifier's subscriber connection comes from.
// One per store, inside its notifier's `Arc`: boxing a variant would save nothing.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Subscriber {
    /// `SUBSCRIBE` on one server: a single Redis, or any node of a cluster whose scripts
    /// `PUBLISH` (the cluster bus copies every message to every node).
    Plain(redis::Client),
    /// `SUBSCRIBE` on the primary a [`SentinelConnection`](crate::store::redis::SentinelConnection) follows,
    /// moving with it after a failover.
    #[cfg(feature = "sentinel")]
    Following(tokio::sync::watch::Receiver<Option<redis::ConnectionInfo>>),
    /// `SSUBSCRIBE` through a cluster connection, for scripts that `SPUBLISH`.
    #[cfg(feature = "cluster")]
    Sharded(Sharded),
}

/// The live subscriber connection's handle for subscribing and unsubscribing.
#[derive(Clone)]
pub(in crate::store::redis) enum Sink {
    Plain(PubSubSink),
    #[cfg(feature = "cluster")]
    Sharded(redis::cluster_async::ClusterConnection),
}

impl Sink {
    /// Resolves once the server confirmed the subscription.
    pub(in crate::store::redis) async fn subscribe(
        &mut self,
        channels: &[Vec<u8>],
    ) -> redis::RedisResult<()> {
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

    pub(in crate::store::redis) async fn unsubscribe(
        &mut self,
        channel: &[u8],
    ) -> redis::RedisResult<()> {
        match self {
            Sink::Plain(sink) => sink.unsubscribe(channel).await,
            #[cfg(feature = "cluster")]
            Sink::Sharded(conn) => conn.sunsubscribe(channel).await,
        }
    }
}

/// Where a plain subscriber connects again after its connection ended.
// One per subscriber task, inside its reader's box: boxing a variant would save nothing.
#[allow(clippy::large_enum_variant)]
pub(in crate::store::redis) enum Source {
    Client(redis::Client),
    /// The primary, as a Sentinel connection follows it.
    #[cfg(feature = "sentinel")]
    Following(tokio::sync::watch::Receiver<Option<redis::ConnectionInfo>>),
}

impl Source {
    /// A new subscriber connection, to the primary as it is now.
    pub(in crate::store::redis) async fn pubsub(
        &mut self,
    ) -> redis::RedisResult<redis::aio::PubSub> {
        match self {
            Source::Client(client) => client.get_async_pubsub().await,
            #[cfg(feature = "sentinel")]
            Source::Following(primary) => {
                let info = primary.borrow_and_update().clone();
                let info = info.ok_or_else(|| {
                    redis::RedisError::from((redis::ErrorKind::Io, "no primary known yet"))
                })?;
                redis::Client::open(info)?.get_async_pubsub().await
            }
        }
    }

    /// Resolves when the primary moved, so the connection made before is to the wrong node
    /// (an old primary stays up, and keeps its subscribers, for a while after a graceful
    /// failover); never for a fixed client.
    pub(in crate::store::redis) async fn moved(&mut self) {
        match self {
            Source::Client(_) => std::future::pending().await,
            #[cfg(feature = "sentinel")]
            Source::Following(primary) => {
                if primary.changed().await.is_err() {
                    // The connection is gone, and with it the store: nothing moves any more.
                    std::future::pending().await
                }
            }
        }
    }
}

/// What reads the messages of a connection just made.
pub(in crate::store::redis) enum Reader {
    /// A plain connection's messages, and where to connect again when it ends.
    Plain(Box<(Source, PubSubStream)>),
    /// A sharded subscriber's pushes.
    #[cfg(feature = "cluster")]
    Sharded(tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>),
    /// A sharded subscriber's pushes, already read since an earlier connection.
    #[cfg(feature = "cluster")]
    Running,
}

impl Subscriber {
    /// A connection to subscribe on, and what reads its messages.
    pub(in crate::store::redis) async fn connect(&self) -> redis::RedisResult<(Sink, Reader)> {
        match self {
            Subscriber::Plain(client) => {
                let mut source = Source::Client(client.clone());
                let (sink, stream) = source.pubsub().await?.split();
                Ok((Sink::Plain(sink), Reader::Plain(Box::new((source, stream)))))
            }
            #[cfg(feature = "sentinel")]
            Subscriber::Following(primary) => {
                let mut source = Source::Following(primary.clone());
                let (sink, stream) = source.pubsub().await?.split();
                Ok((Sink::Plain(sink), Reader::Plain(Box::new((source, stream)))))
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
