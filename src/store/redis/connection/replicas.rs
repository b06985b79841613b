//! [`RedisStore::wait_for_replicas`]: `WAIT` after the writes that make or keep a lease, so a
//! lease counts only once replicas hold it too.
//!
//! `WAIT` counts the writes of the connection it is sent on, so it goes in the same pipeline as
//! the write it vouches for (`EVALSHA …; WAIT n ms`): one round trip, as without it. On a
//! multiplexed connection it also covers every write sent before it, by any task, and it holds
//! back every command sent after it until it answers (Redis runs one client's commands in
//! order); `benches/README.md` measures what that costs. `WAITAOF` (Redis 7.2) would wait for
//! the replicas' disks as well; the crate supports Redis 5.0, and plain `WAIT` is what it sends.

use std::time::Duration;

use redis::aio::ConnectionLike;

use crate::backend::{Acquisition, LeaseRef, LockRef, Mode, Secret};
use crate::store::redis::RedisStore;
use crate::{Error, Result};

/// How many replicas must acknowledge a lease's write, and how long `WAIT` waits for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::store::redis) struct Replicas {
    pub(in crate::store::redis) wanted: u32,
    pub(in crate::store::redis) timeout: Duration,
}

impl Replicas {
    /// `WAIT <wanted> <ms>`, never with 0 ms, which would wait for ever.
    pub(in crate::store::redis) fn command(self) -> redis::Cmd {
        let ms = (self.timeout.as_millis() as u64).max(1);
        let mut wait = redis::Cmd::with_capacity(3, 16);
        wait.arg("WAIT").arg(self.wanted).arg(ms);
        wait
    }

    /// `Ok` when `WAIT` answered at least `wanted` replicas.
    pub(in crate::store::redis) fn check(self, reply: redis::Value) -> Result<()> {
        let acked = match reply.extract_error().map_err(Error::Redis)? {
            redis::Value::Int(n) => u32::try_from(n.max(0)).unwrap_or(u32::MAX),
            other => return Err(Error::UnexpectedReply(format!("WAIT answered {other:?}"))),
        };
        if acked < self.wanted {
            return Err(Error::NotReplicated {
                acked,
                wanted: self.wanted,
            });
        }
        Ok(())
    }
}

/// `command` then `WAIT`, in one pipeline.
pub(in crate::store::redis) fn then_wait(
    command: redis::Cmd,
    replicas: Replicas,
) -> redis::Pipeline {
    let mut pipe = redis::Pipeline::with_capacity(2);
    pipe.add_command(command).add_command(replicas.command());
    pipe
}

/// The last reply of a pipeline that ended with `WAIT`, taken off the others.
pub(in crate::store::redis) fn split_wait(
    mut replies: Vec<redis::Value>,
) -> Result<(Vec<redis::Value>, redis::Value)> {
    match replies.pop() {
        Some(wait) => Ok((replies, wait)),
        None => Err(Error::UnexpectedReply("a pipeline answered nothing".into())),
    }
}

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// An acquisition whose write reached too few replicas: its lease is released (on the
    /// primary, which is all that can be reached), so the name is free again, and the caller
    /// gets [`Error::NotReplicated`]. A refusal wrote nothing, and stands whatever `WAIT` said.
    pub(in crate::store::redis) async fn unless_replicated(
        &self,
        lease: LeaseRef<'_>,
        acquisition: Acquisition,
        wait: Option<redis::Value>,
        replicas: Replicas,
    ) -> Result<Acquisition> {
        let Acquisition::Acquired { .. } = acquisition else {
            return Ok(acquisition);
        };
        let Some(wait) = wait else {
            return Err(Error::UnexpectedReply("WAIT did not answer".into()));
        };
        let Err(short) = replicas.check(wait) else {
            return Ok(acquisition);
        };
        if let Err(e) = crate::backend::Backend::release(self, lease).await {
            // The lease then ends with its TTL, as any lease whose holder went away.
            tracing::warn!(error = %e, "could not release a lease that was not replicated");
        }
        Err(short)
    }

    /// The unfenced exclusive acquire with `WAIT`: `SET NX PX`, `PTTL` and `WAIT` in one
    /// pipeline (the `PTTL` of a `SET` that took the key is read and ignored: a second round
    /// trip costs more than it).
    pub(in crate::store::redis) async fn set_nx_replicated(
        &self,
        lock: LockRef<'_>,
        secret: &Secret,
        replicas: Replicas,
    ) -> Result<Acquisition> {
        let mut pipe = redis::Pipeline::with_capacity(3);
        pipe.add_command(self.set_nx_command(lock, secret))
            .add_command(self.pttl_command(lock))
            .add_command(replicas.command());
        let started = self.started();
        let mut conn = self.conn.clone();
        let mut reply = conn.req_packed_commands(&pipe, 0, 3).await;
        let mut retried = None;
        if self.retry(&reply, &mut conn, started)? {
            let mut again = self.set_nx_again(lock, secret);
            again.add_command(replicas.command());
            reply = conn.req_packed_commands(&again, 0, 4).await;
            retried = Some(secret);
        }
        let (replies, wait) = split_wait(self.reply(reply)?)?;
        let acquisition = self.set_nx_answer(lock, replies, retried)?;
        let lease = LeaseRef::new(lock, Mode::Exclusive, secret);
        self.unless_replicated(lease, acquisition, Some(wait), replicas)
            .await
    }
}
