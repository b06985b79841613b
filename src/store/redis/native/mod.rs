//! Native compare-and-set: on servers that have it, an exclusive or writer lease is extended
//! and released with plain commands instead of `extend.lua` and `release.lua` (`backend.rs` runs those).
//!
//! - extend: `SET key secret IFEQ secret PX ttl` (Valkey 8.1+, Redis 8.4+), which sets nothing
//!   when the key is gone or holds another secret, so it never re-acquires;
//! - release: `DELIFEQ key secret` (Valkey 9.0+) or `DELEX key IFEQ secret` (Redis 8.4+),
//!   alone.
//!
//! A waiter refused by a lease marks its key (the secret and `!`, see `lock/acquire.lua`), so
//! that its release publishes: the native commands compare the unmarked secret, so they act
//! only while nobody waits. One that finds the key changed (marked, or the lease gone) hands
//! the call to its script, which tells the two apart and publishes for a mark: with nobody
//! waiting a release is the bare delete, and a marked one costs a second round trip.
//!
//! The server is asked once: at connect by `connect`, `from_client`, `connect_cluster` and
//! `connect_sentinel`, and on the first extend or release of a store made with `new`:
//! `COMMAND INFO DELIFEQ DELEX`, and when it has neither, `SET` with `IFEQ` on a probe key
//! that no lease uses (a missing key, so it sets nothing). A server that later refuses one of
//! these commands (a failover or a rolling downgrade to an older one) sends the store back to
//! the scripts for good, and the call that found out runs its script at once.

pub(in crate::store::redis) mod cas;

use redis::aio::ConnectionLike;

