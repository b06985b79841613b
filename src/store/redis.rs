//! [`RedisStore`]: leases in Redis, through the scripts of [`scripts`](super::scripts).
//!
//! How a call keeps its deadline, the call timer, the `SET NX` acquire, the extend pipeline and
//! the tests live in files beside it.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;

use super::contended::ContendedNames;
use super::deadline::{Bound, multiplexed};
use super::extend_many::{extend_keys, extended};
use super::keys::{Key, KeyLayout, KeyRole};
use super::notify;
use super::scripts::{
    ACQUIRE, Holder, Lua, NO_SCRIPT, PERMIT_ACQUIRE, PERMITS_IN_USE, READ_ACQUIRE, WITHDRAW_INTENT,
    WRITE_ACQUIRE, holder_script,
};
use super::watchdog;
use super::{Acquisition, Backend, BoxFuture, Extended, LeaseRef, LockRef, Mode, Secret};
use crate::{Error, Result};

pub(super) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// Room for the short arguments of a command besides its keys and script: verb, secret, TTL,
/// key count, `NX PX`.
pub(super) const ARGS_LEN: usize = 64;

/// A [`Backend`] on Redis, over any redis-rs async connection, with its options.
///
/// Keys, for prefix `P`, namespace `ns` and name `name` (raw bytes):
///
/// | lock | key | holds |
/// |---|---|---|
/// | [`Lock`](crate::Lock) | `P:lock:{ns:name}` | string: the holder's secret, `PX ttl` |
/// | [`RwLock`](crate::RwLock) writer | `P:rwlock:{ns:name}:w` | string: the writer's secret, `PX ttl` |
/// | [`RwLock`](crate::RwLock) readers | `P:rwlock:{ns:name}:r` | sorted set: reader secrets scored by lease end (server ms) |
/// | [`RwLock`](crate::RwLock) write intent | `P:rwlock:{ns:name}:wi` | string: a refused writer attempt's secret, `PX` 500 ms (at most the TTL) |
/// | [`Semaphore`](crate::Semaphore) | `P:sem:{ns:name}` | sorted set: permit secrets scored by lease end (server ms) |
/// | fenced | `P:lock:{ns:name}:fence`, `P:rwlock:{ns:name}:fence` | the last fence issued, `PX` an hour from the lock's last acquisition (or one TTL, if longer) |
///
/// A fence is `max(last + 1, server µs)`, so the counter only matters the few µs it may be ahead
/// of the server clock: its expiry never lowers a fence, and a name nobody uses leaves no key.
/// A read acquisition renews the counter's hour (it is the write generation readers see), but
/// never creates it.
///
/// A call that finds its connection dropped or refused (a restart, a reset; not a timeout) is
/// sent once more at once, within the same deadline, on the connection the connection manager
/// or cluster client makes anew. Every command is safe to send twice: the acquire scripts
/// answer "acquired" (with the fence we were given) when they find our own secret in place, an
/// unfenced acquire's retry reads the key back with `GET` in the `SET NX`'s pipeline, and
/// extend and release compare the secret before they act (a release retried after it went
/// through answers `false`).
///
/// All keys of one name share the `{…}` hash tag, so they live in one cluster slot and every
/// script touches one slot only. The layout is injective: no two (namespace, name) pairs share a
/// key, whatever bytes the name holds, because the suffixes after the last `}` never contain one.
#[derive(Clone, Debug)]
pub struct RedisStore<C> {
    pub(super) conn: C,
    layout: KeyLayout,
    pub(super) timeout: Duration,
    pub(super) bound: Bound,
    pub(super) watchdog: Arc<watchdog::Watchdog>,
    /// The subscriber for release notifications, when the store was given a client for it.
    notifier: Option<Arc<notify::Notifier>>,
    /// Names lately refused, whose next `SET NX` carries its `PTTL` along.
    pub(super) contended: Arc<ContendedNames>,
}

