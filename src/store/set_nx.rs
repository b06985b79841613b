//! The unfenced exclusive acquire of [`RedisStore`]: `SET NX PX`, with the holder's `PTTL` for
//! a refusal, in a second round trip or, for a name refused lately ([`ContendedNames`]), in the
//! same one.
//!
//! [`ContendedNames`]: super::contended::ContendedNames

use std::future::Future;
use std::time::Duration;

use redis::aio::ConnectionLike;

use super::keys::KeyRole;
use super::redis::ARGS_LEN;
use super::{Acquisition, LockRef, RedisStore, Secret};
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
    /// for the holder's remaining lease, within the same deadline, unless the name was refused
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
    pub(super) fn set_nx<'a>(
        &'a self,
        lock: LockRef<'a>,
        secret: &Secret,
    ) -> impl Future<Output = Result<Acquisition>> + Send + 'a {
        let mut command = self.set_nx_command(lock, secret);
        async move {
            let started = self.started();
            let mut conn = self.conn.clone();
            // The reply is not kept across the second round trip.
            if set_nx_acquired(self.reply(conn.req_packed_command(&command).await)?)? {
                return Ok(Acquisition::Acquired { fence: None });
            }
            self.second_trip(&mut conn, started)?;
            // In the same place as the `SET`: one command's room in the state, not two.
            command = self.pttl_command(lock);
            self.refused(lock, self.reply(conn.req_packed_command(&command).await)?)
        }
    }

    /// [`set_nx`](Self::set_nx) for a name refused lately: the `SET NX PX` and its `PTTL` in
    /// one pipeline. A future of its own, so that the plain one carries no room for it.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn would keep its arguments twice"
    )]
    pub(super) fn set_nx_and_pttl<'a>(
        &'a self,
        lock: LockRef<'a>,
        secret: &Secret,
    ) -> impl Future<Output = Result<Acquisition>> + Send + 'a {
        let mut both = redis::Pipeline::with_capacity(2);
        both.add_command(self.set_nx_command(lock, secret))
            .add_command(self.pttl_command(lock));
        async move {
            let mut conn = self.conn.clone();
            let replies = self.reply(conn.req_packed_commands(&both, 0, 2).await)?;
            self.set_nx_answer(lock, replies)
        }
    }

    /// The answers of a pipelined `SET NX PX` and `PTTL`, remembered for the name's next
    /// acquisition.
    fn set_nx_answer(&self, lock: LockRef<'_>, replies: Vec<redis::Value>) -> Result<Acquisition> {
        let mut replies = replies.into_iter();
        let (Some(set), Some(pttl)) = (replies.next(), replies.next()) else {
            return Err(Error::UnexpectedReply(
                "a pipeline of two answered less".into(),
            ));
        };
        if set_nx_acquired(set.extract_error().map_err(Error::Redis)?)? {
            self.contended.acquired(lock.namespace, lock.name);
            return Ok(Acquisition::Acquired { fence: None });
        }
        self.refused(lock, pttl.extract_error().map_err(Error::Redis)?)
    }

    /// A refused acquisition, from the holder's `PTTL`, remembered for the name's next one.
    fn refused(&self, lock: LockRef<'_>, pttl: redis::Value) -> Result<Acquisition> {
        let redis::Value::Int(pttl) = pttl else {
            return Err(Error::UnexpectedReply(format!("PTTL answered {pttl:?}")));
        };
        // -1 for a key someone set without expiry: "retry soon" rather than never.
        let retry_after = Duration::from_millis(pttl.max(0) as u64);
        self.contended
            .refused(lock.namespace, lock.name, retry_after);
        Ok(Acquisition::Busy { retry_after })
    }

    /// `SET <key> <secret> NX PX <ttl>`.
    fn set_nx_command(&self, lock: LockRef<'_>, secret: &Secret) -> redis::Cmd {
        let key = self.key_arg(KeyRole::Lock, lock);
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
    fn pttl_command(&self, lock: LockRef<'_>) -> redis::Cmd {
        let key = self.key_arg(KeyRole::Lock, lock);
        let mut pttl = redis::Cmd::with_capacity(2, key.len() + 8);
        pttl.arg("PTTL").arg(key);
        pttl
    }
}

/// Whether a `SET NX` took the key (`OK`) rather than finding it taken (nil).
fn set_nx_acquired(reply: redis::Value) -> Result<bool> {
    match reply {
        redis::Value::Okay => Ok(true),
        redis::Value::Nil => Ok(false),
        other => Err(Error::UnexpectedReply(format!("SET NX answered {other:?}"))),
    }
}
