//! [`RedisStore`]: leases in Redis. Its lease operations are here: which command or script each
//! call sends (`backend.rs`), the heartbeat's batched extends (`extend_many.rs`), idempotency
//! keys (`idempotency.rs`) and the key layout (`keys.rs`). The folders: `set_nx/` (the unfenced
//! acquire), `native/` (extend and release with native compare-and-set), `scripts/` (the Lua
//! and how it is called), `connection/` (connecting, timeouts, `WAIT`, the startup check),
//! `notify/` (release notifications), `sentinel/` and `cluster/`.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionLike;

use self::connection::replicas::Replicas;
use self::connection::timeout::{Bound, multiplexed};
use self::native::cas::Native;
use self::set_nx::contended::ContendedNames;
use crate::backend::{Acquisition, LockRef};
use crate::coarse_timer;
use crate::{Error, Result};

mod backend;
#[cfg(feature = "cluster")]
mod cluster;
mod connection;
mod extend_many;
mod idempotency;
mod keys;
mod live_release;
mod native;
pub(super) mod notify;
mod scripts;
#[cfg(feature = "sentinel")]
mod sentinel;
mod set_nx;

pub use self::keys::{KeyLayout, KeyRole};
#[cfg(feature = "sentinel")]
pub use self::sentinel::SentinelConnection;

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// A [`Backend`](crate::backend::Backend) on Redis, over any redis-rs async connection, with its
/// options.
///
/// Made by one of four constructors, each with release notifications (a waiter hears of a
/// release elsewhere at once) and write intents (a refused writer's intent reaches
/// readers in other processes):
///
/// | constructor | connects to |
/// |---|---|
/// | [`connect`](Self::connect) | one Redis, by URL |
/// | [`from_client`](Self::from_client) | one Redis, through a `redis::Client` you configured (TLS, credentials) |
/// | `connect_cluster` | a Redis Cluster (feature `cluster`) |
/// | `connect_sentinel` | the primary Sentinel names, following failovers (feature `sentinel`) |
///
/// then `.into()` a [`Store`](crate::Store). [`RedisStore::new`] takes a connection you built
/// yourself, and lacks what those add unless you add it.
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
/// | [`IdempotencyLayer`](crate::IdempotencyLayer) key | `P:idem:{ns:scope:key}` (and `:fence` when fenced) | string: the reservation's secret, `PX` its lease; once completed the record (fingerprint, completing secret, stored response), `PX` the retention |
///
/// A fence is `max(last + 1, server µs)`, so the counter only matters the few µs it may be ahead
/// of the server clock: its expiry never lowers a fence, and a name nobody uses leaves no key.
/// A read acquisition renews the counter's hour (it is the write generation readers see), but
/// never creates it.
///
/// A call that finds its connection dropped or refused (a restart, a reset; not a timeout) is
/// sent once more at once, within the same timeout, on the connection the connection manager
/// or cluster client makes anew. Every command is safe to send twice: the acquire scripts
/// answer "acquired" (with the fence we were given) when they find our own secret in place, an
/// unfenced acquire's retry reads the key back with `GET` in the `SET NX`'s pipeline, and
/// extend and release compare the secret before they act (a release retried after it went
/// through answers `false`).
///
/// A call that timed out is not undone: a slow or paused Redis runs it when it gets to it. So
/// when an acquisition (or an idempotency key's reservation) times out, or its connection breaks
/// with it on the wire, the store releases its secret right after, on the same connection,
/// and again with backoff until Redis answers, for at most the lease's TTL: the lease it may
/// take is given back rather than left to refuse every retry. Redis runs one connection's
/// commands in order, so the release lands after the acquisition it undoes.
///
/// # Native compare-and-set
///
/// Where the server has them (Valkey 9.0+, Redis 8.4+; asked once, at connect or on the first
/// extend or release), an exclusive or writer lease is extended with `SET key secret IFEQ secret
/// PX ttl` and released with `DELIFEQ key secret` (Valkey) or `DELEX key IFEQ secret` (Redis),
/// pipelined with its `PUBLISH`: plain commands, no script, so an unfenced [`Lock`](crate::Lock)
/// runs none at all. Valkey 8.1 has the `SET` only. Everything else runs its script, as on older
/// servers. A `tracing` debug event (`tower-lease: compare-and-set`) names the path a store
/// takes; [`Store::check`](crate::Store::check) asks again.
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
    timer: Arc<coarse_timer::CoarseTimer>,
    /// The subscriber for release notifications, when the store was given a client for it.
    notifier: Option<Arc<notify::Notifier>>,
    /// Whether the scripts publish with `SPUBLISH`, for a sharded subscriber on a cluster.
    sharded: bool,
    /// Names lately refused, whose next `SET NX` carries its `PTTL` along.
    contended: Arc<ContendedNames>,
    /// The replicas an acquisition or extension waits for, if any.
    replicas: Option<Replicas>,
    /// Which compare-and-set commands the server has (see `native/`).
    native: Arc<Native>,
}

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A store on a connection you built yourself (a `ConnectionManager`, a
    /// `MultiplexedConnection`, a cluster connection), with the default prefix (`tower-lease`)
    /// and timeout (1 s).
    ///
    /// What the four constructors above add, it lacks:
    ///
    /// - **release notifications**: bounded waiters find releases in other processes by polling
    ///   (5 to 100 ms apart), and a writer of a
    ///   [phase-fair or writers-first](crate::RwLock::fairness) lock cannot hold readers of other
    ///   processes back, so under a steady stream of readers it may wait until its bound.
    ///   [`notifications`](Self::notifications) adds them; [`Store::check`](crate::Store::check)
    ///   warns ([`Warning::NoNotifications`](crate::Warning::NoNotifications)) while they are
    ///   missing;
    /// - the connection settings of a lock store (reconnects within 100 ms, redis-rs's timeouts
    ///   equal to the store's timeout): see [`from_client`](Self::from_client);
    /// - native compare-and-set, which it asks for on the first extend or release instead of
    ///   at connect.
    ///
    /// On a `MultiplexedConnection` the default timeout is kept by the connection itself: the
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
            timer: coarse_timer::CoarseTimer::new(DEFAULT_TIMEOUT),
            notifier: None,
            sharded: false,
            contended: Arc::new(ContendedNames::new()),
            replicas: None,
            native: Arc::default(),
        }
    }

    /// Counts an acquisition or an extension only once `n` replicas acknowledged its write,
    /// waiting at most `timeout` for them (`WAIT n timeout`, in the write's own pipeline: no
    /// extra round trip). With fewer, an acquisition fails with [`Error::NotReplicated`] and
    /// its lease is released again; an extension fails with it, which the heartbeat retries as
    /// any store error until the lease's expiry. An [`IdempotencyLayer`] reservation counts
    /// as an acquisition (`503`, not-replicated, and the key freed), and so does storing its
    /// response: one the replicas did not acknowledge is still sent, but not counted as
    /// stored. A refused acquisition, a release and a read of the permits in use send no
    /// `WAIT`.
    ///
    /// [`IdempotencyLayer`]: crate::IdempotencyLayer
    ///
    /// Keep `timeout` well under the store's [`timeout`](Self::timeout): a call waits for its
    /// write and for `WAIT` within that one timeout. `n = 0` sends no `WAIT` (the default).
    ///
    /// What it buys: a lease the primary took and `n` replicas acknowledged survives the
    /// primary's death and a failover to one of them (followed by `connect_sentinel`, feature
    /// `sentinel`). What it does not: `WAIT` is not
    /// consensus. A replica that acknowledged and then died before the failover, a promotion of
    /// a replica that had not acknowledged (more replicas than `n`), or a lost majority can still
    /// lose a lease; and `WAIT` counts replicas that hold the write in memory, not on disk
    /// (`WAITAOF`, which would, needs Redis 7.2, and the crate supports 5.0).
    ///
    /// Choose `n` below the replica count: with `n` equal to it, a replica's crash or a
    /// failover (which makes one of them the primary) leaves too few to acknowledge, and every
    /// acquisition fails until one returns. After a graceful failover the other replicas need a
    /// full sync, which Redis 7 delays 5 s by default: set `repl-diskless-sync-delay 0` on the
    /// data nodes. [`Store::check`](crate::Store::check) warns when `n` replicas are not
    /// connected now, or when `n` leaves none to spare.
    ///
    /// `WAIT` holds back every command sent after it on the same connection until it answers.
    /// Under 64 tasks on one multiplexed connection, lock/release cycles run at about a quarter
    /// of the rate without it, and other calls on that connection wait for the `WAIT`s ahead of
    /// them (`benches/README.md`): give a replicated store a connection of its own. A
    /// `SentinelConnection` does so by itself: each `WAIT`
    /// pipeline runs on a spare connection of its own, and the response timeout of each is the
    /// store's timeout.
    pub fn wait_for_replicas(mut self, n: u32, timeout: Duration) -> Self {
        self.replicas = (n > 0).then_some(Replicas { wanted: n, timeout });
        self
    }

    /// Release notifications for a store made by [`new`](Self::new) on a connection you built:
    /// wakes this process's bounded waiters as soon as a lock they wait for is released in
    /// another process, through one subscriber connection made from `client` (started on first
    /// use, and restarted by itself after Redis restarts), and carries write intents between
    /// processes. Without it, waiters find releases elsewhere by polling. The four constructors
    /// set it up themselves.
    ///
    /// On a Redis Cluster, `client` may name any node: the cluster bus forwards every plain
    /// `PUBLISH` to all nodes (`connect_cluster` uses sharded
    /// channels instead where every master runs Redis 7.0).
    ///
    /// Every release publishes on its lock's channel (the lock's key without its role suffix),
    /// whether or not anyone subscribes.
    pub fn notifications(mut self, client: redis::Client) -> Self {
        self.notifier = Some(notify::Notifier::new(notify::Subscriber::Plain(client)));
        self.sharded = false;
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

    /// Sets the timeout of every call (default 1 s). A call that takes longer fails with
    /// [`Error::Timeout`], so an unreachable Redis turns into a prompt error, never a hang. The
    /// store keeps this timeout with one coarse timer shared by its calls, so a call fails
    /// after the timeout and within a sixteenth of it more (at most 50 ms more).
    ///
    /// redis-rs connections also have a response timeout of their own (500 ms by default in
    /// redis-rs 1.x, set on the client's connection config). On a `MultiplexedConnection` the
    /// store sets its own clone's to `timeout`; on other connections, whichever is shorter fires
    /// first, and redis-rs's arrives as [`Error::Redis`]. Either way the layer answers `503`.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        // The store's own timer keeps this timeout, over however many round trips a call makes
        // and whatever else the connection waits for.
        self.bound = Bound::Own;
        self.timer = coarse_timer::CoarseTimer::new(timeout);
        if let Some(conn) = multiplexed(&mut self.conn) {
            conn.set_response_timeout(timeout);
        }
        #[cfg(feature = "sentinel")]
        if let Some(conn) = (&self.conn as &dyn std::any::Any).downcast_ref::<SentinelConnection>()
        {
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

fn acquisition(reply: redis::Value, lock: LockRef<'_>) -> Result<Acquisition> {
    // One integer (see `acquire.lua`): a fence, or -3 - the blocking key's `PTTL`.
    let answer: i64 =
        redis::from_redis_value(reply).map_err(|e| Error::UnexpectedReply(e.to_string()))?;
    Ok(match answer {
        fence @ 0.. => Acquisition::Acquired {
            fence: lock.fenced.then_some(fence as u64),
        },
        refused => Acquisition::Busy {
            retry_after: busy_for((-3i64).saturating_sub(refused), lock),
        },
    })
}

/// How long a name whose blocking key has `pttl` left is busy. A key someone set without
/// expiry (`PTTL` -1) is busy for the lock's TTL, as if just taken: "retry now" would make
/// every wait on it a busy loop, and "never" is not ours to say. -2 (the key went away in
/// between) is "retry now".
fn busy_for(pttl: i64, lock: LockRef<'_>) -> Duration {
    match pttl {
        -1 => lock.ttl,
        pttl => Duration::from_millis(pttl.max(0) as u64),
    }
}

impl<C> RedisStore<C> {
    /// How long a waiter's mark of a lock lives (`:waited`, see `KeyRole::RwLockWaited`): past
    /// the waiter's next attempt, which renews it while it is refused. A watched waiter tries
    /// again within 1 s of its last refusal, and each call reaches the server within the
    /// store's timeout; a mark that outlives its waiter costs only a few publishes nobody hears.
    pub(in crate::store::redis) fn mark_ms(&self) -> u64 {
        2_000 + 2 * self.timeout.as_millis() as u64
    }
}

fn answered_one(reply: redis::Value) -> Result<bool> {
    let n: i64 =
        redis::from_redis_value(reply).map_err(|e| Error::UnexpectedReply(e.to_string()))?;
    Ok(n == 1)
}

impl<C> From<RedisStore<C>> for crate::Store
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn from(store: RedisStore<C>) -> Self {
        // The store keeps its timeout itself, with its own coarse timer.
        crate::Store::new(store, false)
    }
}
