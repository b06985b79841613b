//! The idempotency calls of [`RedisStore`], on one key per idempotency key,
//! `P:idem:{ns:scope:key}`: it holds the reservation's secret while the first request runs, and
//! its record once it completed. So the first look is the `SET NX PX` any lock takes, a
//! completion ends the reservation by writing the record over it (`idem_complete.lua`), and
//! the exclusive lock's scripts extend and release the reservation, comparing the secret.

use std::time::Duration;

use bytes::Bytes;
use redis::aio::ConnectionLike;

use super::answered_one;
use super::connection::replicas::{split_wait, then_wait};
use super::keys::{Key, KeyRole};
use super::scripts::ARGS_LEN;
use super::scripts::{IDEM_BEGIN, IDEM_BEGIN_ONCE, IDEM_COMPLETE, IDEM_FREE, Lua};
use super::set_nx::set_nx_acquired;
use super::{RedisStore, notify};
use crate::backend::{Acquisition, LeaseRef, Secret};
use crate::backend::{Begin, Completion, FINGERPRINT_LEN};
use crate::{Error, Result};

/// How many times an unfenced look takes the key again when it vanished between the `SET NX`
/// that found it taken and the `GET` (a reservation released or run out in between).
const LOOKS: usize = 3;

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(super) async fn idem_begin(
        &self,
        lease: LeaseRef<'_>,
        fingerprint: &[u8; FINGERPRINT_LEN],
    ) -> Result<Begin> {
        if lease.lock.fenced {
            return self.idem_begin_fenced(lease, fingerprint).await;
        }
        let LeaseRef { lock, secret, .. } = lease;
        let key = self.key_arg(KeyRole::Idempotency, lock);
        let take = self.set_nx_on(KeyRole::Idempotency, lock, secret);
        let started = self.started();
        let mut conn = self.conn.clone();
        let take_and_wait = self
            .replicas
            .map(|replicas| then_wait(take.clone(), replicas));
        for _ in 0..LOOKS {
            // Sent again after a lost connection: if the first took the key, the look below
            // finds our own secret.
            let (set, waited) = match &take_and_wait {
                None => {
                    let mut reply = conn.req_packed_command(&take).await;
                    if self.retry(&reply, &mut conn, started)? {
                        reply = conn.req_packed_command(&take).await;
                    }
                    (self.reply(reply)?, None)
                }
                Some(pipe) => {
                    let mut reply = conn.req_packed_commands(pipe, 0, 2).await;
                    if self.retry(&reply, &mut conn, started)? {
                        reply = conn.req_packed_commands(pipe, 0, 2).await;
                    }
                    let (mut replies, waited) = split_wait(self.reply(reply)?)?;
                    let set = replies.pop().unwrap_or(redis::Value::Nil);
                    (set.extract_error().map_err(Error::Redis)?, Some(waited))
                }
            };
            if set_nx_acquired(set)? {
                return self.reserved(lease, None, waited).await;
            }
            self.second_trip(&mut conn, started)?;
            // Built only here: most looks end at the `SET`.
            let mut look = redis::Pipeline::with_capacity(2);
            look.cmd("GET").arg(key).cmd("PTTL").arg(key);
            let mut reply = conn.req_packed_commands(&look, 0, 2).await;
            if self.retry(&reply, &mut conn, started)? {
                reply = conn.req_packed_commands(&look, 0, 2).await;
            }
            let Ok([value, pttl]) = <[redis::Value; 2]>::try_from(self.reply(reply)?) else {
                return Err(Error::UnexpectedReply(
                    "a look answered too few values".into(),
                ));
            };
            if let Some(begin) = taken(value, pttl, secret, None, fingerprint)? {
                return Ok(begin);
            }
            self.second_trip(&mut conn, started)?;
        }
        // Taken and freed again at every look: someone is busy with it right now.
        Ok(Begin::InFlight {
            retry_after: Duration::ZERO,
        })
    }

    /// The look at a fenced key, by `idem_begin.lua`: its reservation takes a fence in the
    /// same step.
    async fn idem_begin_fenced(
        &self,
        lease: LeaseRef<'_>,
        fingerprint: &[u8; FINGERPRINT_LEN],
    ) -> Result<Begin> {
        let LeaseRef { lock, secret, .. } = lease;
        let keys = [
            self.key_arg(KeyRole::Idempotency, lock),
            self.key_arg(KeyRole::IdempotencyFence, lock),
        ];
        let ttl = (lock.ttl.as_millis() as u64).to_string();
        let args: [&[u8]; 2] = [secret.as_bytes(), ttl.as_bytes()];
        let (reply, waited) = self.eval(&IDEM_BEGIN, &keys, &args).await?;
        let mut reply: Vec<redis::Value> = redis::from_redis_value(reply).map_err(unexpected)?;
        match reply.len() {
            2 => {
                let fence: i64 =
                    redis::from_redis_value(reply.pop().expect("2")).map_err(unexpected)?;
                self.reserved(lease, Some(fence.max(0) as u64), waited)
                    .await
            }
            3 => {
                let pttl = reply.pop().expect("3");
                let value = reply.pop().expect("2");
                // Taken by someone else: the script answered our own secret itself.
                taken(value, pttl, secret, None, fingerprint)?
                    .ok_or_else(|| Error::UnexpectedReply("idem_begin found nothing".into()))
            }
            n => Err(Error::UnexpectedReply(format!(
                "idem_begin answered {n} values"
            ))),
        }
    }

    /// The look at an at-most-once key, by `idem_begin_once.lua`: a reservation leaves the
    /// key's marker (`…:unknown`, `PX` the retention), and a free key whose marker lives
    /// answers that its outcome is unknown.
    pub(super) async fn idem_begin_once(
        &self,
        lease: LeaseRef<'_>,
        fingerprint: &[u8; FINGERPRINT_LEN],
        retention: Duration,
    ) -> Result<Begin> {
        let LeaseRef { lock, secret, .. } = lease;
        let keys = [
            self.key_arg(KeyRole::Idempotency, lock),
            self.key_arg(KeyRole::IdempotencyFence, lock),
            self.key_arg(KeyRole::IdempotencyUnknown, lock),
        ];
        let ttl = (lock.ttl.as_millis() as u64).to_string();
        let retention = (retention.as_millis().max(1) as u64).to_string();
        let fenced: &[u8] = if lock.fenced { b"1" } else { b"0" };
        let args: [&[u8]; 4] = [
            secret.as_bytes(),
            ttl.as_bytes(),
            retention.as_bytes(),
            fenced,
        ];
        let (reply, waited) = self.eval(&IDEM_BEGIN_ONCE, &keys, &args).await?;
        let mut reply: Vec<redis::Value> = redis::from_redis_value(reply).map_err(unexpected)?;
        let kind = match reply.first() {
            Some(kind) => redis::from_redis_value::<i64>(kind.clone()).map_err(unexpected)?,
            None => {
                return Err(Error::UnexpectedReply(
                    "idem_begin_once answered nothing".into(),
                ));
            }
        };
        match (kind, reply.len()) {
            (1, 2) => {
                let fence: i64 =
                    redis::from_redis_value(reply.pop().expect("2")).map_err(unexpected)?;
                let fence = lock.fenced.then_some(fence.max(0) as u64);
                let Some(replicas) = self.replicas else {
                    return Ok(Begin::Reserved { fence });
                };
                let short = match waited {
                    Some(waited) => replicas.check(waited),
                    None => Err(Error::UnexpectedReply("WAIT did not answer".into())),
                };
                let Err(short) = short else {
                    return Ok(Begin::Reserved { fence });
                };
                // Freed with its marker: a reservation the replicas may lose never ran, and
                // its retries must not be told its outcome is unknown.
                if let Err(e) = self.idem_free(lease).await {
                    tracing::warn!(error = %e, "could not free a reservation that was not replicated");
                }
                Err(short)
            }
            (0, 3) => {
                let pttl = reply.pop().expect("3");
                let value = reply.pop().expect("2");
                taken(value, pttl, secret, None, fingerprint)?
                    .ok_or_else(|| Error::UnexpectedReply("idem_begin_once found nothing".into()))
            }
            (2, 2) => {
                let pttl: i64 =
                    redis::from_redis_value(reply.pop().expect("2")).map_err(unexpected)?;
                Ok(Begin::OutcomeUnknown {
                    expires_in: Duration::from_millis(pttl.max(0) as u64),
                })
            }
            (kind, n) => Err(Error::UnexpectedReply(format!(
                "idem_begin_once answered {kind} with {n} values"
            ))),
        }
    }

    /// Frees the key of `lease` with its marker (`idem_free.lua`).
    pub(super) async fn idem_free(&self, lease: LeaseRef<'_>) -> Result<bool> {
        let LeaseRef {
            lock, mode, secret, ..
        } = lease;
        let keys = [
            self.key_arg(KeyRole::Idempotency, lock),
            self.key_arg(KeyRole::IdempotencyUnknown, lock),
        ];
        let channel = notify::channel(self.layout(), mode, lock.namespace, lock.name);
        let args: [&[u8]; 2] = [secret.as_bytes(), &channel];
        let (reply, _) = self.eval_unwaited(&IDEM_FREE, &keys, &args).await?;
        answered_one(reply)
    }

    pub(super) async fn idem_complete(
        &self,
        lease: LeaseRef<'_>,
        completion: Completion<'_>,
    ) -> Result<bool> {
        if let Some(stored) = self.complete_native(lease, completion).await? {
            return Ok(stored);
        }
        let LeaseRef {
            lock, mode, secret, ..
        } = lease;
        let keys = [self.key_arg(KeyRole::Idempotency, lock)];
        let channel = notify::channel(self.layout(), mode, lock.namespace, lock.name);
        // At least 1 ms: `PX 0` is refused.
        let retention = (completion.retention.as_millis().max(1) as u64).to_string();
        let args: [&[u8]; 5] = [
            secret.as_bytes(),
            completion.fingerprint,
            completion.response,
            retention.as_bytes(),
            &channel,
        ];
        let (reply, waited) = self.eval(&IDEM_COMPLETE, &keys, &args).await?;
        let stored = answered_one(reply)?;
        // A record the replicas did not acknowledge may be lost with the primary, and a retry
        // after a failover would run again: the caller learns it was not stored for sure.
        if let (true, Some(replicas), Some(waited)) = (stored, self.replicas, waited) {
            replicas.check(waited)?;
        }
        Ok(stored)
    }

    /// Runs `script` on `keys` with `args` as every script of the store runs (the scripts are
    /// safe to send twice), with `WAIT` after it when the store waits for replicas.
    async fn eval(
        &self,
        script: &Lua,
        keys: &[Key<'_>],
        args: &[&[u8]],
    ) -> Result<(redis::Value, Option<redis::Value>)> {
        self.eval_with(script, keys, args, self.replicas).await
    }

    /// [`eval`](Self::eval) without `WAIT`: for a call that only gives something back.
    async fn eval_unwaited(
        &self,
        script: &Lua,
        keys: &[Key<'_>],
        args: &[&[u8]],
    ) -> Result<(redis::Value, Option<redis::Value>)> {
        self.eval_with(script, keys, args, None).await
    }

    async fn eval_with(
        &self,
        script: &Lua,
        keys: &[Key<'_>],
        args: &[&[u8]],
        replicas: Option<super::connection::replicas::Replicas>,
    ) -> Result<(redis::Value, Option<redis::Value>)> {
        let command = |verb: &str, body: &str| {
            let len = verb.len()
                + body.len()
                + keys.iter().map(Key::len).sum::<usize>()
                + args.iter().map(|arg| arg.len()).sum::<usize>();
            let mut command =
                redis::Cmd::with_capacity(4 + keys.len() + args.len(), len + ARGS_LEN);
            command.arg(verb).arg(body).arg(keys.len());
            keys.iter().for_each(|key| {
                command.arg(key);
            });
            args.iter().for_each(|arg| {
                command.arg(*arg);
            });
            command
        };
        self.send_script(script, command, replicas).await
    }

    /// A reservation taken, which counts only once the replicas acknowledged it (`waited`,
    /// when the store waits for them): else it is released again, as any acquisition's.
    async fn reserved(
        &self,
        lease: LeaseRef<'_>,
        fence: Option<u64>,
        waited: Option<redis::Value>,
    ) -> Result<Begin> {
        if let Some(replicas) = self.replicas {
            let taken = Acquisition::Acquired { fence };
            self.unless_replicated(lease, taken, waited, replicas)
                .await?;
        }
        Ok(Begin::Reserved { fence })
    }
}

/// The head of a stored record, before its response: the request fingerprint, then the secret
/// of the reservation that completed it (`idem_complete.lua`).
const RECORD_HEAD: usize = FINGERPRINT_LEN + 16;

fn unexpected(e: impl std::fmt::Display) -> Error {
    Error::UnexpectedReply(e.to_string())
}

/// What a key found taken holds (`value`, with its `pttl`), for a request of `fingerprint`
/// holding `secret`: our own reservation (taken by a call whose reply was lost; `fence` is
/// its fence, when fenced), someone else's, or a record. `None` when the key is gone.
fn taken(
    value: redis::Value,
    pttl: redis::Value,
    secret: &Secret,
    fence: Option<u64>,
    fingerprint: &[u8; FINGERPRINT_LEN],
) -> Result<Option<Begin>> {
    let value: Vec<u8> = match value {
        redis::Value::Nil => return Ok(None),
        value => redis::from_redis_value(value).map_err(unexpected)?,
    };
    // -1 for a key someone set without expiry: "retry soon" rather than never; a record
    // without expiry is kept from the cache.
    let left = Duration::from_millis(
        redis::from_redis_value::<i64>(pttl)
            .map_err(unexpected)?
            .max(0) as u64,
    );
    if value.len() < RECORD_HEAD {
        // A reservation: only the secret.
        if value == secret.as_bytes() {
            return Ok(Some(Begin::Reserved { fence }));
        }
        return Ok(Some(Begin::InFlight { retry_after: left }));
    }
    if value[..FINGERPRINT_LEN] != fingerprint[..] {
        return Ok(Some(Begin::Mismatch));
    }
    Ok(Some(Begin::Completed {
        response: Bytes::from(value).slice(RECORD_HEAD..),
        expires_in: left,
    }))
}
