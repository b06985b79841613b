//! [`Backend::extend_many`] for [`RedisStore`]: the heartbeat's batches as one pipeline.

use redis::aio::ConnectionLike;

use super::connection::replicas::split_wait;
use super::native::cas::{Cas, native_mode, out_of_memory, set_ifeq_extended, unknown};
use super::scripts::{Holder, Lua, NO_SCRIPT, holder_script};
use super::{KeyRole, RedisStore};
use crate::backend::{Backend, Extended, LeaseRef, Mode};
use crate::{Error, Result};

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// [`Backend::extend_many`]: one pipeline of `EVALSHA`s, then one of `EVAL`s for those that
    /// answered `NOSCRIPT` (after a restart or a `SCRIPT FLUSH`).
    ///
    /// A cluster pipeline goes to one slot's node, and every name has its own slot, so on a
    /// cluster connection the extends run as concurrent single calls.
    pub(super) async fn extend_pipelined(&self, leases: &[LeaseRef<'_>]) -> Vec<Result<Extended>> {
        if leases.len() < 2 || is_cluster::<C>() {
            return self.extend_each(leases).await;
        }
        let (mut replies, mut short) = match self
            .extend_pipeline(leases, |lua| lua.sha(), "EVALSHA")
            .await
        {
            Ok(replies) => replies,
            // A cluster connection behind some wrapper: it refuses the cross-slot pipeline
            // before sending anything.
            Err(Error::Redis(e)) if e.kind() == redis::ErrorKind::Server(CROSS_SLOT) => {
                return self.extend_each(leases).await;
            }
            Err(e) => return leases.iter().map(|_| Err(copy(&e))).collect(),
        };
        if replies.len() != leases.len() {
            let missing = format!("{} replies to {} extends", replies.len(), leases.len());
            return leases
                .iter()
                .map(|_| Err(Error::UnexpectedReply(missing.clone())))
                .collect();
        }
        if replies.iter().any(unknown) {
            // A server that no longer knows `SET … IFEQ`: the scripts from the next beat on.
            self.native.set(Cas::Lua);
        }
        let mut no_script = Vec::new();
        let mut full = Vec::new();
        let native = self.native.get().extends();
        let mut answers: Vec<Result<Extended>> = Vec::with_capacity(leases.len());
        for (i, reply) in replies.drain(..).enumerate() {
            if matches!(&reply, redis::Value::ServerError(e) if e.kind() == Some(NO_SCRIPT)) {
                no_script.push(i);
            }
            // A full server refuses `SET … IFEQ` but not the script's `PEXPIRE`; and one that
            // found the key changed (a waiter's mark, or the lease gone) leaves the script to
            // tell which.
            let changed = native && reply == redis::Value::Nil;
            if (out_of_memory(&reply) || changed) && native_mode(leases[i].mode) {
                full.push(i);
            }
            answers.push(answer(reply, short));
        }
        for i in full {
            answers[i] = self.extend_script(leases[i]).await;
        }
        if !no_script.is_empty() {
            let missing: Vec<_> = no_script.iter().map(|&i| leases[i]).collect();
            match self.extend_pipeline(&missing, |lua| lua.code, "EVAL").await {
                Ok((again, again_short)) if again.len() == missing.len() => {
                    short = again_short;
                    for (i, reply) in no_script.into_iter().zip(again) {
                        answers[i] = answer(reply, short);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    for i in no_script {
                        answers[i] = Err(copy(&e));
                    }
                }
            }
        }
        answers
    }

    /// Sends one pipelined `verb` (`EVALSHA` or `EVAL`) of the extend script per lease, or
    /// `SET … IFEQ` for an exclusive or writer lease where the server has it; errors
    /// of single commands come back as [`redis::Value::ServerError`] in their place. With
    /// [`wait_for_replicas`](RedisStore::wait_for_replicas), one `WAIT` ends the pipeline and
    /// vouches for the whole batch; it answers how many replicas it fell short by, if it did.
    async fn extend_pipeline(
        &self,
        leases: &[LeaseRef<'_>],
        script: fn(&'static Lua) -> &'static str,
        verb: &str,
    ) -> Result<(Vec<redis::Value>, Short)> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let native = self.native.get().extends();
        for &lease in leases {
            if native && native_mode(lease.mode) {
                pipe.add_command(self.set_ifeq(lease));
                continue;
            }
            let (lua, _) = holder_script(lease.mode, Holder::Extend);
            let roles = extend_keys(lease.mode);
            let command = pipe.cmd(verb).arg(script(lua)).arg(roles.len());
            for &role in roles {
                command.arg(self.key_arg(role, lease.lock));
            }
            command
                .arg(lease.secret.as_bytes().as_slice())
                .arg(lease.lock.ttl.as_millis() as u64);
        }
        if let Some(replicas) = self.replicas {
            pipe.add_command(replicas.command());
        }
        let mut conn = self.conn.clone();
        let replies = self
            .bounded(async {
                let started = self.started();
                let mut reply = pipe.query_async(&mut conn).await;
                // Extends are compare-and-act: a batch that reached Redis does no harm sent again.
                if self.retry(&reply, &mut conn, started)? {
                    reply = pipe.query_async(&mut conn).await;
                }
                self.reply(reply)
            })
            .await?;
        let Some(replicas) = self.replicas else {
            return Ok((replies, None));
        };
        let (replies, wait) = split_wait(replies)?;
        match replicas.check(wait) {
            Ok(()) => Ok((replies, None)),
            Err(Error::NotReplicated { acked, wanted }) => Ok((replies, Some((acked, wanted)))),
            Err(e) => Err(e),
        }
    }

    async fn extend_each(&self, leases: &[LeaseRef<'_>]) -> Vec<Result<Extended>> {
        let calls = leases.iter().map(|&lease| self.extend(lease));
        futures_util::future::join_all(calls).await
    }
}

const CROSS_SLOT: redis::ServerErrorKind = redis::ServerErrorKind::CrossSlot;

/// Whether `C` is redis-rs's cluster connection, whose pipelines cannot span slots.
#[cfg_attr(
    not(feature = "cluster"),
    allow(
        clippy::extra_unused_type_parameters,
        reason = "without the feature no type is a cluster connection"
    )
)]
fn is_cluster<C: 'static>() -> bool {
    #[cfg(feature = "cluster")]
    {
        std::any::TypeId::of::<C>()
            == std::any::TypeId::of::<redis::cluster_async::ClusterConnection>()
    }
    #[cfg(not(feature = "cluster"))]
    false
}

