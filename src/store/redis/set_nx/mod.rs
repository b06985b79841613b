//! The unfenced exclusive acquire of [`RedisStore`]: `SET NX PX`, with the holder's `PTTL` for
//! a refusal, in a second round trip or, for a name refused lately ([`ContendedNames`]), in the
//! same one.
//!
//! [`ContendedNames`]: crate::store::redis::set_nx::contended::ContendedNames

pub(in crate::store::redis) mod contended;

use std::future::Future;

use redis::aio::ConnectionLike;

use crate::backend::{Acquisition, LockRef, Secret};
use crate::store::redis::RedisStore;
use crate::store::redis::keys::KeyRole;
use crate::store::redis::scripts::ARGS_LEN;
use crate::{Error, Result};

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// The unfenced exclusive acquire, the hot path of every locked request: `SET NX PX`
    /// instead of `acquire.lua`, and only when that is refused, `PTTL` for `retry_after`.
    ///
    /// The server runs a plain command instead of a Lua call, which costs it about half as much
    /// (the `throughput` benchmark measures both), and an acquisition that succeeds, the common
    /// case, makes one round trip with one command. A refused one makes a second round trip
    /// for the holder's remaining lease, within the same timeout, unless the name was refused
    /// lately (see the module docs): then the `PTTL` goes in one pipeline with the `SET`. If the
    /// holder releases between the two, `PTTL` answers -2, and "retry now" is then true.
    ///
    /// A function returning a block rather than an `async fn` (which keeps its arguments twice),
    /// with the commands built outside the block's awaits: the block's state is boxed for every
    /// acquisition in flight, so it holds only what a round trip needs.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn would keep its arguments twice"
    )]
    pub(in crate::store::redis) fn set_nx<'a>(
        &'a self,
        lock: LockRef<'a>,
        secret: &Secret,
    ) -> impl Future<Output = Result<Acquisition>> + Send + 'a {
        let mut command = self.set_nx_command(lock, secret);
        // Sixteen bytes kept for a retry, rather than a retry's commands built for every call.
        let secret = secret.clone();
        async move {
            let started = self.started();
            let mut conn = self.conn.clone();
            let reply = conn.req_packed_command(&command).await;
            if self.retry(&reply, &mut conn, started)? {
                // The `SET` may have taken the key before its reply was lost: the retry asks
                // who holds it too, so our own lease is recognised rather than called busy.
                let again = self.set_nx_again(lock, &secret);
                let replies = self.reply(conn.req_packed_commands(&again, 0, 3).await)?;
                return self.set_nx_answer(lock, replies, Some(&secret));
            }
            // The reply is not kept across the second round trip.
            if set_nx_acquired(self.reply(reply)?)? {
                return Ok(Acquisition::Acquired { fence: None });
            }
            self.second_trip(&mut conn, started)?;
            // In the same place as the `SET`: one command's room in the state, not two.
            command = self.pttl_command(lock);
            let mut reply = conn.req_packed_command(&command).await;
            if self.retry(&reply, &mut conn, started)? {
                reply = conn.req_packed_command(&command).await;
            }
            self.refused(lock, self.reply(reply)?)
        }
    }

    /// A waiter's first `SET NX PX`, alone: `true` when it took the key. A refusal goes on to
    /// `acquire.lua`, which looks again and marks the lock in one step, so that the holder's
    /// release publishes (`RedisStore::acquire_script`); a release between the two leaves the
    /// key free for the script.
    pub(in crate::store::redis) async fn set_nx_only(
        &self,
        lock: LockRef<'_>,
        secret: &Secret,
    ) -> Result<bool> {
        let command = self.set_nx_command(lock, secret);
        let started = self.started();
        let mut conn = self.conn.clone();
        let mut reply = conn.req_packed_command(&command).await;
        if self.retry(&reply, &mut conn, started)? {
            // A first `SET` whose reply was lost may have taken the key: refused now, the
            // script then finds our own secret and answers acquired.
            reply = conn.req_packed_command(&command).await;
        }
        set_nx_acquired(self.reply(reply)?)
    }

    /// The retry of a `SET NX PX` whose connection was lost: the `SET` again, the key's value
    /// and its `PTTL`, in one pipeline. The `GET` tells a key our first `SET` took (its reply
    /// lost) from one someone else holds; `SET … NX GET` would say it in one command, but only
    /// from Redis 7.0, and the crate supports 5.0.
    pub(in crate::store::redis) fn set_nx_again(
        &self,
        lock: LockRef<'_>,
        secret: &Secret,
    ) -> redis::Pipeline {
        let key = self.key_arg(KeyRole::Lock, lock);
        let mut get = redis::Cmd::with_capacity(2, key.len() + 8);
        get.arg("GET").arg(key);
        let mut again = redis::Pipeline::with_capacity(3);
        again
            .add_command(self.set_nx_command(lock, secret))
            .add_command(get)
            .add_command(self.pttl_command(lock));
        again
    }

    /// [`set_nx`](Self::set_nx) for a name refused lately: the `SET NX PX` and its `PTTL` in
    /// one pipeline. A future of its own, so that the plain one carries no room for it.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn would keep its arguments twice"
    )]
    pub(in crate::store::redis) fn set_nx_and_pttl<'a>(
        &'a self,
        lock: LockRef<'a>,
        secret: &Secret,
    ) -> impl Future<Output = Result<Acquisition>> + Send + 'a {
        let mut both = redis::Pipeline::with_capacity(2);
        both.add_command(self.set_nx_command(lock, secret))
            .add_command(self.pttl_command(lock));
        let secret = secret.clone();
        async move {
            let started = self.started();
            let mut conn = self.conn.clone();
            let reply = conn.req_packed_commands(&both, 0, 2).await;
            if self.retry(&reply, &mut conn, started)? {
                let again = self.set_nx_again(lock, &secret);
                let replies = self.reply(conn.req_packed_commands(&again, 0, 3).await)?;
                return self.set_nx_answer(lock, replies, Some(&secret));
            }
            self.set_nx_answer(lock, self.reply(reply)?, None)
        }
    }

    /// The answers of a pipelined `SET NX PX` and `PTTL` (or, for a retry, `SET NX PX`, `GET`
    /// and `PTTL`, with the `secret` the `GET` may find), remembered for the name's next
    /// acquisition.
    pub(in crate::store::redis) fn set_nx_answer(
        &self,
        lock: LockRef<'_>,
        replies: Vec<redis::Value>,
        retried: Option<&Secret>,
    ) -> Result<Acquisition> {
        let expected = if retried.is_some() { 3 } else { 2 };
        if replies.len() != expected {
            return Err(Error::UnexpectedReply(format!(
                "a pipeline of {expected} answered {}",
                replies.len()
            )));
        }
        let mut replies = replies.into_iter().map(redis::Value::extract_error);
        let mut next = || replies.next().expect("counted above").map_err(Error::Redis);
        let mut acquired = set_nx_acquired(next()?)?;
        if let Some(secret) = retried {
            // Our own secret in place: the first `SET` took the key, and only its reply was lost.
            // Marked or not: a waiter refused by it may have added its `!` since.
            let ours = matches!(next()?, redis::Value::BulkString(held) if held.strip_suffix(b"!").unwrap_or(&held) == secret.as_bytes().as_slice());
            acquired |= ours;
        }
        if acquired {
            self.contended.acquired(lock.namespace, lock.name);
            return Ok(Acquisition::Acquired { fence: None });
        }
        self.refused(lock, next()?)
    }

    /// A refused acquisition, from the holder's `PTTL`, remembered for the name's next one.
    fn refused(&self, lock: LockRef<'_>, pttl: redis::Value) -> Result<Acquisition> {
        let redis::Value::Int(pttl) = pttl else {
            return Err(Error::UnexpectedReply(format!("PTTL answered {pttl:?}")));
        };
        let retry_after = crate::store::redis::busy_for(pttl, lock);
        self.contended
            .refused(lock.namespace, lock.name, retry_after);
        Ok(Acquisition::Busy { retry_after })
    }

    /// `SET <key> <secret> NX PX <ttl>`.
    pub(in crate::store::redis) fn set_nx_command(
        &self,
        lock: LockRef<'_>,
        secret: &Secret,
    ) -> redis::Cmd {
        self.set_nx_on(KeyRole::Lock, lock, secret)
    }

    /// `SET NX PX` of `role`'s key: a lock's, or an idempotency key's reservation.
    pub(in crate::store::redis) fn set_nx_on(
        &self,
        role: KeyRole,
        lock: LockRef<'_>,
        secret: &Secret,
    ) -> redis::Cmd {
        let key = self.key_arg(role, lock);
        let mut set = redis::Cmd::with_capacity(6, key.len() + ARGS_LEN);
        set.arg("SET")
            .arg(key)
            .arg(secret.as_bytes().as_slice())
            .arg("NX")
            .arg("PX")
            .arg(lock.ttl.as_millis() as u64);
        set
    }

    /// `PTTL <key>`.
    pub(in crate::store::redis) fn pttl_command(&self, lock: LockRef<'_>) -> redis::Cmd {
        let key = self.key_arg(KeyRole::Lock, lock);
        let mut pttl = redis::Cmd::with_capacity(2, key.len() + 8);
        pttl.arg("PTTL").arg(key);
        pttl
    }
}

/// Whether a `SET NX` took the key (`OK`) rather than finding it taken (nil).
pub(in crate::store::redis) fn set_nx_acquired(reply: redis::Value) -> Result<bool> {
    match reply {
        redis::Value::Okay => Ok(true),
        redis::Value::Nil => Ok(false),
        other => Err(Error::UnexpectedReply(format!("SET NX answered {other:?}"))),
    }
}
