//! [`RedisStore`]: leases in Redis, through the scripts of [`scripts`](super::scripts).

use std::any::Any;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};

use super::keys::{Key, KeyLayout, KeyRole};
use super::notify;
use super::scripts::{ACQUIRE, Holder, Lua, READ_ACQUIRE, WRITE_ACQUIRE, holder_script};
use super::{Acquisition, Backend, BoxFuture, LeaseRef, LockRef, Mode, Secret};
use crate::{Error, Result};

pub(super) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// Room for the short arguments of a command besides its keys and script: verb, secret, TTL,
/// key count, `NX PX`.
const ARGS_LEN: usize = 64;

/// A [`Backend`] on Redis, over any redis-rs async connection, with its options.
///
/// Keys, for prefix `P`, namespace `ns` and name `name` (raw bytes):
///
/// | lock | key | holds |
/// |---|---|---|
/// | [`Lock`](crate::Lock) | `P:lock:{ns:name}` | string: the holder's secret, `PX ttl` |
/// | [`RwLock`](crate::RwLock) writer | `P:rwlock:{ns:name}:w` | string: the writer's secret, `PX ttl` |
/// | [`RwLock`](crate::RwLock) readers | `P:rwlock:{ns:name}:r` | sorted set: reader secrets scored by lease end (server ms) |
/// | fenced | `P:lock:{ns:name}:fence`, `P:rwlock:{ns:name}:fence` | the last fence issued, never expires |
///
/// All keys of one name share the `{…}` hash tag, so they live in one cluster slot and every
/// script touches one slot only. The layout is injective: no two (namespace, name) pairs share a
/// key, whatever bytes the name holds, because the suffixes after the last `}` never contain one.
#[derive(Clone, Debug)]
pub struct RedisStore<C> {
    conn: C,
    layout: KeyLayout,
    timeout: Duration,
    bound: Bound,
    watchdog: Arc<watchdog::Watchdog>,
    /// The subscriber for release notifications, when the store was given a client for it.
    notifier: Option<Arc<notify::Notifier>>,
}

/// The last argument of a holder's script: the TTL to extend by, or the channel a release
/// publishes on.
#[derive(Clone, Copy)]
enum LastArg<'a> {
    Ttl,
    Channel(&'a [u8]),
}

