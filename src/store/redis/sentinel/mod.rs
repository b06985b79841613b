//! [`SentinelConnection`]: a multiplexed connection to the primary that Redis Sentinel names,
//! which follows a failover as soon as the sentinels announce it.
//!
//! # Lifecycle
//!
//! - **Starts** in [`SentinelConnection::connect`]: it asks the sentinels for the primary
//!   (`follow.rs`), and spawns one task per sentinel listening for the events of a failover,
//!   and one that asks the sentinels again when told to.
//! - **Asks again** when a sentinel announces a switch, and when a call answers `READONLY`,
//!   times out (or is dropped unanswered, as the store's timeout drops it) or gets fewer
//!   replicas from `WAIT` than it asked for. Those rechecks run in the background, at most one
//!   at a time; a connection found dropped or refused is forgotten at once, and the next call
//!   asks the sentinels itself.
//! - **Stops** when its last clone is dropped: the shared state owns the tasks' cancellation.

mod follow;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, Pipeline, RedisFuture};
use redis::{IntoConnectionInfo, RedisResult, Value};
use tokio::sync::{Notify, watch};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::store::redis::DEFAULT_TIMEOUT;
use crate::store::redis::RedisStore;
use crate::store::redis::connection::timeout::connection_lost;

use crate::Result;

/// How many spare connections for `WAIT` pipelines are kept between calls.
const SPARE_WAIT_CONNECTIONS: usize = 64;
/// The least time between two background rechecks: a replica that stays behind must not turn
/// every call into a round of questions to the sentinels.
const RECHECK_SPACING: Duration = Duration::from_millis(50);

/// A connection to the primary of one Sentinel-monitored master, for [`RedisStore`].
///
/// It asks every sentinel for the primary, takes the newest configuration they report (by its
/// epoch) whose node answers `ROLE` as a primary, and asks again:
///
/// - when a sentinel announces a failover (`+switch-master`, and the leader's
///   `+failover-state-reconf-slaves`, from which on it names the promoted replica: it listens
///   on all of them, and subscribes again to one that went away), so a graceful
///   `SENTINEL FAILOVER` is followed at once, not when Redis demotes the old primary ~10 s
///   later;
/// - when a call answers `READONLY`, times out, or `WAIT` answers fewer replicas than it asked
///   for ([`Error::NotReplicated`](crate::Error::NotReplicated));
/// - when its connection is found dropped or refused (the store sends such a call once more at
///   once, so the first call after a promotion reaches the new primary).
///
/// Calls during a failover itself fail: a `kill -9` of the primary costs the sentinels'
/// `down-after-milliseconds` and the promotion.
///
/// A pipeline that ends with `WAIT` (a store's [`wait_for_replicas`](RedisStore::wait_for_replicas))
/// runs on a connection of its own, taken from a pool of spare ones to the same primary:
/// `WAIT` holds back every command after it on its connection, and there it holds back none
/// of the other calls. The response timeout of every connection is the store's timeout
/// (1 s, or what [`RedisStore::timeout`] sets).
///
/// Clones share the connections.
#[derive(Clone)]
pub struct SentinelConnection {
    shared: Arc<Shared>,
    /// The connection this clone uses, and the generation it was taken at.
    cached: Option<(u64, MultiplexedConnection)>,
}

struct Shared {
    master: String,
    sentinels: Vec<ConnectionInfo>,
    config: AsyncConnectionConfig,
    /// The store's timeout, in ms: every call's response timeout.
    response_timeout: AtomicU64,
    /// Serialises asking the sentinels: the callers that waited find the connection it made.
    resolving: tokio::sync::Mutex<()>,
    current: Mutex<Current>,
    /// The address of the primary, for the subscriber of release notifications to follow.
    primary: watch::Sender<Option<ConnectionInfo>>,
    /// Asks the background task to ask the sentinels again.
    recheck: Arc<Notify>,
    _tasks: DropGuard,
}

