//! How a [`RedisStore`] keeps every call within its timeout: with a coarse timer of its own, or
//! through the response timeout of a `MultiplexedConnection` it owns; and how replies and their
//! timeouts become this crate's results.

use std::any::Any;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};

use crate::backend::BoxFuture;
use crate::coarse_timer;
use crate::store::redis::RedisStore;
use crate::{Error, Result};

/// Who keeps a call's timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::store::redis) enum Bound {
    /// The store's own coarse timer ([`coarse_timer`]) around each call: for a timeout set with
    /// [`RedisStore::timeout`], and for connections whose own response timeout the store cannot
    /// set (a `ConnectionManager` waits for its reconnections outside it).
    Own,
    /// The response timeout of the store's own clone of a `MultiplexedConnection`, set to the
    /// timeout: redis-rs arms that timer for every request anyway, so a second one would only
    /// cost time.
    Connection,
}

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// `call` bounded by the store's timeout, boxed for [`Backend`](crate::backend::Backend): with a
    /// timer of its own, or, when the connection keeps the timeout ([`Bound::Connection`]), as
    /// it is. Two boxes for
    /// two futures, so that a call without a timer does not carry room for one: a smaller
    /// future is a cheaper allocation.
    pub(in crate::store::redis) fn bounded<'a, T: 'a>(
        &'a self,
        call: impl Future<Output = Result<T>> + Send + 'a,
    ) -> BoxFuture<'a, Result<T>> {
        match self.bound {
            Bound::Connection => Box::pin(call),
            // A future of its own rather than an `async` block around the `Timeout`: the call
            // is then moved once on its way into the box, not twice, and polled through one
            // state machine fewer.
            Bound::Own => Box::pin(OwnBounded {
                call: coarse_timer::Timeout::new(&self.timer, call),
                timeout: self.timeout,
            }),
        }
    }

    /// A reply as this crate's result: a server error as an error, and the expiry of a response
    /// timeout that the store set (a `MultiplexedConnection`'s) as [`Error::Timeout`].
    pub(in crate::store::redis) fn reply<T: IntoResult>(
        &self,
        reply: redis::RedisResult<T>,
    ) -> Result<T> {
        match reply.and_then(IntoResult::into_result) {
            Ok(reply) => Ok(reply),
            Err(e) if e.is_timeout() && is_multiplexed::<C>() => Err(Error::Timeout(self.timeout)),
            Err(e) => Err(Error::Redis(e)),
        }
    }

    /// When the call began, if it needs to know: only a timeout kept by the connection does,
    /// for a call's second round trip.
    pub(in crate::store::redis) fn started(&self) -> Option<Instant> {
        (self.bound == Bound::Connection).then(Instant::now)
    }

    /// Before a call's second round trip: with the timeout kept by the connection, gives that
    /// round trip only what is left of it, so the call as a whole stays within the timeout.
    pub(in crate::store::redis) fn second_trip(
        &self,
        conn: &mut C,
        started: Option<Instant>,
    ) -> Result<()> {
        let Some(started) = started else {
            return Ok(());
        };
        let left = self.timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(Error::Timeout(self.timeout));
        }
        if let Some(conn) = multiplexed(conn) {
            conn.set_response_timeout(left);
        }
        Ok(())
    }

    /// Whether a call should send its command once more, at once, after the first `reply`:
    /// only when the connection was found lost ([`connection_lost`]), and only once, within
    /// what is left of the timeout. Every command a call sends is idempotent or made so (an
    /// acquisition recognises our own secret already in place), so a command that reached Redis
    /// before its reply was lost does no harm sent again.
    pub(in crate::store::redis) fn retry<T>(
        &self,
        reply: &redis::RedisResult<T>,
        conn: &mut C,
        started: Option<Instant>,
    ) -> Result<bool> {
        match reply {
            Err(e) if connection_lost(e) => {
                tracing::debug!(error = %e, "the connection to Redis was lost; retrying once");
                self.second_trip(conn, started)?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
}

pin_project_lite::pin_project! {
    /// A call bounded by the store's own timer: its reply, or [`Error::Timeout`] once the
    /// timer says its time is up.
    struct OwnBounded<'a, F> {
        #[pin]
        call: coarse_timer::Timeout<'a, F>,
        timeout: Duration,
    }
}

impl<T, F: Future<Output = Result<T>>> Future for OwnBounded<'_, F> {
    type Output = Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let timeout = *this.timeout;
        this.call
            .poll(cx)
            .map(|reply| reply.unwrap_or(Err(Error::Timeout(timeout))))
    }
}

/// Whether `error` says the connection was found dropped or could not be made (Redis restarted,
/// a connection reset), rather than that Redis answered or took too long: the one failure worth
/// a second try at once, on the connection the connection manager or cluster client makes anew.
/// A timeout is not one: the call's timeout is spent.
pub(in crate::store::redis) fn connection_lost(error: &redis::RedisError) -> bool {
    !error.is_timeout()
        && (error.is_connection_dropped() || error.is_connection_refusal() || error.is_io_error())
}

/// A reply whose server errors are still to be turned into errors.
pub(in crate::store::redis) trait IntoResult: Sized {
    fn into_result(self) -> redis::RedisResult<Self>;
}

impl IntoResult for redis::Value {
    fn into_result(self) -> redis::RedisResult<Self> {
        self.extract_error()
    }
}

impl IntoResult for Vec<redis::Value> {
    fn into_result(self) -> redis::RedisResult<Self> {
        // A pipeline's replies: each command's error stays in its place.
        Ok(self)
    }
}

impl IntoResult for Vec<crate::backend::Warning> {
    fn into_result(self) -> redis::RedisResult<Self> {
        Ok(self)
    }
}

/// `conn` as a `MultiplexedConnection`, when it is one.
pub(in crate::store::redis) fn multiplexed<C: Any>(
    conn: &mut C,
) -> Option<&mut MultiplexedConnection> {
    (conn as &mut dyn Any).downcast_mut()
}

/// Whether `C` is a `MultiplexedConnection`, whose response timeout the store sets itself.
pub(in crate::store::redis) fn is_multiplexed<C: Any>() -> bool {
    std::any::TypeId::of::<C>() == std::any::TypeId::of::<MultiplexedConnection>()
}