/// Who keeps a call's deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bound {
    /// The store's own coarse timer ([`watchdog`]) around each call: for a deadline set with
    /// [`RedisStore::timeout`], and for connections whose own response timeout the store cannot
    /// set (a `ConnectionManager` waits for its reconnections outside it).
    Own,
    /// The response timeout of the store's own clone of a `MultiplexedConnection`, set to the
    /// deadline: redis-rs arms that timer for every request anyway, so a second one would only
    /// cost time.
    Connection,
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
    /// Runs `script` with the keys of `roles` (the fence key last, and only when fenced).
    async fn run(
        &self,
        script: &Lua,
        lock: LockRef<'_>,
        roles: &[KeyRole],
        fence: Option<KeyRole>,
        secret: &Secret,
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
            command.arg(secret.as_bytes().as_slice());
            match last {
                LastArg::Ttl => {
                    command.arg(lock.ttl.as_millis() as u64);
                }
                LastArg::Channel(channel) => {
                    command.arg(channel);
                }
            }
            command
        };
        let started = self.started();
        let mut conn = self.conn.clone();
        let evalsha = command("EVALSHA", script.sha());
        let reply = conn.req_packed_command(&evalsha).await;
        match reply.and_then(redis::Value::extract_error) {
            Err(e) if e.kind() == redis::ErrorKind::Server(NO_SCRIPT) => {
                self.second_trip(&mut conn, started)?;
                let eval = command("EVAL", script.code);
                self.reply(conn.req_packed_command(&eval).await)
            }
            reply => self.reply(reply),
        }
    }

    /// The unfenced exclusive acquire, the hot path of every locked request: `SET NX PX`
    /// instead of `acquire.lua`, and only when that is refused, `PTTL` for `retry_after`.
    ///
    /// The server runs a plain command instead of a Lua call, which costs it about half as much
    /// (the `throughput` benchmark measures both), and an acquisition that succeeds, the common
    /// case, makes one round trip with one command. A refused one makes a second round trip
    /// for the holder's remaining lease, within the same deadline. If the holder releases
    /// between the two, `PTTL` answers -2, and "retry now" is then true.
    async fn set_nx(&self, lock: LockRef<'_>, secret: &Secret) -> Result<Acquisition> {
        let key = self.key_arg(KeyRole::Lock, lock);
        let mut set = redis::Cmd::with_capacity(6, key.len() + ARGS_LEN);
        set.arg("SET")
            .arg(key)
            .arg(secret.as_bytes().as_slice())
            .arg("NX")
            .arg("PX")
            .arg(lock.ttl.as_millis() as u64);
        let started = self.started();
        let mut conn = self.conn.clone();
        match self.reply(conn.req_packed_command(&set).await)? {
            redis::Value::Okay => Ok(Acquisition::Acquired { fence: None }),
            redis::Value::Nil => {
                self.second_trip(&mut conn, started)?;
                let key = self.key_arg(KeyRole::Lock, lock);
                let mut pttl = redis::Cmd::with_capacity(2, key.len() + 8);
                pttl.arg("PTTL").arg(key);
                match self.reply(conn.req_packed_command(&pttl).await)? {
                    // -1 for a key someone set without expiry: "retry soon" rather than never.
                    redis::Value::Int(pttl) => Ok(Acquisition::Busy {
                        retry_after: Duration::from_millis(pttl.max(0) as u64),
                    }),
                    other => Err(Error::UnexpectedReply(format!("PTTL answered {other:?}"))),
                }
            }
            other => Err(Error::UnexpectedReply(format!("SET NX answered {other:?}"))),
        }
    }

    fn key_arg<'a>(&'a self, role: KeyRole, lock: LockRef<'a>) -> Key<'a> {
        Key(self.layout.parts(role, lock.namespace, lock.name))
    }

    /// `call` bounded by the store's deadline, boxed for [`Backend`]: with a timer of its own, or,
    /// when the connection keeps the deadline ([`Bound::Connection`]), as it is. Two boxes for
    /// two futures, so that a call without a timer does not carry room for one: a smaller
    /// future is a cheaper allocation.
    fn bounded<'a, T: 'a>(
        &'a self,
        call: impl Future<Output = Result<T>> + Send + 'a,
    ) -> BoxFuture<'a, Result<T>> {
        match self.bound {
            Bound::Connection => Box::pin(call),
            Bound::Own => Box::pin(async move {
                let call = watchdog::Deadline::new(&self.watchdog, call);
                call.await
                    .unwrap_or_else(|| Err(Error::Timeout(self.timeout)))
            }),
        }
    }

    /// A reply as this crate's result: a server error as an error, and the expiry of a response
    /// timeout that the store set (a `MultiplexedConnection`'s) as [`Error::Timeout`].
    fn reply<T: IntoResult>(&self, reply: redis::RedisResult<T>) -> Result<T> {
        match reply.and_then(IntoResult::into_result) {
            Ok(reply) => Ok(reply),
            Err(e) if e.is_timeout() && is_multiplexed::<C>() => Err(Error::Timeout(self.timeout)),
            Err(e) => Err(Error::Redis(e)),
        }
    }

    /// When the call began, if it needs to know: only a deadline kept by the connection does,
    /// for a call's second round trip.
    fn started(&self) -> Option<Instant> {
        (self.bound == Bound::Connection).then(Instant::now)
    }

    /// Before a call's second round trip: with the deadline kept by the connection, gives that
    /// round trip only what is left of it, so the call as a whole stays within the deadline.
    fn second_trip(&self, conn: &mut C, started: Option<Instant>) -> Result<()> {
        let Some(started) = started else {
            return Ok(());
        };
        let left = self.timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(Error::Timeout(self.timeout));
        }
        if let Some(conn) = multiplexed(conn) {
            conn.set_response_timeout(left);
        }
        Ok(())
    }
}

