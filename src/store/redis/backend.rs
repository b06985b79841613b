//! [`Backend`] for [`RedisStore`]: which script or command each call sends, and how its answer
//! reads; the scripts' extend and release of a held lease.

use std::borrow::Cow;
use std::time::Duration;

use redis::aio::ConnectionLike;

use super::connection::check;
use super::extend_many::{extend_keys, extended};
use super::keys::ON_STACK;
use super::native::cas::{Cas, native_mode};
use super::scripts::{
    ACQUIRE, Call, Holder, LastArg, Lua, PERMIT_ACQUIRE, PERMITS_IN_USE, READ_ACQUIRE,
    WITHDRAW_INTENT, WRITE_ACQUIRE, WRITE_RELEASE, holder_script,
};
use super::{KeyRole, RedisStore, acquisition, answered_one, notify};
use crate::backend::{
    Acquisition, Backend, Begin, BoxFuture, Completion, Extended, FINGERPRINT_LEN, LeaseRef,
    LockRef, Mode, NotificationSink, Warning, unsupported,
};
use crate::{Error, Result};

impl<C> Backend for RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn check(&self) -> BoxFuture<'_, Result<Vec<Warning>>> {
        self.bounded(async move {
            let (started, mut conn) = (self.started(), self.conn.clone());
            let store = check::Asked {
                replicas: self.replicas.map(|r| r.wanted),
                notifications: self.notifier.is_some(),
            };
            let mut reply = check::redis(&mut conn, store).await;
            if self.retry(&reply, &mut conn, started)? {
                reply = check::redis(&mut conn, store).await;
            }
            let warnings = self.reply(reply)?;
            // Asked again: the server may have changed since the store first asked.
            self.probe_native().await;
            Ok(warnings)
        })
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A release publishes only when a waiter's refused attempt marked its lock (see
    /// `lock/acquire.lua`), as the Postgres store notifies only a marked name: the waiters that
    /// marked it hear it, and a waiter queued behind a lease of this process, which sends no
    /// attempt, wakes on this process's release instead.
    fn announces_every_release(&self) -> bool {
        false
    }

    /// A release publishes its holder's secret, and the subscriber of the store that made it
    /// drops that message (see `notify::Notifier::expect_echo`): this process's waiters wake
    /// on the release itself.
    fn delivers_own_releases(&self) -> bool {
        false
    }

    fn notify_to(&self, sink: NotificationSink) -> bool {
        self.notifier
            .as_ref()
            .is_some_and(|notifier| notifier.deliver_to(sink))
    }

    fn watch<'a>(
        &'a self,
        mode: Mode,
        namespace: &'a str,
        name: &'a [u8],
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            let Some(notifier) = &self.notifier else {
                return Err(Error::Backend(
                    "the store has no release notifications".into(),
                ));
            };
            let channel = notify::channel(&self.layout, mode, namespace, name);
            let watched = notify::Watched {
                mode,
                namespace: namespace.into(),
                name: name.into(),
            };
            match notifier.watch(channel, watched).await {
                true => Ok(()),
                false => Err(Error::Backend(
                    "subscribing to release notifications failed".into(),
                )),
            }
        })
    }

    fn unwatch(&self, mode: Mode, namespace: &str, name: &[u8]) {
        if let Some(notifier) = &self.notifier {
            notifier.unwatch(notify::channel(&self.layout, mode, namespace, name));
        }
    }

    fn acquire<'a>(&'a self, mut lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Acquisition>> {
        // A waiter's mark makes the release publish, for waiters that listen: through a store
        // without notifications a waiter polls, and a lock's or a semaphore's waiting attempt
        // is then an ordinary one. (A reader's or a writer's stays a waiting one, mark and
        // all: it keeps its place under the lock's fairness.)
        if self.notifier.is_none() && matches!(lease.mode, Mode::Exclusive | Mode::Permit) {
            lease.waiting = false;
        }
        let LeaseRef {
            lock, mode, secret, ..
        } = lease;
        let wait = self.replicas;
        if mode == Mode::Exclusive && !lock.fenced && lease.waiting {
            // A waiter's refusal marks the lock in the script that refuses it: the script at
            // once for a name refused lately, else after a `SET NX` found it taken.
            if wait.is_none() && !self.contended.is_contended(lock.namespace, lock.name) {
                return self.bounded(async move {
                    match self.set_nx_only(lock, secret).await? {
                        true => Ok(Acquisition::Acquired { fence: None }),
                        false => self.acquire_script(lease).await,
                    }
                });
            }
            return self.bounded(self.acquire_script(lease));
        }
        if mode == Mode::Exclusive && !lock.fenced {
            if let Some(replicas) = wait {
                return self.bounded(self.set_nx_replicated(lock, secret, replicas));
            }
            // Boxed on its own, without room for the scripts' state it never uses.
            if self.contended.is_contended(lock.namespace, lock.name) {
                return self.bounded(self.set_nx_and_pttl(lock, secret));
            }
            return self.bounded(self.set_nx(lock, secret));
        }
        self.bounded(self.acquire_script(lease))
    }

    fn idempotency_begin<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        fingerprint: &'a [u8; FINGERPRINT_LEN],
    ) -> BoxFuture<'a, Result<Begin>> {
        self.bounded(self.idem_begin(lease, fingerprint))
    }

    fn idempotency_complete<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        completion: Completion<'a>,
    ) -> BoxFuture<'a, Result<bool>> {
        self.bounded(self.idem_complete(lease, completion))
    }

    fn idempotency_begin_once<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        fingerprint: &'a [u8; FINGERPRINT_LEN],
        retention: Duration,
    ) -> BoxFuture<'a, Result<Begin>> {
        self.bounded(self.idem_begin_once(lease, fingerprint, retention))
    }

    fn idempotency_free<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        self.bounded(self.idem_free(lease))
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
        if lease.mode != Mode::Write || lease.lock.write_intent().is_none() {
            return Box::pin(async { Ok(false) });
        }
        self.bounded(async move {
            let LeaseRef {
                lock, mode, secret, ..
            } = lease;
            let channel = notify::channel(&self.layout, mode, lock.namespace, lock.name);
            let roles = [KeyRole::WriteIntent, KeyRole::RwLockWaited];
            let last = LastArg::Channel(&channel);
            let reply = self
                .run(&WITHDRAW_INTENT, lock, &roles, None, Some(secret), last)
                .await?;
            answered_one(reply)
        })
    }

    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Extended>> {
        if native_mode(lease.mode) && self.native.get() != Cas::Lua {
            return self.bounded(async move {
                match self.extend_native(lease).await? {
                    Some(extended) => Ok(extended),
                    None => self.extend_script(lease).await,
                }
            });
        }
        self.bounded(self.extend_script(lease))
    }

    fn extend_many<'a>(
        &'a self,
        leases: &'a [LeaseRef<'a>],
    ) -> BoxFuture<'a, Vec<Result<Extended>>> {
        Box::pin(self.extend_pipelined(leases))
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        self.expect_echo(lease);
        if lease.mode == Mode::Write && lease.lock.read_phase().is_some() {
            // Its release begins a read phase: a script, never a native compare-and-delete.
            return self.bounded(self.release_script(lease));
        }
        if native_mode(lease.mode) && self.native.get() != Cas::Lua {
            return self.bounded(async move {
                match self.release_native(lease).await? {
                    Some(released) => Ok(released),
                    None => self.release_script(lease).await,
                }
            });
        }
        self.bounded(self.release_script(lease))
    }

    fn release_live<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        match lease.mode {
            // A member of a sorted set has no expiry of its own: nothing to ask the server's
            // clock, and plain commands instead of a script (see `live_release.rs`).
            Mode::Read | Mode::Permit => {
                self.expect_echo(lease);
                self.bounded(self.release_live_member(lease))
            }
            // A key with `PX` ends by itself: nothing to skip.
            _ => self.release(lease),
        }
    }
}

