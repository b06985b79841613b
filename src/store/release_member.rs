//! The release of a reader lease or a permit on [`RedisStore`]: plain commands in one pipeline,
//! not a script.
//!
//! A Lua script costs the server a fixed price per call and about as much again per command it
//! runs, several times what the same commands cost sent plainly (the `throughput` benchmark and
//! `INFO commandstats` measure both). A member's release needs no atomicity of its own: only the
//! holder removes its member (others drop it only once it ended), so the pipeline reads the
//! server's clock and the member's lease end, removes it, and reads what is left, and the answer
//! is worked out here. What the release must still do atomically with the removal, nothing else
//! does: a reader or a permit acquired meanwhile only makes the answer's "last one out" stale,
//! and a stale one costs a waiter a wake-up, never a missed one.

use redis::aio::ConnectionLike;

use super::keys::KeyRole;
use super::{LeaseRef, Mode, RedisStore, notify};
use crate::{Error, Result};

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Releases a reader lease ([`Mode::Read`]) or a permit ([`Mode::Permit`]): `true` when it
    /// was live, `false` when it was gone or had ended.
    ///
    /// One pipeline: `ZSCORE`, `TIME`, `ZREM`, then for a permit the `PUBLISH` that wakes a
    /// waiter elsewhere (every release frees a slot), for a reader `ZRANGE -1 -1` (the longest
    /// reader left). Only the last live reader's release wakes waiting writers, with a `PUBLISH`
    /// of its own after the answer, in the same deadline.
    pub(super) async fn release_member(&self, lease: LeaseRef<'_>) -> Result<bool> {
        let LeaseRef { lock, mode, secret } = lease;
        let role = match mode {
            Mode::Read => KeyRole::Readers,
            _ => KeyRole::Permits,
        };
        let key = self.key_arg(role, lock);
        let member = secret.as_bytes().as_slice();
        let channel = notify::channel(self.layout(), mode, lock.namespace, lock.name);
        let mut pipe = redis::Pipeline::with_capacity(4);
        // A key first: a cluster pipeline goes to the node of its first key's slot.
        pipe.cmd("ZSCORE").arg(&key).arg(member);
        pipe.cmd("TIME");
        pipe.cmd("ZREM").arg(&key).arg(member);
        match mode {
            Mode::Read => pipe.cmd("ZRANGE").arg(&key).arg(-1).arg(-1).arg("WITHSCORES"),
            _ => pipe.cmd("PUBLISH").arg(&channel).arg(""),
        };
        let started = self.started();
        let mut conn = self.conn.clone();
        let mut reply = conn.req_packed_commands(&pipe, 0, 4).await;
        if self.retry(&reply, &mut conn, started)? {
            // The first may have gone through: its member is gone then, and this answers false.
            reply = conn.req_packed_commands(&pipe, 0, 4).await;
        }
        let replies = self.reply(reply)?;
        let Answer { released, last } = answer(replies)?;
        if released && last && mode == Mode::Read {
            self.second_trip(&mut conn, started)?;
            let mut publish = redis::cmd("PUBLISH");
            publish.arg(&channel).arg("");
            self.reply(conn.req_packed_command(&publish).await)?;
        }
        Ok(released)
    }
}

/// What a member's release came to.
struct Answer {
    /// The member was live and is gone now.
    released: bool,
    /// No live member is left (readers only; always false for a permit's replies).
    last: bool,
}

fn answer(replies: Vec<redis::Value>) -> Result<Answer> {
    let unexpected = |what: &str| Error::UnexpectedReply(format!("member release: {what}"));
    let [score, time, removed, rest]: [redis::Value; 4] = replies
        .try_into()
        .map_err(|replies: Vec<_>| unexpected(&format!("{} replies", replies.len())))?;
    let score: Option<f64> = redis::from_redis_value(score).map_err(|e| unexpected(&e.to_string()))?;
    let (secs, micros): (u64, u64) = redis::from_redis_value(time).map_err(|e| unexpected(&e.to_string()))?;
    let removed: i64 = redis::from_redis_value(removed).map_err(|e| unexpected(&e.to_string()))?;
    // Server ms, as the scripts reckon lease ends: a lease is live until its end, inclusive.
    let now = (secs * 1000 + micros / 1000) as f64;
    let released = removed == 1 && score.is_some_and(|end| end >= now);
    let last = match rest {
        redis::Value::Array(_) => {
            let longest: Vec<(Vec<u8>, f64)> = redis::from_redis_value(rest).map_err(|e| unexpected(&e.to_string()))?;
            longest.first().is_none_or(|(_, end)| *end < now)
        }
        _ => false,
    };
    Ok(Answer { released, last })
}