/// The arguments of a script after the secret: the TTL to take or extend for, or the channel a
/// release publishes on.
#[derive(Clone, Copy)]
enum LastArg<'a> {
    Ttl,
    /// The TTL, then one number more: how long a write intent lasts (0 for none) for a write
    /// acquisition, the most permits live at once for a permit's.
    TtlAnd(u64),
    Channel(&'a [u8]),
    /// Nothing after the secret.
    None,
}

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A store on `conn` with the default prefix (`tower-lease`) and deadline (1 s).
    ///
    /// On a `MultiplexedConnection` the default deadline is kept by the connection itself: the
    /// store sets the response timeout of its own clone of `conn` (not yours) to 1 s, and maps
    /// its expiry to [`Error::Timeout`].
    pub fn new(mut conn: C) -> Self {
        let bound = match multiplexed(&mut conn) {
            Some(conn) => {
                conn.set_response_timeout(DEFAULT_TIMEOUT);
                Bound::Connection
            }
            None => Bound::Own,
        };
        Self {
            conn,
            layout: KeyLayout::default(),
            timeout: DEFAULT_TIMEOUT,
            bound,
            watchdog: watchdog::Watchdog::new(DEFAULT_TIMEOUT),
            notifier: None,
            contended: Arc::new(ContendedNames::new()),
        }
    }

    /// Wakes this process's bounded waiters as soon as a lock they wait for is released in
    /// another process, through one subscriber connection made from `client` (started on first
    /// use, and restarted by itself after Redis restarts). Without it, waiters find releases
    /// elsewhere by polling. [`RedisStore::connect`] and [`RedisStore::from_client`] set it.
    ///
    /// Every release publishes on its lock's channel (the lock's key without its role suffix),
    /// whether or not anyone subscribes.
    pub fn notifications(mut self, client: redis::Client) -> Self {
        self.notifier = Some(notify::Notifier::new(client));
        self
    }

    /// Puts every key under `prefix` instead of `tower-lease`.
    ///
    /// # Panics
    ///
    /// If `prefix` is empty or holds `{` or `}` (they would move the cluster hash tag).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.layout = KeyLayout::new(prefix);
        self
    }

    /// Sets the deadline of every call (default 1 s). A call that takes longer fails with
    /// [`Error::Timeout`], so an unreachable Redis turns into a prompt error, never a hang. The
    /// store keeps this deadline with one coarse timer shared by its calls, so a call fails
    /// after the deadline and within a sixteenth of it more (at most 50 ms more).
    ///
    /// redis-rs connections also have a response timeout of their own (500 ms by default in
    /// redis-rs 1.x, set on the client's connection config). On a `MultiplexedConnection` the
    /// store sets its own clone's to `timeout`; on other connections, whichever is shorter fires
    /// first, and redis-rs's arrives as [`Error::Redis`]. Either way the layer answers `503`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        // The store's own timer keeps this deadline, over however many round trips a call makes
        // and whatever else the connection waits for.
        self.bound = Bound::Own;
        self.watchdog = watchdog::Watchdog::new(timeout);
        if let Some(conn) = multiplexed(&mut self.conn) {
            conn.set_response_timeout(timeout);
        }
        self
    }

    /// The key that holds `role` for `name` in `namespace`; see [`KeyLayout::key`].
    pub fn key(&self, role: KeyRole, namespace: &str, name: &[u8]) -> Vec<u8> {
        self.layout.key(role, namespace, name)
    }

    /// The key layout of this store.
    pub fn layout(&self) -> &KeyLayout {
        &self.layout
    }
}

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Runs `script` with the keys of `roles` (the fence key last, and only when fenced), then
    /// the secret and `last` as arguments when there is a secret.
    async fn run(
        &self,
        script: &Lua,
        lock: LockRef<'_>,
        roles: &[KeyRole],
        fence: Option<KeyRole>,
        secret: Option<&Secret>,
        last: LastArg<'_>,
    ) -> Result<redis::Value> {
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
                LastArg::None => {}
            }
            command
        };
        let started = self.started();
        let mut conn = self.conn.clone();
        let evalsha = command("EVALSHA", script.sha());
        let mut reply = conn.req_packed_command(&evalsha).await;
        if self.retry(&reply, &mut conn, started)? {
            reply = conn.req_packed_command(&evalsha).await;
        }
        match reply.and_then(redis::Value::extract_error) {
            Err(e) if e.kind() == redis::ErrorKind::Server(NO_SCRIPT) => {
                self.second_trip(&mut conn, started)?;
                let eval = command("EVAL", script.code);
                self.reply(conn.req_packed_command(&eval).await)
            }
            reply => self.reply(reply),
        }
    }

    pub(super) fn key_arg<'a>(&'a self, role: KeyRole, lock: LockRef<'a>) -> Key<'a> {
        Key(self.layout.parts(role, lock.namespace, lock.name))
    }
}

fn acquisition(reply: redis::Value, fenced: bool) -> Result<Acquisition> {
    let (acquired, value): (i64, i64) =
        redis::from_redis_value(reply).map_err(|e| Error::UnexpectedReply(e.to_string()))?;
    Ok(match acquired {
        1 => Acquisition::Acquired {
            fence: fenced.then_some(value.max(0) as u64),
        },
        // PTTL is -1 for a key someone set without expiry: report "retry soon" rather than never.
        _ => Acquisition::Busy {
            retry_after: Duration::from_millis(value.max(0) as u64),
        },
    })
}

pub(super) fn answered_one(reply: redis::Value) -> Result<bool> {
    let n: i64 =
        redis::from_redis_value(reply).map_err(|e| Error::UnexpectedReply(e.to_string()))?;
    Ok(n == 1)
}