use crate::backend::{Completion, Extended, LeaseRef, Mode};
use crate::store::redis::connection::replicas::split_wait;
use crate::store::redis::keys::KeyRole;
use crate::store::redis::native::cas::{
    Cas, commands_found, out_of_memory, set_ifeq_extended, unknown,
};
use crate::store::redis::{RedisStore, notify};
use crate::{Error, Result};

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// What the server has, asked now if it was not yet.
    async fn cas(&self) -> Cas {
        match self.native.get() {
            Cas::Unknown => self.probe_native().await,
            known => known,
        }
    }

    /// Asks the server which compare-and-set commands it has, remembers the answer unless
    /// none came, and says in a debug event which path the store takes.
    pub(in crate::store::redis) async fn probe_native(&self) -> Cas {
        let cas = self.ask_native().await;
        if cas != Cas::Unknown {
            self.native.set(cas);
        }
        tracing::debug!(path = cas.describe(), "tower-lease: compare-and-set");
        cas
    }

    async fn ask_native(&self) -> Cas {
        let mut conn = self.conn.clone();
        let mut info = redis::cmd("COMMAND");
        info.arg("INFO").arg("DELIFEQ").arg("DELEX");
        let found = match conn.req_packed_command(&info).await {
            Ok(reply) => match commands_found(reply) {
                Some(found) => found,
                // Refused (an ACL, a proxy): the scripts, which need nothing to be asked.
                None => return Cas::Lua,
            },
            Err(e) if matches!(e.kind(), redis::ErrorKind::Server(_)) => return Cas::Lua,
            Err(_) => return Cas::Unknown,
        };
        match found {
            (true, _) => return Cas::DelIfEq,
            (_, true) => return Cas::DelEx,
            _ => {}
        }
        // `IFEQ` on a key that does not exist sets nothing where it is known, and is a syntax
        // error where it is not.
        let mut probe = redis::cmd("SET");
        let key = format!("{}:probe", self.layout().prefix());
        probe.arg(key).arg("").arg("IFEQ").arg("");
        match conn.req_packed_command(&probe).await {
            Ok(redis::Value::Nil) => Cas::SetIfEq,
            Ok(_) => Cas::Lua,
            Err(e) if matches!(e.kind(), redis::ErrorKind::Server(_)) => Cas::Lua,
            Err(_) => Cas::Unknown,
        }
    }

    /// Extends `lease` with `SET key secret IFEQ secret PX ttl` (and `WAIT` in the same
    /// pipeline when the store waits for replicas); `None` when the server has no `IFEQ`,
    /// for the script to do it.
    pub(in crate::store::redis) async fn extend_native(
        &self,
        lease: LeaseRef<'_>,
    ) -> Result<Option<Extended>> {
        if !self.cas().await.extends() {
            return Ok(None);
        }
        let mut pipe = redis::Pipeline::with_capacity(2);
        pipe.add_command(self.set_ifeq(lease));
        if let Some(replicas) = self.replicas {
            pipe.add_command(replicas.command());
        }
        let Some(mut replies) = self.send_native(&pipe).await? else {
            return Ok(None);
        };
        if replies.first().is_some_and(out_of_memory) {
            // `SET` is refused when memory is full, `PEXPIRE` in the script is not: a holder
            // keeps its lease on a full server, as on one without native commands.
            return Ok(None);
        }
        let waited = match self.replicas {
            Some(_) => {
                let (rest, waited) = split_wait(replies)?;
                replies = rest;
                Some(waited)
            }
            None => None,
        };
        let extended = set_ifeq_extended(replies.pop().unwrap_or(redis::Value::Nil))?;
        if extended == Extended::Gone {
            // Gone, or marked by a waiter: the script tells which.
            return Ok(None);
        }
        if let (Some(replicas), Some(waited)) = (self.replicas, waited) {
            // A lease found gone wrote nothing to wait for.
            if extended != Extended::Gone {
                replicas.check(waited)?;
            }
        }
        Ok(Some(extended))
    }

    /// `SET key secret IFEQ secret PX ttl` for `lease`'s key.
    pub(in crate::store::redis) fn set_ifeq(&self, lease: LeaseRef<'_>) -> redis::Cmd {
        let key = self.key_arg(role(lease.mode), lease.lock);
        let secret = lease.secret.as_bytes();
        let mut set = redis::Cmd::with_capacity(7, key.len() + 2 * secret.len() + 24);
        set.arg("SET")
            .arg(key)
            .arg(secret.as_slice())
            .arg("IFEQ")
            .arg(secret.as_slice())
            .arg("PX")
            .arg(lease.lock.ttl.as_millis() as u64);
        set
    }

    /// Releases `lease` with `DELIFEQ` or `DELEX … IFEQ`; `None` when the server has neither,
    /// or the key no longer holds the bare secret (a waiter marked it, or the lease is gone),
    /// for the script to do it.
    pub(in crate::store::redis) async fn release_native(
        &self,
        lease: LeaseRef<'_>,
    ) -> Result<Option<bool>> {
        let cas = self.cas().await;
        if !matches!(cas, Cas::DelIfEq | Cas::DelEx) {
            return Ok(None);
        }
        let (lock, secret) = (lease.lock, lease.secret.as_bytes());
        let key = self.key_arg(role(lease.mode), lock);
        let mut delete = redis::Cmd::with_capacity(4, key.len() + secret.len() + 16);
        match cas {
            Cas::DelEx => delete.arg("DELEX").arg(key).arg("IFEQ"),
            _ => delete.arg("DELIFEQ").arg(key),
        };
        delete.arg(secret.as_slice());
        let mut pipe = redis::Pipeline::with_capacity(1);
        pipe.add_command(delete);
        let Some(replies) = self.send_native(&pipe).await? else {
            return Ok(None);
        };
        let deleted = replies.into_iter().next().unwrap_or(redis::Value::Nil);
        match deleted.extract_error().map_err(Error::Redis)? {
            redis::Value::Int(1) => Ok(Some(true)),
            redis::Value::Int(_) => Ok(None),
            other => Err(Error::UnexpectedReply(format!(
                "a delete answered {other:?}"
            ))),
        }
    }

    /// Stores a completed request's record over its reservation with `SET key record IFEQ
    /// secret PX retention`, then publishes on the key's channel, in one pipeline (with `WAIT`
    /// after them when the store waits for replicas). `None` when the server has no `IFEQ` or
    /// the key no longer holds the secret (it ran out, or a retry of this call already wrote
    /// the record), for `idem_complete.lua` to tell those apart.
    pub(in crate::store::redis) async fn complete_native(
        &self,
        lease: LeaseRef<'_>,
        completion: Completion<'_>,
    ) -> Result<Option<bool>> {
        if !self.cas().await.extends() {
            return Ok(None);
        }
        let LeaseRef { lock, secret, .. } = lease;
        let key = self.key_arg(KeyRole::Idempotency, lock);
        let secret = secret.as_bytes();
        let record = Record([
            completion.fingerprint,
            secret.as_slice(),
            completion.response,
        ]);
        let len = key.len() + record.len() + secret.len() + 32;
        let mut set = redis::Cmd::with_capacity(7, len);
        // At least 1 ms: `PX 0` is refused.
        let retention = completion.retention.as_millis().max(1) as u64;
        set.arg("SET").arg(key).arg(record).arg("IFEQ");
        set.arg(secret.as_slice()).arg("PX").arg(retention);
        let mut pipe = redis::Pipeline::with_capacity(3);
        pipe.add_command(set).add_command(self.publish(lease));
        if let Some(replicas) = self.replicas {
            pipe.add_command(replicas.command());
        }
        let Some(mut replies) = self.send_native(&pipe).await? else {
            return Ok(None);
        };
        // `WAIT`'s answer is the last.
        let waited = self
            .replicas
            .map(|_| replies.pop().unwrap_or(redis::Value::Nil));
        let stored = replies.into_iter().next().unwrap_or(redis::Value::Nil);
        if out_of_memory(&stored) {
            return Ok(None);
        }
        if set_ifeq_extended(stored)? == Extended::Gone {
            return Ok(None);
        }
        // A record the replicas did not acknowledge may be lost with the primary.
        if let (Some(replicas), Some(waited)) = (self.replicas, waited) {
            replicas.check(waited)?;
        }
        Ok(Some(true))
    }

    /// The `PUBLISH` (`SPUBLISH` on a sharded store) that wakes the waiters of `lease`'s name
    /// elsewhere, sent after a native command that frees it.
    pub(in crate::store::redis) fn publish(&self, lease: LeaseRef<'_>) -> redis::Cmd {
        let lock = lease.lock;
        let channel = notify::channel_arg(self.layout(), lease.mode, lock.namespace, lock.name);
        let mut publish = redis::Cmd::with_capacity(3, channel.len() + 32);
        let verb = if self.sharded { "SPUBLISH" } else { "PUBLISH" };
        // The holder's secret: the releasing store knows its own message by it.
        publish
            .arg(verb)
            .arg(channel)
            .arg(lease.secret.as_bytes().as_slice());
        publish
    }

    /// Sends `pipe` (retried once on a lost connection: every command in it compares before it
    /// acts); `None`, and the scripts from now on, when the server does not know its first
    /// command.
    async fn send_native(&self, pipe: &redis::Pipeline) -> Result<Option<Vec<redis::Value>>> {
        let (started, mut conn) = (self.started(), self.conn.clone());
        let count = pipe.cmd_iter().count();
        let mut reply = conn.req_packed_commands(pipe, 0, count).await;
        if self.retry(&reply, &mut conn, started)? {
            reply = conn.req_packed_commands(pipe, 0, count).await;
        }
        let replies = self.reply(reply)?;
        if replies.first().is_some_and(unknown) {
            tracing::debug!(
                path = Cas::Lua.describe(),
                "tower-lease: the server refused a compare-and-set command"
            );
            self.native.set(Cas::Lua);
            return Ok(None);
        }
        Ok(Some(replies))
    }
}

/// The key a native command acts on for a lease of `mode`.
fn role(mode: Mode) -> KeyRole {
    match mode {
        Mode::Write => KeyRole::Writer,
        _ => KeyRole::Lock,
    }
}

/// A record as `idem_complete.lua` writes it, fingerprint, secret and response, written into
/// the command as one argument without being joined first.
struct Record<'a>([&'a [u8]; 3]);

impl Record<'_> {
    fn len(&self) -> usize {
        self.0.iter().map(|part| part.len()).sum()
    }
}

impl redis::ToRedisArgs for Record<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        for part in self.0 {
            // Into the command's own buffer: nothing to fail.
            let _ = std::io::Write::write_all(&mut arg, part);
        }
    }
}