/// A reply whose server errors are still to be turned into errors.
trait IntoResult: Sized {
    fn into_result(self) -> redis::RedisResult<Self>;
}

impl IntoResult for redis::Value {
    fn into_result(self) -> redis::RedisResult<Self> {
        self.extract_error()
    }
}

impl IntoResult for Vec<redis::Value> {
    fn into_result(self) -> redis::RedisResult<Self> {
        // A pipeline's replies: each command's error stays in its place.
        Ok(self)
    }
}

impl IntoResult for Vec<super::Warning> {
    fn into_result(self) -> redis::RedisResult<Self> {
        Ok(self)
    }
}

/// `conn` as a `MultiplexedConnection`, when it is one.
fn multiplexed<C: Any>(conn: &mut C) -> Option<&mut MultiplexedConnection> {
    (conn as &mut dyn Any).downcast_mut()
}

/// Whether `C` is a `MultiplexedConnection`, whose response timeout the store sets itself.
fn is_multiplexed<C: Any>() -> bool {
    std::any::TypeId::of::<C>() == std::any::TypeId::of::<MultiplexedConnection>()
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

fn answered_one(reply: redis::Value) -> Result<bool> {
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
            let mut conn = self.conn.clone();
            self.reply(super::check::redis(&mut conn).await)
        })
    }

    fn acquire<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Acquisition>> {
        let LeaseRef { lock, mode, secret } = lease;
        if mode == Mode::Exclusive && !lock.fenced {
            // Boxed on its own, without room for the scripts' state it never uses.
            return self.bounded(self.set_nx(lock, secret));
        }
        self.bounded(async move {
            let reply = match mode {
                Mode::Exclusive => {
                    let roles = [KeyRole::Lock];
                    let fence = Some(KeyRole::LockFence);
                    self.run(&ACQUIRE, lock, &roles, fence, secret, LastArg::Ttl)
                        .await?
                }
                Mode::Read | Mode::Write => {
                    let script = if mode == Mode::Read {
                        &READ_ACQUIRE
                    } else {
                        &WRITE_ACQUIRE
                    };
                    let roles = [KeyRole::Writer, KeyRole::Readers];
                    let fence = Some(KeyRole::RwLockFence);
                    self.run(script, lock, &roles, fence, secret, LastArg::Ttl)
                        .await?
                }
            };
            acquisition(reply, lock.fenced)
        })
    }

    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        self.bounded(async move {
            let (script, role) = holder_script(lease.mode, Holder::Extend);
            let (lock, secret) = (lease.lock, lease.secret);
            answered_one(
                self.run(script, lock, &[role], None, secret, LastArg::Ttl)
                    .await?,
            )
        })
    }

    fn extend_many<'a>(&'a self, leases: &'a [LeaseRef<'a>]) -> BoxFuture<'a, Vec<Result<bool>>> {
        Box::pin(self.extend_pipelined(leases))
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        self.bounded(async move {
            let (script, role) = holder_script(lease.mode, Holder::Release);
            let (lock, secret) = (lease.lock, lease.secret);
            let channel = notify::channel(&self.layout, lease.mode, lock.namespace, lock.name);
            let last = LastArg::Channel(&channel);
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
        });
        crate::Store::from_backend(store).with_notifications(notifications)
    }
}

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// [`Backend::extend_many`]: one pipeline of `EVALSHA`s, then one of `EVAL`s for those that
    /// answered `NOSCRIPT` (after a restart or a `SCRIPT FLUSH`).
    ///
    /// A cluster pipeline goes to one slot's node, and every name has its own slot, so on a
    /// cluster connection the extends run as concurrent single calls.
    async fn extend_pipelined(&self, leases: &[LeaseRef<'_>]) -> Vec<Result<bool>> {
        if leases.len() < 2 || is_cluster::<C>() {
            return self.extend_each(leases).await;
        }
        let mut replies = match self
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
        let mut no_script = Vec::new();
        let mut answers: Vec<Result<bool>> = Vec::with_capacity(leases.len());
        for (i, reply) in replies.drain(..).enumerate() {
            if matches!(&reply, redis::Value::ServerError(e) if e.kind() == Some(NO_SCRIPT)) {
                no_script.push(i);
            }
            answers.push(answer(reply));
        }
        if !no_script.is_empty() {
            let missing: Vec<_> = no_script.iter().map(|&i| leases[i]).collect();
            match self.extend_pipeline(&missing, |lua| lua.code, "EVAL").await {
                Ok(again) if again.len() == missing.len() => {
                    for (i, reply) in no_script.into_iter().zip(again) {
                        answers[i] = answer(reply);
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

    /// Sends one pipelined `verb` (`EVALSHA` or `EVAL`) of the extend script per lease; errors
    /// of single commands come back as [`redis::Value::ServerError`] in their place.
    async fn extend_pipeline(
        &self,
        leases: &[LeaseRef<'_>],
        script: fn(&'static Lua) -> &'static str,
        verb: &str,
    ) -> Result<Vec<redis::Value>> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for lease in leases {
            let (lua, role) = holder_script(lease.mode, Holder::Extend);
            pipe.cmd(verb)
                .arg(script(lua))
                .arg(1)
                .arg(self.key_arg(role, lease.lock))
                .arg(lease.secret.as_bytes().as_slice())
                .arg(lease.lock.ttl.as_millis() as u64);
        }
        let mut conn = self.conn.clone();
        self.bounded(async { self.reply(pipe.query_async(&mut conn).await) })
            .await
    }

    async fn extend_each(&self, leases: &[LeaseRef<'_>]) -> Vec<Result<bool>> {
        let calls = leases.iter().map(|&lease| self.extend(lease));
        futures_util::future::join_all(calls).await
    }
}

const NO_SCRIPT: redis::ServerErrorKind = redis::ServerErrorKind::NoScript;
const CROSS_SLOT: redis::ServerErrorKind = redis::ServerErrorKind::CrossSlot;

/// Whether `C` is redis-rs's cluster connection, whose pipelines cannot span slots.
fn is_cluster<C: 'static>() -> bool {
    #[cfg(feature = "cluster")]
    {
        std::any::TypeId::of::<C>()
            == std::any::TypeId::of::<redis::cluster_async::ClusterConnection>()
    }
    #[cfg(not(feature = "cluster"))]
    false
}

fn answer(reply: redis::Value) -> Result<bool> {
    match reply {
        redis::Value::ServerError(e) => Err(Error::Redis(e.into())),
        reply => answered_one(reply),
    }
}

/// The same failure again, for each lease of a batch that failed as a whole.
fn copy(error: &Error) -> Error {
    match error {
        Error::Redis(e) => Error::Redis(e.clone()),
        Error::Timeout(d) => Error::Timeout(*d),
        other => Error::UnexpectedReply(other.to_string()),
    }
}

/// The store's own deadline: one coarse timer per store, shared by all its calls, instead of a
/// `tokio::time::timeout` per call.
///
/// A call registers its waker once, when it first waits, and removes it when it ends: two
/// uncontended lock round trips, where a tokio timer entry costs several times as many
/// instructions (the `throughput` benchmark's `diag` variants measure both). A task ticks
/// `tick` at a time while calls are waiting, wakes those whose deadline has passed, and ends
/// when none are left or when the store is gone. A call fails after between `timeout` and
/// `timeout` plus two ticks (a 32nd of the deadline each, at most 25 ms).
mod watchdog {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex, MutexGuard, Weak};
    use std::task::{Context, Poll, Waker};
    use std::time::Duration;

    /// The shared timer of one store (and its clones).
    #[derive(Debug)]
    pub(super) struct Watchdog {
        tick: Duration,
        /// Ticks until a call that starts now is overdue: at least the whole deadline, since
        /// the clock may be up to one tick behind.
        ticks: u64,
        /// Ticks since the timer first ran: the coarse clock every deadline is measured on.
        now: AtomicU64,
        waiting: Mutex<Waiting>,
    }

    #[derive(Debug, Default)]
    struct Waiting {
        /// Registered calls: their deadline (in ticks) and waker; `None` for a free slot.
        slots: Vec<Option<(u64, Waker)>>,
        free: Vec<usize>,
        /// The ticking task that is alive, if any (it clears this when it ends or is dropped).
        ticking: Option<u64>,
        /// How many ticking tasks were started.
        started: u64,
    }

    impl Watchdog {
        pub(super) fn new(timeout: Duration) -> Arc<Self> {
            let tick = (timeout / 32).clamp(Duration::from_millis(1), Duration::from_millis(25));
            let ticks = (timeout.as_nanos().div_ceil(tick.as_nanos()) as u64).saturating_add(1);
            Arc::new(Self {
                tick,
                ticks,
                now: AtomicU64::new(0),
                waiting: Mutex::new(Waiting::default()),
            })
        }

        fn lock(&self) -> MutexGuard<'_, Waiting> {
            // A panic while holding it leaves nothing half-done that matters here.
            self.waiting.lock().unwrap_or_else(|e| e.into_inner())
        }

        fn register(self: &Arc<Self>, deadline: u64, waker: &Waker) -> usize {
            let mut waiting = self.lock();
            let entry = Some((deadline, waker.clone()));
            let slot = match waiting.free.pop() {
                Some(slot) => {
                    waiting.slots[slot] = entry;
                    slot
                }
                None => {
                    waiting.slots.push(entry);
                    waiting.slots.len() - 1
                }
            };
            if waiting.ticking.is_none() {
                waiting.started += 1;
                let id = waiting.started;
                waiting.ticking = Some(id);
                drop(waiting);
                tokio::spawn(tick(Arc::downgrade(self), id));
            }
            slot
        }

        fn update(&self, slot: usize, waker: &Waker) {
            if let Some((_, registered)) = &mut self.lock().slots[slot] {
                registered.clone_from(waker);
            }
        }

        fn remove(&self, slot: usize) {
            let mut waiting = self.lock();
            waiting.slots[slot] = None;
            waiting.free.push(slot);
        }
    }

    /// Clears `ticking` however ticking task `id` ends, dropped with its runtime included, so
    /// that the next call starts another.
    struct Ticking(Weak<Watchdog>, u64);

    impl Drop for Ticking {
        fn drop(&mut self) {
            if let Some(watchdog) = self.0.upgrade() {
                let mut waiting = watchdog.lock();
                if waiting.ticking == Some(self.1) {
                    waiting.ticking = None;
                }
            }
        }
    }

    /// Ticking task `id`: advances the clock of `watchdog` and wakes the calls that are overdue.
    async fn tick(watchdog: Weak<Watchdog>, id: u64) {
        let _ticking = Ticking(watchdog.clone(), id);
        let Some(period) = watchdog.upgrade().map(|watchdog| watchdog.tick) else {
            return;
        };
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        interval.tick().await;
        loop {
            interval.tick().await;
            let Some(watchdog) = watchdog.upgrade() else {
                return;
            };
            let mut waiting = watchdog.lock();
            if waiting.ticking != Some(id) {
                return;
            }
            // Advanced under the lock: only the one live task moves the clock.
            let now = watchdog.now.fetch_add(1, Ordering::AcqRel) + 1;
            if waiting.free.len() == waiting.slots.len() {
                // Nothing waits: end, and let the next call start the clock again. Cleared
                // here, under the lock, so that a call registering now starts a new task.
                waiting.ticking = None;
                return;
            }
            for (deadline, waker) in waiting.slots.iter().flatten() {
                if *deadline <= now {
                    waker.wake_by_ref();
                }
            }
        }
    }

    pin_project_lite::pin_project! {
        /// `call`, or `None` once `timeout` has passed.
        pub(super) struct Deadline<'a, F> {
            #[pin]
            call: F,
            watchdog: &'a Arc<Watchdog>,
            // The slot, deadline (in ticks) and waker once registered.
            registered: Option<(usize, u64, Waker)>,
        }

        impl<F> PinnedDrop for Deadline<'_, F> {
            fn drop(this: Pin<&mut Self>) {
                let this = this.project();
                if let Some((slot, _, _)) = this.registered.take() {
                    this.watchdog.remove(slot);
                }
            }
        }
    }

    impl<'a, F> Deadline<'a, F> {
        pub(super) fn new(watchdog: &'a Arc<Watchdog>, call: F) -> Self {
            Self {
                call,
                watchdog,
                registered: None,
            }
        }
    }

    impl<F: Future> Future for Deadline<'_, F> {
        type Output = Option<F::Output>;

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
            let this = self.project();
            if let Poll::Ready(reply) = this.call.poll(cx) {
                if let Some((slot, _, _)) = this.registered.take() {
                    this.watchdog.remove(slot);
                }
                return Poll::Ready(Some(reply));
            }
            let now = this.watchdog.now.load(Ordering::Acquire);
            match this.registered {
                None => {
                    let deadline = now + this.watchdog.ticks;
                    let slot = this.watchdog.register(deadline, cx.waker());
                    *this.registered = Some((slot, deadline, cx.waker().clone()));
                }
                Some((slot, deadline, _)) if *deadline <= now => {
                    let slot = *slot;
                    *this.registered = None;
                    this.watchdog.remove(slot);
                    return Poll::Ready(None);
                }
                Some((slot, _, waker)) => {
                    // The task moved (another waker): the timer must wake the new one.
                    if !waker.will_wake(cx.waker()) {
                        waker.clone_from(cx.waker());
                        this.watchdog.update(*slot, cx.waker());
                    }
                }
            }
            Poll::Pending
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use redis::aio::ConnectionLike;

    use super::RedisStore;
    use crate::Error;
    use crate::store::{Backend, LeaseRef, LockRef, Mode, Secret};

    /// A connection that never answers, as a blackholed Redis.
    #[derive(Clone)]
    struct Silent;

    impl ConnectionLike for Silent {
        fn req_packed_command<'a>(
            &'a mut self,
            _cmd: &'a redis::Cmd,
        ) -> redis::RedisFuture<'a, redis::Value> {
            Box::pin(std::future::pending())
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            _cmd: &'a redis::Pipeline,
            _offset: usize,
            _count: usize,
        ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
            Box::pin(std::future::pending())
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    /// One store used from one runtime after another: the timer of the first runtime dies with
    /// it, and the next call starts one in its own.
    #[test]
    fn the_deadline_holds_in_every_runtime_a_store_is_used_from() {
        let deadline = Duration::from_millis(80);
        let store = RedisStore::new(Silent).timeout(deadline);
        let secret = Secret::random();
        for _ in 0..3 {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                for _ in 0..2 {
                    let lock = LockRef::new("ns", b"name", Duration::from_secs(1), false);
                    let started = Instant::now();
                    let calls = futures_util::future::join(
                        store.acquire(LeaseRef::new(lock, Mode::Exclusive, &secret)),
                        store.release(LeaseRef::new(lock, Mode::Read, &secret)),
                    );
                    let (acquire, release) = calls.await;
                    let elapsed = started.elapsed();
                    assert!(matches!(acquire, Err(Error::Timeout(d)) if d == deadline));
                    assert!(matches!(release, Err(Error::Timeout(d)) if d == deadline));
                    assert!(elapsed >= deadline, "{elapsed:?}");
                    assert!(elapsed < deadline * 2, "{elapsed:?}");
                }
            });
        }
    }
}