impl<C> Backend for RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn check(&self) -> BoxFuture<'_, Result<Vec<super::Warning>>> {
        self.bounded(async move {
            let (started, mut conn) = (self.started(), self.conn.clone());
            let mut reply = super::check::redis(&mut conn).await;
            if self.retry(&reply, &mut conn, started)? {
                reply = super::check::redis(&mut conn).await;
            }
            self.reply(reply)
        })
    }

    fn acquire<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Acquisition>> {
        let LeaseRef { lock, mode, secret } = lease;
        if mode == Mode::Exclusive && !lock.fenced {
            // Boxed on its own, without room for the scripts' state it never uses.
            if self.contended.is_contended(lock.namespace, lock.name) {
                return self.bounded(self.set_nx_and_pttl(lock, secret));
            }
            return self.bounded(self.set_nx(lock, secret));
        }
        let secret = Some(secret);
        self.bounded(async move {
            let reply = match mode {
                Mode::Exclusive => {
                    let roles = [KeyRole::Lock];
                    let fence = Some(KeyRole::LockFence);
                    self.run(&ACQUIRE, lock, &roles, fence, secret, LastArg::Ttl)
                        .await?
                }
                Mode::Permit => {
                    let roles = [KeyRole::Permits];
                    let limit = LastArg::TtlAnd(lock.permits.into());
                    self.run(&PERMIT_ACQUIRE, lock, &roles, None, secret, limit)
                        .await?
                }
                Mode::Read | Mode::Write => {
                    let script = if mode == Mode::Read {
                        &READ_ACQUIRE
                    } else {
                        &WRITE_ACQUIRE
                    };
                    let roles = [KeyRole::Writer, KeyRole::Readers, KeyRole::WriteIntent];
                    let fence = Some(KeyRole::RwLockFence);
                    let last = match mode {
                        Mode::Write => {
                            let intent = lock.write_intent().unwrap_or_default();
                            LastArg::TtlAnd(intent.as_millis() as u64)
                        }
                        _ => LastArg::Ttl,
                    };
                    self.run(script, lock, &roles, fence, secret, last).await?
                }
            };
            acquisition(reply, lock.fenced)
        })
    }

    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, Result<u32>> {
        self.bounded(async move {
            let roles = [KeyRole::Permits];
            let reply = self
                .run(&PERMITS_IN_USE, lock, &roles, None, None, LastArg::Ttl)
                .await?;
            redis::from_redis_value(reply).map_err(|e| Error::UnexpectedReply(e.to_string()))
        })
    }

    fn withdraw_intent<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        if lease.mode != Mode::Write || !lease.lock.writer_preferred {
            return Box::pin(async { Ok(false) });
        }
        self.bounded(async move {
            let LeaseRef { lock, mode, secret } = lease;
            let channel = notify::channel(&self.layout, mode, lock.namespace, lock.name);
            let (roles, last) = ([KeyRole::WriteIntent], LastArg::Channel(&channel));
            let reply = self
                .run(&WITHDRAW_INTENT, lock, &roles, None, Some(secret), last)
                .await?;
            answered_one(reply)
        })
    }

    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Extended>> {
        self.bounded(async move {
            let (script, _) = holder_script(lease.mode, Holder::Extend);
            let (lock, secret) = (lease.lock, Some(lease.secret));
            let roles = extend_keys(lease.mode);
            extended(
                self.run(script, lock, roles, None, secret, LastArg::Ttl)
                    .await?,
            )
        })
    }

    fn extend_many<'a>(
        &'a self,
        leases: &'a [LeaseRef<'a>],
    ) -> BoxFuture<'a, Vec<Result<Extended>>> {
        Box::pin(self.extend_pipelined(leases))
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        self.bounded(async move {
            let (script, role) = holder_script(lease.mode, Holder::Release);
            let (lock, secret) = (lease.lock, Some(lease.secret));
            // A reader's or a permit's script names its channel from its key.
            let channel = match lease.mode {
                Mode::Exclusive | Mode::Write => {
                    notify::channel(&self.layout, lease.mode, lock.namespace, lock.name)
                }
                Mode::Read | Mode::Permit => Vec::new(),
            };
            let last = match lease.mode {
                Mode::Exclusive | Mode::Write => LastArg::Channel(&channel),
                Mode::Read | Mode::Permit => LastArg::None,
            };
            answered_one(self.run(script, lock, &[role], None, secret, last).await?)
        })
    }
}

impl<C> From<RedisStore<C>> for crate::Store
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn from(store: RedisStore<C>) -> Self {
        let notifications = store.notifier.clone().map(|notifier| super::Notifications {
            notifier,
            layout: store.layout.clone(),
            timeout: store.timeout,
        });
        crate::Store::from_backend(store).with_notifications(notifications)
    }
}

#[cfg(test)]
#[path = "redis_tests.rs"]
mod tests;