/// What the releases have to tell the subscriber.
impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Tells the subscriber that the release of `lease` may come back as a message: this
    /// process's waiters wake on the release itself (`Store`'s wait rooms), so the message is
    /// not theirs to hear again. An idempotency reservation's release is left out: its
    /// waiters hear releases by message only.
    fn expect_echo(&self, lease: LeaseRef<'_>) {
        if let (Some(notifier), false) = (&self.notifier, lease.mode == Mode::Reservation) {
            let lock = lease.lock;
            let channel = notify::channel_arg(&self.layout, lease.mode, lock.namespace, lock.name);
            notifier.expect_echo(channel, lease.secret.as_bytes());
        }
    }
}

/// The scripts' way of extending and releasing a held lease: every lease on a server without
/// native compare-and-set (see `native/`), and readers and permits everywhere.
impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Acquires `lease` with its script: every lock but an unfenced `Lock` outside a bounded
    /// wait. A refused attempt of a bounded wait ([`LeaseRef::waiting`]) marks what refused it,
    /// so that the release it waits for publishes (see `lock/acquire.lua`); a `Lock`'s or a
    /// `Semaphore`'s only through a store with notifications.
    pub(in crate::store::redis) async fn acquire_script(
        &self,
        lease: LeaseRef<'_>,
    ) -> Result<Acquisition> {
        const RW: &[KeyRole] = &[
            KeyRole::Writer,
            KeyRole::Readers,
            KeyRole::WriteIntent,
            KeyRole::WaitingReaders,
            KeyRole::ReadPhase,
            KeyRole::RwLockWaited,
        ];
        let LeaseRef {
            lock, mode, secret, ..
        } = lease;
        let wait = self.replicas;
        // A reader's mark also says its attempt is a waiting one (`read_acquire.lua` notes it
        // among the waiting readers of a phase-fair lock): kept whether or not anyone listens.
        let mark = if lease.waiting { self.mark_ms() } else { 0 };
        let (script, roles, fence, last): (&Lua, &[KeyRole], _, _) = match mode {
            Mode::Exclusive => (
                &ACQUIRE,
                &[KeyRole::Lock],
                Some(KeyRole::LockFence),
                LastArg::TtlAnd(lease.waiting.into()),
            ),
            Mode::Permit => (
                &PERMIT_ACQUIRE,
                &[KeyRole::Permits, KeyRole::PermitsWaited],
                None,
                LastArg::TtlAndTwo(lock.permits.into(), mark),
            ),
            Mode::Read => {
                let phase = lock.read_phase().unwrap_or_default().as_millis() as u64;
                let last = LastArg::TtlAndTwo(phase, mark);
                (&READ_ACQUIRE, RW, Some(KeyRole::RwLockFence), last)
            }
            Mode::Write => {
                let intent = lease.write_intent().unwrap_or_default().as_millis() as u64;
                let phase_fair = match (lock.read_phase(), lease.waiting) {
                    (None, _) => 0,
                    (Some(_), false) => 1,
                    (Some(_), true) => 2,
                };
                let last = LastArg::TtlAndThree(intent, phase_fair, mark);
                (&WRITE_ACQUIRE, RW, Some(KeyRole::RwLockFence), last)
            }
            // Reservations are taken by `idempotency_begin` only.
            Mode::Reservation => return Err(unsupported()),
        };
        let secret = Some(secret);
        let call = Call {
            script,
            lock,
            roles,
            fence,
            secret,
            last,
        };
        let (reply, waited) = self.run_waiting(call, wait).await?;
        let acquisition = acquisition(reply, lock)?;
        if mode == Mode::Exclusive && !lock.fenced {
            // The unfenced `SET NX` path's hint, kept by its waiters' attempts too.
            match acquisition {
                Acquisition::Busy { retry_after } => {
                    self.contended
                        .refused(lock.namespace, lock.name, retry_after)
                }
                Acquisition::Acquired { .. } => self.contended.acquired(lock.namespace, lock.name),
            }
        }
        match wait {
            None => Ok(acquisition),
            Some(replicas) => {
                self.unless_replicated(lease, acquisition, waited, replicas)
                    .await
            }
        }
    }

    /// Extends `lease` with its script: every lease on a server without native
    /// compare-and-set, and readers and permits everywhere.
    pub(in crate::store::redis) async fn extend_script(
        &self,
        lease: LeaseRef<'_>,
    ) -> Result<Extended> {
        let (script, _) = holder_script(lease.mode, Holder::Extend);
        let call = Call {
            script,
            lock: lease.lock,
            roles: extend_keys(lease.mode),
            fence: None,
            secret: Some(lease.secret),
            last: LastArg::Ttl,
        };
        let (reply, waited) = self.run_waiting(call, self.replicas).await?;
        let extended = extended(reply)?;
        if let (Some(replicas), Some(waited)) = (self.replicas, waited) {
            // A lease found gone wrote nothing to wait for.
            if extended != Extended::Gone {
                replicas.check(waited)?;
            }
        }
        Ok(extended)
    }

    /// Releases `lease` with its script, as [`extend_script`](Self::extend_script) extends: a
    /// reader or a permit only when its holder could not confirm it live (see
    /// [`Backend::release_live`] and `live_release.rs`).
    pub(in crate::store::redis) async fn release_script(
        &self,
        lease: LeaseRef<'_>,
    ) -> Result<bool> {
        let (script, role) = holder_script(lease.mode, Holder::Release);
        let (lock, secret) = (lease.lock, Some(lease.secret));
        // A reader's or a permit's script names its channel from its key. Joined on the stack,
        // as a key is: a release is half of every cycle, and a `Vec` here was its one
        // allocation of tower-lease's own.
        let mut buf = [0; ON_STACK];
        let joined = match lease.mode {
            Mode::Read | Mode::Permit => Cow::Borrowed(&[][..]),
            _ => notify::channel_arg(self.layout(), lease.mode, lock.namespace, lock.name)
                .join_in(&mut buf),
        };
        let channel: &[u8] = &joined;
        if let (Mode::Write, Some(phase)) = (lease.mode, lock.read_phase()) {
            let roles = [
                KeyRole::Writer,
                KeyRole::WaitingReaders,
                KeyRole::ReadPhase,
                KeyRole::RwLockWaited,
            ];
            let last = LastArg::ChannelAnd(channel, phase.as_millis() as u64);
            let reply = self.run(&WRITE_RELEASE, lock, &roles, None, secret, last);
            return answered_one(reply.await?);
        }
        let last = match lease.mode {
            Mode::Read | Mode::Permit => LastArg::None,
            // Nobody marks a reservation: its waiters hear every release.
            Mode::Reservation => LastArg::ChannelAnd(channel, 1),
            _ => LastArg::Channel(channel),
        };
        let roles: &[KeyRole] = match lease.mode {
            Mode::Read => &[KeyRole::Readers, KeyRole::RwLockWaited],
            Mode::Permit => &[KeyRole::Permits, KeyRole::PermitsWaited],
            _ => &[role],
        };
        answered_one(self.run(script, lock, roles, None, secret, last).await?)
    }
}