#[derive(Default)]
struct Current {
    /// How many connections were made; a call's error drops the connection only if it is
    /// still the one of the generation the call used.
    generation: u64,
    conn: Option<MultiplexedConnection>,
    addr: Option<ConnectionAddr>,
    /// The newest configuration epoch a sentinel named our primary with.
    epoch: u64,
    /// Spare connections to the primary for `WAIT` pipelines.
    spare: Vec<MultiplexedConnection>,
}

impl fmt::Debug for SentinelConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let current = self.shared.current();
        f.debug_struct("SentinelConnection")
            .field("master", &self.shared.master)
            .field("generation", &current.generation)
            .field("primary", &current.addr)
            .field("epoch", &current.epoch)
            .finish()
    }
}

impl Shared {
    fn current(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes `found` the primary, unless it is the one we are connected to already.
    fn install(&self, found: follow::Found) -> (u64, MultiplexedConnection) {
        let mut current = self.current();
        current.epoch = current.epoch.max(found.epoch);
        if let Some(conn) = &current.conn
            && current.addr.as_ref() == Some(&found.addr)
        {
            return (current.generation, conn.clone());
        }
        let moved = current.addr.as_ref() != Some(&found.addr);
        current.generation += 1;
        current.conn = Some(found.conn.clone());
        current.spare.clear();
        current.addr = Some(found.addr.clone());
        let generation = current.generation;
        drop(current);
        if moved {
            tracing::info!(primary = ?found.addr, "following the primary the sentinels name");
            let info = found.addr.into_connection_info().ok();
            self.primary.send_replace(info);
        }
        (generation, found.conn)
    }

    /// Asks the sentinels again, in the background.
    fn recheck(&self) {
        self.recheck.notify_one();
    }
}

/// Asks the sentinels again whenever told to, at most one at a time; a recheck moves only to
/// a configuration no older than the one we follow, so a sentinel that missed a failover
/// cannot move us back to the old primary.
async fn rechecks(shared: Weak<Shared>, recheck: Arc<Notify>) {
    loop {
        recheck.notified().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let resolving = shared.resolving.lock().await;
        let epoch = shared.current().epoch;
        match follow::primary(&shared.sentinels, &shared.master, &shared.config, epoch).await {
            Ok(found) => {
                shared.install(found);
            }
            Err(error) => tracing::debug!(%error, "asking the sentinels again failed"),
        }
        drop(resolving);
        // Not held while waiting: the last clone's drop must end the tasks.
        drop(shared);
        tokio::time::sleep(RECHECK_SPACING).await;
    }
}

impl SentinelConnection {
    /// Connects to the primary of `master_name` that the sentinels at `sentinel_urls` name,
    /// and starts following it. Fails when no sentinel names a primary that answers now.
    pub async fn connect<T>(
        master_name: &str,
        sentinel_urls: impl IntoIterator<Item = T>,
    ) -> RedisResult<Self>
    where
        T: IntoConnectionInfo,
    {
        let sentinels = sentinel_urls
            .into_iter()
            .map(IntoConnectionInfo::into_connection_info)
            .collect::<RedisResult<Vec<_>>>()?;
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(Some(DEFAULT_TIMEOUT))
            .set_connection_timeout(Some(DEFAULT_TIMEOUT));
        let found = follow::primary(&sentinels, master_name, &config, 0).await?;
        let cancel = CancellationToken::new();
        let shared = Arc::new(Shared {
            master: master_name.to_owned(),
            sentinels,
            config,
            response_timeout: AtomicU64::new(DEFAULT_TIMEOUT.as_millis() as u64),
            resolving: tokio::sync::Mutex::new(()),
            current: Mutex::default(),
            primary: watch::Sender::new(None),
            recheck: Arc::new(Notify::new()),
            _tasks: cancel.clone().drop_guard(),
        });
        let cached = Some(shared.install(found));
        let weak = Arc::downgrade(&shared);
        let rechecking = rechecks(weak.clone(), shared.recheck.clone());
        tokio::spawn(cancel.clone().run_until_cancelled_owned(rechecking));
        for sentinel in shared.sentinels.clone() {
            let weak = weak.clone();
            let switched = move || {
                if let Some(shared) = weak.upgrade() {
                    shared.recheck();
                }
            };
            let listen = follow::listen(sentinel, shared.master.clone(), switched);
            tokio::spawn(cancel.clone().run_until_cancelled_owned(listen));
        }
        Ok(SentinelConnection { shared, cached })
    }

