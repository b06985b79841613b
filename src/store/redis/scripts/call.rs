//! How [`RedisStore`] runs a script: `EVALSHA` with its keys and arguments (`EVAL` after a
//! `NOSCRIPT`), retried once on a lost connection, with `WAIT` in the same pipeline when the
//! store waits for replicas.

use redis::aio::ConnectionLike;

use crate::Result;
use crate::backend::{LockRef, Secret};
use crate::store::redis::RedisStore;
use crate::store::redis::connection::replicas::{Replicas, split_wait, then_wait};
use crate::store::redis::keys::{Key, KeyRole};
use crate::store::redis::scripts::{Lua, NO_SCRIPT};

/// Room for the short arguments of a command besides its keys and script: verb, secret, TTL,
/// key count, `NX PX`.
pub(in crate::store::redis) const ARGS_LEN: usize = 64;

/// What [`RedisStore::run`] runs: a script, its keys and its arguments.
#[derive(Clone, Copy)]
pub(in crate::store::redis) struct Call<'a> {
    pub(in crate::store::redis) script: &'a Lua,
    pub(in crate::store::redis) lock: LockRef<'a>,
    pub(in crate::store::redis) roles: &'a [KeyRole],
    pub(in crate::store::redis) fence: Option<KeyRole>,
    pub(in crate::store::redis) secret: Option<&'a Secret>,
    pub(in crate::store::redis) last: LastArg<'a>,
}

/// The arguments of a script after the secret: the TTL to take or extend for, or the channel a
/// release publishes on.
#[derive(Clone, Copy)]
pub(in crate::store::redis) enum LastArg<'a> {
    Ttl,
    /// The TTL, then one number more: how long a write intent lasts (0 for none) for a write
    /// acquisition, the most permits live at once for a permit's.
    TtlAnd(u64),
    Channel(&'a [u8]),
    /// `1`: a reader's or a permit's release whose holder confirmed it live until after now.
    Live,
    /// Nothing after the secret.
    None,
}

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Runs `script` with the keys of `roles` (the fence key last, and only when fenced), then
    /// the secret and `last` as arguments when there is a secret.
    pub(in crate::store::redis) async fn run(
        &self,
        script: &Lua,
        lock: LockRef<'_>,
        roles: &[KeyRole],
        fence: Option<KeyRole>,
        secret: Option<&Secret>,
        last: LastArg<'_>,
    ) -> Result<redis::Value> {
        let call = Call {
            script,
            lock,
            roles,
            fence,
            secret,
            last,
        };
        Ok(self.run_waiting(call, None).await?.0)
    }

    /// [`run`](Self::run), followed by `WAIT` in the same pipeline when `wait` is given;
    /// answers the script's reply and `WAIT`'s.
    pub(in crate::store::redis) async fn run_waiting(
        &self,
        call: Call<'_>,
        wait: Option<Replicas>,
    ) -> Result<(redis::Value, Option<redis::Value>)> {
        let Call {
            script,
            lock,
            roles,
            fence,
            secret,
            last,
        } = call;
        let fence = fence.filter(|_| lock.fenced);
        let keys = || roles.iter().chain(fence.as_ref());
        let keys = || keys().map(|&role| self.key_arg(role, lock));
        let command = |verb: &str, script: &str| {
            // Sized once: growing the buffers argument by argument costs more than filling them.
            let len = verb.len() + script.len() + keys().map(|key| key.len()).sum::<usize>();
            let mut command = redis::Cmd::with_capacity(8, len + ARGS_LEN);
            command.arg(verb).arg(script).arg(keys().count());
            keys().for_each(|key| {
                command.arg(key);
            });
            let Some(secret) = secret else {
                return command;
            };
            command.arg(secret.as_bytes().as_slice());
            match last {
                LastArg::Ttl => {
                    command.arg(lock.ttl.as_millis() as u64);
                }
                LastArg::TtlAnd(number) => {
                    command.arg(lock.ttl.as_millis() as u64).arg(number);
                }
                LastArg::Channel(channel) => {
                    command.arg(channel);
                }
                LastArg::Live => {
                    command.arg(1);
                }
                LastArg::None => {}
            }
            command
        };
        self.send_script(script, command, wait).await
    }

    /// Sends the call of `script` that `command(verb, body)` builds: `EVALSHA`, then `EVAL`
    /// after a `NOSCRIPT`, once more after a lost connection, and with `WAIT` in the same
    /// pipeline when `wait` is given; answers the script's reply and `WAIT`'s.
    pub(in crate::store::redis) async fn send_script(
        &self,
        script: &Lua,
        command: impl Fn(&str, &str) -> redis::Cmd,
        wait: Option<Replicas>,
    ) -> Result<(redis::Value, Option<redis::Value>)> {
        let started = self.started();
        let mut conn = self.conn.clone();
        let Some(wait) = wait else {
            let evalsha = command("EVALSHA", script.variant(self.sharded).0);
            let mut reply = conn.req_packed_command(&evalsha).await;
            if self.retry(&reply, &mut conn, started)? {
                reply = conn.req_packed_command(&evalsha).await;
            }
            return match reply.and_then(redis::Value::extract_error) {
                Err(e) if e.kind() == redis::ErrorKind::Server(NO_SCRIPT) => {
                    self.second_trip(&mut conn, started)?;
                    let eval = command("EVAL", script.variant(self.sharded).1);
                    Ok((self.reply(conn.req_packed_command(&eval).await)?, None))
                }
                reply => Ok((self.reply(reply)?, None)),
            };
        };
        let evalsha = then_wait(command("EVALSHA", script.variant(self.sharded).0), wait);
        let mut reply = conn.req_packed_commands(&evalsha, 0, 2).await;
        if self.retry(&reply, &mut conn, started)? {
            reply = conn.req_packed_commands(&evalsha, 0, 2).await;
        }
        let (mut replies, mut waited) = split_wait(self.reply(reply)?)?;
        let mut reply = replies.pop().unwrap_or(redis::Value::Nil).extract_error();
        if matches!(&reply, Err(e) if e.kind() == redis::ErrorKind::Server(NO_SCRIPT)) {
            self.second_trip(&mut conn, started)?;
            let eval = then_wait(command("EVAL", script.variant(self.sharded).1), wait);
            (replies, waited) =
                split_wait(self.reply(conn.req_packed_commands(&eval, 0, 2).await)?)?;
            reply = replies.pop().unwrap_or(redis::Value::Nil).extract_error();
        }
        Ok((self.reply(reply)?, Some(waited)))
    }

    pub(in crate::store::redis) fn key_arg<'a>(
        &'a self,
        role: KeyRole,
        lock: LockRef<'a>,
    ) -> Key<'a> {
        Key(self.layout().parts(role, lock.namespace, lock.name))
    }
}
