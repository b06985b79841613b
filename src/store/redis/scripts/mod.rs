//! The Lua scripts a [`RedisStore`] runs, and how: one `.lua` file each, by lock kind (`lock/`,
//! `rw/`, `permit/`, `idempotency/`), compiled in as [`Lua`]; the script a held lease's extend
//! or release runs ([`holder_script`]); and how a script is sent ([`RedisStore::run`]: `EVALSHA`,
//! `EVAL` after a `NOSCRIPT`, once more on a lost connection, `WAIT` in the same pipeline).
//! `backend.rs` picks the call for each [`Backend`](crate::backend::Backend) method.

use std::sync::OnceLock;

use redis::Script;
use redis::aio::ConnectionLike;

use crate::Result;
use crate::backend::{LockRef, Mode, Secret};
use crate::store::redis::RedisStore;
use crate::store::redis::connection::replicas::{Replicas, split_wait, then_wait};
use crate::store::redis::keys::{Key, KeyRole};

pub(in crate::store::redis) static ACQUIRE: Lua = Lua::new(include_str!("lock/acquire.lua"));
pub(in crate::store::redis) static EXTEND: Lua = Lua::new(include_str!("lock/extend.lua"));
pub(in crate::store::redis) static RELEASE: Lua = Lua::new(include_str!("lock/release.lua"));
pub(in crate::store::redis) static READ_ACQUIRE: Lua =
    Lua::new(include_str!("rw/read_acquire.lua"));
pub(in crate::store::redis) static READ_EXTEND: Lua = Lua::new(include_str!("rw/read_extend.lua"));
pub(in crate::store::redis) static READ_RELEASE: Lua =
    Lua::new(include_str!("rw/read_release.lua"));
pub(in crate::store::redis) static WRITE_ACQUIRE: Lua =
    Lua::new(include_str!("rw/write_acquire.lua"));
pub(in crate::store::redis) static WRITE_RELEASE: Lua =
    Lua::new(include_str!("rw/write_release.lua"));
pub(in crate::store::redis) static WITHDRAW_INTENT: Lua =
    Lua::new(include_str!("rw/withdraw_intent.lua"));
pub(in crate::store::redis) static PERMIT_ACQUIRE: Lua =
    Lua::new(include_str!("permit/permit_acquire.lua"));
pub(in crate::store::redis) static PERMIT_RELEASE: Lua =
    Lua::new(include_str!("permit/permit_release.lua"));
pub(in crate::store::redis) static IDEM_BEGIN: Lua =
    Lua::new(include_str!("idempotency/idem_begin.lua"));
pub(in crate::store::redis) static IDEM_COMPLETE: Lua =
    Lua::new(include_str!("idempotency/idem_complete.lua"));
pub(in crate::store::redis) static IDEM_BEGIN_ONCE: Lua =
    Lua::new(include_str!("idempotency/idem_begin_once.lua"));
pub(in crate::store::redis) static IDEM_FREE: Lua =
    Lua::new(include_str!("idempotency/idem_free.lua"));
pub(in crate::store::redis) static PERMITS_IN_USE: Lua =
    Lua::new(include_str!("permit/permits_in_use.lua"));

/// A script run with `EVALSHA`, and with `EVAL` when the server answers `NOSCRIPT`.
///
/// Each script comes in two variants from its one file: as written, publishing with `PUBLISH`
/// (a single Redis, or a cluster before 7.0), and sharded, the same with `SPUBLISH` (a cluster
/// whose notifier listens with `SSUBSCRIBE`: the message stays on the shard that owns the name
/// instead of crossing the cluster bus to every node). A channel shares its name's hash tag, so
/// `SPUBLISH` in a script stays in the slot of the script's keys, as Redis requires.
///
/// `redis::Script`'s fallback (`SCRIPT LOAD`, then `EVALSHA` again) fails when another
/// `SCRIPT FLUSH` lands between the two, and in a cluster `SCRIPT LOAD` goes to every node, so
/// one node down would fail calls for the slots of the others. `EVAL` runs the script in one
/// command on the slot's node and caches it there for the next `EVALSHA`.
pub(in crate::store::redis) struct Lua {
    pub(in crate::store::redis) code: &'static str,
    sha: OnceLock<String>,
    /// The sharded variant's code and hash, made on first use.
    sharded: OnceLock<(String, String)>,
}

impl Lua {
    const fn new(code: &'static str) -> Self {
        Self {
            code,
            sha: OnceLock::new(),
            sharded: OnceLock::new(),
        }
    }

    pub(in crate::store::redis) fn sha(&self) -> &str {
        let hash = || Script::new(self.code).get_hash().to_owned();
        self.sha.get_or_init(hash)
    }