    /// The primary's address, now and after every failover this connection follows.
    pub(in crate::store::redis) fn primaries(&self) -> watch::Receiver<Option<ConnectionInfo>> {
        self.shared.primary.subscribe()
    }

    /// Sets the response timeout of every call: the store's timeout.
    pub(in crate::store::redis) fn set_response_timeout(&self, timeout: Duration) {
        let ms = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        self.shared.response_timeout.store(ms, Ordering::Relaxed);
    }

    fn response_timeout(&self) -> Duration {
        Duration::from_millis(self.shared.response_timeout.load(Ordering::Relaxed))
    }

    /// The live connection, asking the sentinels for the primary first if there is none.
    async fn connection(&mut self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(cached) = self.live() {
            return Ok(cached);
        }
        let shared = self.shared.clone();
        let _resolving = shared.resolving.lock().await;
        if let Some(cached) = self.live() {
            return Ok(cached);
        }
        // Any epoch: with no primary at all, a sentinel's older answer beats none.
        let found = follow::primary(&shared.sentinels, &shared.master, &shared.config, 0).await?;
        let (generation, conn) = shared.install(found);
        self.cached = Some((generation, conn.clone()));
        Ok((generation, conn))
    }

    /// The shared live connection, refreshed into this clone's cache.
    fn live(&mut self) -> Option<(u64, MultiplexedConnection)> {
        let current = self.shared.current();
        let conn = current.conn.as_ref()?;
        match &self.cached {
            Some((generation, _)) if *generation == current.generation => {}
            _ => self.cached = Some((current.generation, conn.clone())),
        }
        self.cached.clone()
    }

    /// A connection of its own for a `WAIT` pipeline: a spare one, or a new one to the primary.
    async fn wait_connection(&mut self) -> RedisResult<(u64, MultiplexedConnection)> {
        let (generation, _) = self.connection().await?;
        let addr = {
            let mut current = self.shared.current();
            if current.generation == generation
                && let Some(conn) = current.spare.pop()
            {
                return Ok((generation, conn));
            }
            current.addr.clone()
        };
        let Some(addr) = addr else {
            return self.connection().await;
        };
        Ok((
            generation,
            follow::connect(&addr, &self.shared.config).await?,
        ))
    }

    /// Keeps `conn` for the next `WAIT` pipeline, if it still reaches the primary.
    fn spare(&self, generation: u64, conn: MultiplexedConnection) {
        let mut current = self.shared.current();
        if current.generation == generation && current.spare.len() < SPARE_WAIT_CONNECTIONS {
            current.spare.push(conn);
        }
    }

    /// After a call on the connection of `generation`: drops it when `error` says it no longer
    /// reaches the primary (the next call asks the sentinels), and asks them again in the
    /// background when the call timed out or `WAIT` fell short.
    fn after(&mut self, generation: u64, error: Option<&redis::RedisError>, short: bool) {
        if short || error.is_some_and(redis::RedisError::is_timeout) {
            self.shared.recheck();
        }
        let stale = error
            .is_some_and(|e| connection_lost(e) || e.kind() == redis::ErrorKind::Server(READ_ONLY));
        if !stale {
            return;
        }
        self.shared.recheck();
        self.cached = None;
        let mut current = self.shared.current();
        if current.generation == generation {
            current.conn = None;
            current.spare.clear();
        }
    }
}

/// Asks the sentinels again when dropped armed: a call the store's timeout gave up on.
struct Unanswered<'a>(Option<&'a Shared>);

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        if let Some(shared) = self.0 {
            shared.recheck();
        }
    }
}

const READ_ONLY: redis::ServerErrorKind = redis::ServerErrorKind::ReadOnly;

