//! The idempotency calls of [`RedisStore`]: `idem_begin.lua` and `idem_complete.lua` on the
//! keys of one `P:idem:{ns:scope:key}` tag. The reservation itself is extended and released
//! by the exclusive lock's scripts, since its key holds the secret alone.

use std::time::Duration;

use bytes::Bytes;
use redis::aio::ConnectionLike;

use super::idempotency::{Begin, Completion, FINGERPRINT_LEN};
use super::keys::{Key, KeyRole};
use super::redis::answered_one;
use super::script_call::ARGS_LEN;
use super::scripts::{IDEM_BEGIN, IDEM_COMPLETE, Lua, NO_SCRIPT};
use super::{LeaseRef, RedisStore, notify};
use crate::{Error, Result};

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    pub(super) async fn idem_begin(
        &self,
        lease: LeaseRef<'_>,
        fingerprint: &[u8; FINGERPRINT_LEN],
    ) -> Result<Begin> {
        let LeaseRef { lock, secret, .. } = lease;
        let mut keys = vec![
            self.key_arg(KeyRole::IdempotencyRecord, lock),
            self.key_arg(KeyRole::IdempotencyReservation, lock),
        ];
        if lock.fenced {
            keys.push(self.key_arg(KeyRole::IdempotencyFence, lock));
        }
        let ttl = (lock.ttl.as_millis() as u64).to_string();
        let args: [&[u8]; 3] = [secret.as_bytes(), ttl.as_bytes(), fingerprint];
        let reply = self.eval(&IDEM_BEGIN, &keys, &args).await?;
        fn unexpected(e: impl std::fmt::Display) -> Error {
            Error::UnexpectedReply(e.to_string())
        }
        let mut reply: Vec<redis::Value> = redis::from_redis_value(reply).map_err(unexpected)?;
        let pttl = match reply.len() {
            3 => redis::from_redis_value::<i64>(reply.pop().expect("3 values")).ok(),
            2 => None,
            n => {
                return Err(Error::UnexpectedReply(format!(
                    "idem_begin answered {n} values"
                )));
            }
        };
        let value = reply.pop().expect("2 values");
        let kind: i64 =
            redis::from_redis_value(reply.pop().expect("1 value")).map_err(unexpected)?;
        let number = || redis::from_redis_value::<i64>(value.clone()).map_err(unexpected);
        Ok(match kind {
            1 => Begin::Reserved {
                fence: lock.fenced.then_some(number()?.max(0) as u64),
            },
            0 => Begin::InFlight {
                retry_after: Duration::from_millis(number()?.max(0) as u64),
            },
            2 => {
                let response: Vec<u8> = redis::from_redis_value(value).map_err(unexpected)?;
                // A record without expiry (set by hand) is kept from the cache.
                let left = pttl.unwrap_or(0).max(0) as u64;
                Begin::Completed {
                    response: Bytes::from(response),
                    expires_in: Duration::from_millis(left),
                }
            }
            3 => Begin::Mismatch,
            n => return Err(Error::UnexpectedReply(format!("idem_begin answered {n}"))),
        })
    }

    pub(super) async fn idem_complete(
        &self,
        lease: LeaseRef<'_>,
        completion: Completion<'_>,
    ) -> Result<bool> {
        let LeaseRef { lock, mode, secret } = lease;
        let keys = [
            self.key_arg(KeyRole::IdempotencyRecord, lock),
            self.key_arg(KeyRole::IdempotencyReservation, lock),
        ];
        let channel = notify::channel(self.layout(), mode, lock.namespace, lock.name);
        // At least 1 ms: `PEXPIRE 0` would delete the record at once.
        let retention = (completion.retention.as_millis().max(1) as u64).to_string();
        let args: [&[u8]; 5] = [
            secret.as_bytes(),
            completion.fingerprint,
            completion.response,
            retention.as_bytes(),
            &channel,
        ];
        answered_one(self.eval(&IDEM_COMPLETE, &keys, &args).await?)
    }

    /// Runs `script` on `keys` with `args` by `EVALSHA`, and by `EVAL` once when the server
    /// lacks it, as every script of the store runs; a call whose connection was lost is sent
    /// once more (both scripts are safe to send twice).
    async fn eval(&self, script: &Lua, keys: &[Key<'_>], args: &[&[u8]]) -> Result<redis::Value> {
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
        let started = self.started();
        let mut conn = self.conn.clone();
        let evalsha = command("EVALSHA", script.variant(self.sharded).0);
        let mut reply = conn.req_packed_command(&evalsha).await;
        if self.retry(&reply, &mut conn, started)? {
            reply = conn.req_packed_command(&evalsha).await;
        }
        match reply.and_then(redis::Value::extract_error) {
            Err(e) if e.kind() == redis::ErrorKind::Server(NO_SCRIPT) => {
                self.second_trip(&mut conn, started)?;
                let eval = command("EVAL", script.variant(self.sharded).1);
                self.reply(conn.req_packed_command(&eval).await)
            }
            reply => self.reply(reply),
        }
    }
}