/// How many replicas acknowledged a batch, and how many it needed, when too few did.
type Short = Option<(u32, u32)>;

/// One extend's answer in a batch: a lease the batch extended but whose `WAIT` fell `short` is
/// not replicated.
fn answer(reply: redis::Value, short: Short) -> Result<Extended> {
    let extended = match reply {
        redis::Value::ServerError(e) => return Err(Error::Redis(e.into())),
        reply => extended(reply)?,
    };
    match short {
        Some((acked, wanted)) if extended != Extended::Gone => {
            Err(Error::NotReplicated { acked, wanted })
        }
        _ => Ok(extended),
    }
}

/// The keys an extend script takes for a lease of `mode`: a reader's extend also reads the
/// write intent, to report a waiting writer ([`Extended::HeldWriterWaiting`]).
pub(super) fn extend_keys(mode: Mode) -> &'static [KeyRole] {
    match mode {
        Mode::Read => &[KeyRole::Readers, KeyRole::WriteIntent],
        Mode::Write => &[KeyRole::Writer],
        Mode::Exclusive => &[KeyRole::Lock],
        // A permit is extended as a reader is, by `read_extend.lua`, without an intent to report.
        Mode::Permit => &[KeyRole::Permits],
        Mode::Reservation => &[KeyRole::Idempotency],
    }
}

/// An extend script's answer: 0 gone, 1 extended, 2 extended while a write intent lives; or a
/// `SET … IFEQ`'s: `OK` extended, nil gone.
pub(super) fn extended(reply: redis::Value) -> Result<Extended> {
    if matches!(reply, redis::Value::Okay | redis::Value::Nil) {
        return set_ifeq_extended(reply);
    }
    let n: i64 =
        redis::from_redis_value(reply).map_err(|e| Error::UnexpectedReply(e.to_string()))?;
    match n {
        0 => Ok(Extended::Gone),
        1 => Ok(Extended::Held),
        2 => Ok(Extended::HeldWriterWaiting),
        n => Err(Error::UnexpectedReply(format!("an extend answered {n}"))),
    }
}

/// The same failure again, for each lease of a batch that failed as a whole.
fn copy(error: &Error) -> Error {
    match error {
        Error::Redis(e) => Error::Redis(e.clone()),
        Error::Timeout(d) => Error::Timeout(*d),
        Error::NotReplicated { acked, wanted } => Error::NotReplicated {
            acked: *acked,
            wanted: *wanted,
        },
        other => Error::UnexpectedReply(other.to_string()),
    }
}