/// The first `READONLY` among a pipeline's replies, as an error.
fn read_only(replies: &[Value]) -> Option<redis::RedisError> {
    replies.iter().find_map(|reply| match reply {
        Value::ServerError(e) if e.kind() == Some(READ_ONLY) => Some(e.clone().into()),
        _ => None,
    })
}

/// How many replicas the pipeline's last command asks for, if it is a `WAIT`.
fn waits_for(pipeline: &Pipeline) -> Option<i64> {
    let mut args = pipeline.cmd_iter().last()?.args_iter();
    let redis::Arg::Simple(name) = args.next()? else {
        return None;
    };
    if !name.eq_ignore_ascii_case(b"WAIT") {
        return None;
    }
    let redis::Arg::Simple(n) = args.next()? else {
        return None;
    };
    std::str::from_utf8(n).ok()?.parse().ok()
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut conn) = self.connection().await?;
            conn.set_response_timeout(self.response_timeout());
            let mut unanswered = Unanswered(Some(&*self.shared));
            let reply = conn.req_packed_command(cmd).await;
            unanswered.0 = None;
            drop(unanswered);
            let error = match &reply {
                Err(e) => Some(e.clone()),
                Ok(reply) => read_only(std::slice::from_ref(reply)),
            };
            self.after(generation, error.as_ref(), false);
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let wanted = waits_for(pipeline);
            let (generation, mut conn) = match wanted {
                Some(_) => self.wait_connection().await?,
                None => self.connection().await?,
            };
            conn.set_response_timeout(self.response_timeout());
            let mut unanswered = Unanswered(Some(&*self.shared));
            let reply = conn.req_packed_commands(pipeline, offset, count).await;
            unanswered.0 = None;
            drop(unanswered);
            let (error, short) = match &reply {
                Err(e) => (Some(e.clone()), false),
                Ok(replies) => {
                    let short = match (wanted, replies.last()) {
                        (Some(wanted), Some(Value::Int(acked))) => *acked < wanted,
                        _ => false,
                    };
                    (read_only(replies), short)
                }
            };
            if wanted.is_some() && error.is_none() {
                self.spare(generation, conn);
            }
            self.after(generation, error.as_ref(), short);
            reply
        })
    }

    fn get_db(&self) -> i64 {
        self.cached.as_ref().map_or(0, |(_, conn)| conn.get_db())
    }
}

impl RedisStore<SentinelConnection> {
    /// Connects to the primary of `master_name` through the Redis Sentinels at `sentinel_urls`
    /// (`redis://host:port`; every one is asked, and listened to for failovers), and follows
    /// failovers: see [`SentinelConnection`]. Fails when no sentinel names a reachable primary
    /// now.
    ///
    /// With [release notifications](Self::notifications) whose subscriber follows the primary
    /// too, so bounded waits and write intents work as on a single Redis. Pair it with
    /// [`wait_for_replicas`](Self::wait_for_replicas), with `n` below the replica count:
    /// without `WAIT`, a failover can lose a lease the old primary had not yet sent on. Its
    /// `WAIT`s run on connections of their own, and every connection's response timeout is
    /// the store's timeout. For writes back within seconds of a graceful failover, run the
    /// data nodes with `repl-diskless-sync-delay 0`: the other replicas then resync with the
    /// promoted one at once, not 5 s later, and `WAIT` can be met again.
    pub async fn connect_sentinel<T>(
        master_name: &str,
        sentinel_urls: impl IntoIterator<Item = T>,
    ) -> Result<Self>
    where
        T: IntoConnectionInfo,
    {
        let conn = SentinelConnection::connect(master_name, sentinel_urls).await?;
        let subscriber =
            crate::store::redis::notify::subscriber::Subscriber::Following(conn.primaries());
        let mut store = Self::new(conn);
        store.notifier = Some(crate::store::redis::notify::Notifier::new(subscriber));
        store.sharded = false;
        // Asked once here, as the other constructors do; a promoted replica that lacks the
        // commands refuses them, and the store falls back to the scripts for good.
        store.probe_native().await;
        Ok(store)
    }
}