    /// The variant's hash and code: sharded (`SPUBLISH`) or as written (`PUBLISH`).
    pub(in crate::store::redis) fn variant(&self, sharded: bool) -> (&str, &str) {
        if !sharded {
            return (self.sha(), self.code);
        }
        let (sha, code) = self.sharded.get_or_init(|| {
            let code = self
                .code
                .replace("redis.call('PUBLISH'", "redis.call('SPUBLISH'");
            (Script::new(&code).get_hash().to_owned(), code)
        });
        (sha, code)
    }
}

/// What a holder asks of its lease.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(in crate::store::redis) enum Holder {
    Extend,
    Release,
}

/// The script for `action` on a lease held in `mode`, and the key it acts on.
pub(in crate::store::redis) fn holder_script(
    mode: Mode,
    action: Holder,
) -> (&'static Lua, KeyRole) {
    match (mode, action) {
        (Mode::Exclusive, Holder::Extend) => (&EXTEND, KeyRole::Lock),
        (Mode::Write, Holder::Extend) => (&EXTEND, KeyRole::Writer),
        (Mode::Read, Holder::Extend) => (&READ_EXTEND, KeyRole::Readers),
        (Mode::Exclusive, Holder::Release) => (&RELEASE, KeyRole::Lock),
        (Mode::Write, Holder::Release) => (&RELEASE, KeyRole::Writer),
        (Mode::Read, Holder::Release) => (&READ_RELEASE, KeyRole::Readers),
        // A permit is extended exactly as a reader is: one member of a set scored by lease end.
        (Mode::Permit, Holder::Extend) => (&READ_EXTEND, KeyRole::Permits),
        (Mode::Permit, Holder::Release) => (&PERMIT_RELEASE, KeyRole::Permits),
        // A reservation's key holds its secret alone, as an exclusive lock's does.
        (Mode::Reservation, Holder::Extend) => (&EXTEND, KeyRole::Idempotency),
        (Mode::Reservation, Holder::Release) => (&RELEASE, KeyRole::Idempotency),
    }
}

/// The error Redis answers an `EVALSHA` whose script it does not have (after `SCRIPT FLUSH`, a
/// restart, or on a new cluster node): the call is sent again as `EVAL`.
pub(in crate::store::redis) const NO_SCRIPT: redis::ServerErrorKind =
    redis::ServerErrorKind::NoScript;

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
    /// The TTL, then one number more: `1` for an exclusive acquisition of a bounded wait (its
    /// refusal marks the lock), else `0`.
    TtlAnd(u64),
    /// The TTL, then two numbers more: a read acquisition's read phase in ms (0 for none) and
    /// how long a waiter's mark lasts in ms for an attempt of a bounded wait (else `0`); a
    /// permit's most permits live at once and the same mark's length.
    TtlAndTwo(u64, u64),
    /// The TTL, then three numbers more: a write acquisition's intent in ms, its phase-fair
    /// flag (as for [`TtlAndTwo`](Self::TtlAndTwo)), and how long a waiter's mark lasts in ms
    /// (`0` when the attempt is not one of a bounded wait).
    TtlAndThree(u64, u64, u64),
    Channel(&'a [u8]),
    /// The channel, then one number: a phase-fair write release's read phase in ms, or `1` for
    /// a reservation's release, which publishes unmarked.
    ChannelAnd(&'a [u8], u64),
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
                LastArg::TtlAndTwo(first, second) => {
                    let ttl = lock.ttl.as_millis() as u64;
                    command.arg(ttl).arg(first).arg(second);
                }
                LastArg::TtlAndThree(first, second, third) => {
                    let ttl = lock.ttl.as_millis() as u64;
                    command.arg(ttl).arg(first).arg(second).arg(third);
                }
                LastArg::Channel(channel) => {
                    command.arg(channel);
                }
                LastArg::ChannelAnd(channel, number) => {
                    command.arg(channel).arg(number);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sharded_variant_of_every_publishing_script_publishes_with_spublish_only() {
        let publishing = [
            &RELEASE,
            &READ_RELEASE,
            &WRITE_ACQUIRE,
            &WITHDRAW_INTENT,
            &PERMIT_RELEASE,
            &IDEM_COMPLETE,
            &IDEM_FREE,
        ];
        for script in publishing {
            let (sha, code) = script.variant(true);
            assert!(code.contains("redis.call('SPUBLISH'"), "{code}");
            assert!(!code.contains("redis.call('PUBLISH'"), "{code}");
            assert_ne!(sha, script.sha());
            assert_eq!(script.variant(false), (script.sha(), script.code));
        }
        // A script that publishes nothing is one script either way.
        assert_eq!(ACQUIRE.variant(true).0, ACQUIRE.sha());
    }
}
