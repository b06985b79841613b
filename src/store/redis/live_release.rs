//! A reader's or a permit's release whose holder confirmed it live
//! ([`Backend::release_live`](crate::backend::Backend::release_live)), in plain commands
//! instead of `rw/read_release.lua` / `permit/permit_release.lua`: the script call cost the
//! server more than the `ZREM` and `EXISTS` it made (a cycle takes 1.2 to 1.6 µs less of the
//! server's CPU without it: `benches/results/throughput.md`, 2026-12-07).
//!
//! One round trip, pipelined on one connection: `ZREM set secret`, then `EXISTS mark` (the
//! waited mark a waiter's refused attempt leaves, `permit_acquire.lua`, `write_acquire.lua`).
//! The server runs them in order, so no wake-up is lost: a refusal that marked before the
//! `ZREM` is seen by the `EXISTS` after it, and one that came after the `ZREM` found the slot
//! free (or the reader gone) itself. Only when the mark is there and the `ZREM` removed our
//! member (or may have, in a first sending whose reply was lost) does a second trip send the
//! `PUBLISH` the script would have made (`SPUBLISH` on a sharded store), on the same channel
//! with the same empty payload, as the native `Lock` release leaves the publishing to a second
//! call only when a waiter marked its key.
//!
//! A reader whose set still holds other members when the mark is there publishes anyway: the
//! script asked the server's clock whether one of them was still live, which plain commands
//! cannot do without a script. The wake-up is then spurious but harmless: the writer's attempt
//! drops the ended readers, and is refused (and marks again) while a live one holds. Left to
//! the writer too, the ended readers the script deleted with the last live one; the set also
//! expires with its latest member.
//!
//! A release sends no `WAIT`, as the scripts' release does not
//! ([`wait_for_replicas`](RedisStore::wait_for_replicas) counts acquisitions and extensions).
//! In a cluster the set, the mark and the channel share the name's hash tag, so the pipeline
//! goes to the node that owns the slot of its first key. The checked release (a holder that
//! could not confirm its lease live) keeps its script, which asks the server's clock.

use redis::aio::ConnectionLike;

use super::RedisStore;
use super::keys::KeyRole;
use crate::backend::{LeaseRef, Mode};
use crate::{Error, Result};

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Releases a reader or a permit confirmed live, in plain commands (see the module's
    /// docs); `true` when its member was still in the set.
    pub(in crate::store::redis) async fn release_live_member(
        &self,
        lease: LeaseRef<'_>,
    ) -> Result<bool> {
        let (set, mark) = match lease.mode {
            Mode::Read => (KeyRole::Readers, KeyRole::RwLockWaited),
            _ => (KeyRole::Permits, KeyRole::PermitsWaited),
        };
        let (lock, secret) = (lease.lock, lease.secret.as_bytes());
        let (set, mark) = (self.key_arg(set, lock), self.key_arg(mark, lock));
        let mut pipe = redis::Pipeline::with_capacity(2);
        let mut zrem = redis::Cmd::with_capacity(3, set.len() + secret.len() + 8);
        zrem.arg("ZREM").arg(set).arg(secret.as_slice());
        let mut exists = redis::Cmd::with_capacity(2, mark.len() + 8);
        exists.arg("EXISTS").arg(mark);
        pipe.add_command(zrem).add_command(exists);
        let (started, mut conn) = (self.started(), self.conn.clone());
        let mut reply = conn.req_packed_commands(&pipe, 0, 2).await;
        let retried = self.retry(&reply, &mut conn, started)?;
        if retried {
            reply = conn.req_packed_commands(&pipe, 0, 2).await;
        }
        let mut replies = self.reply(reply)?.into_iter().map(counted);
        let (removed, marked) = match (replies.next(), replies.next()) {
            (Some(removed), Some(marked)) => (removed? == 1, marked? == 1),
            _ => {
                return Err(Error::UnexpectedReply(
                    "a release's pipeline answered short".into(),
                ));
            }
        };
        // Sent again after a lost connection, the `ZREM` finds our member gone if the first
        // one reached the server: its publish, then, is this call's to make.
        if marked
            && (removed || retried)
            && let Err(e) = self.publish_released(lease, &mut conn, started).await
        {
            // Released all the same: the waiter wakes at its own next poll instead.
            tracing::warn!(error = %e, "tower-lease: a release's notification was not sent");
        }
        Ok(removed)
    }

    /// The second trip of a marked release: its `PUBLISH`, within what is left of the call's
    /// timeout, sent again once on a lost connection (a second message only wakes the
    /// waiter twice).
    async fn publish_released(
        &self,
        lease: LeaseRef<'_>,
        conn: &mut C,
        started: Option<std::time::Instant>,
    ) -> Result<()> {
        self.second_trip(conn, started)?;
        let publish = self.publish(lease);
        let mut sent = conn.req_packed_command(&publish).await;
        if self.retry(&sent, conn, started)? {
            sent = conn.req_packed_command(&publish).await;
        }
        self.reply(sent.and_then(redis::Value::extract_error))
            .map(drop)
    }
}

/// A count a command of the pipeline answered.
fn counted(reply: redis::Value) -> Result<i64> {
    match reply.extract_error().map_err(Error::Redis)? {
        redis::Value::Int(n) => Ok(n),
        other => Err(Error::UnexpectedReply(format!(
            "a release's command answered {other:?}"
        ))),
    }
}
