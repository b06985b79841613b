//! [`Store`]: the handle applications hold, on a [`Backend`] with what the process keeps beside
//! it (the waiting rooms, the heartbeat, the notifications' hub, the timeout of its calls).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::ghosts::Ghosts;
use super::memory::MemoryStore;
use super::watch::Watch;
use crate::backend::{Backend, Hub, Intents, LeaseRef, Mode, Warning};
use crate::coarse_timer::CoarseTimer;
use crate::store::heartbeat::Heartbeat;
use crate::store::rooms::WaitRooms;
use crate::{Error, Result};

/// A cheap, cloneable handle on a lease store.
///
/// Made by [`Store::memory`], from a `RedisStore` (feature `redis`: `RedisStore::connect` and its
/// kin, then `.into()`), or by [`Store::from_backend`] on any [`Backend`].
///
/// ```
/// use tower_lease::Store;
///
/// let store = Store::memory();
/// let same_store = store.clone();
/// ```
#[derive(Clone)]
pub struct Store {
    pub(super) backend: Arc<dyn Backend>,
    /// This process's waiters for locks in this store.
    waits: Arc<WaitRooms>,
    /// What the backend hears of other processes, handed to this process's waiters and shared
    /// reads; and the write intents of this process's own writers.
    hub: Arc<Hub>,
    /// Whether the backend delivers notifications to the hub.
    notified: bool,
    /// Whether those include the releases nobody was refused for
    /// ([`Backend::announces_every_release`]).
    every_release: bool,
    /// Whether they include this store's own releases
    /// ([`Backend::delivers_own_releases`]).
    own_releases: bool,
    /// The one heartbeat of the leases held in this store, shared by every layer and every
    /// [`Held`](crate::Held) of the process.
    heartbeat: Heartbeat,
    /// What failed calls may still take, given back once the store answers again.
    pub(super) ghosts: Ghosts,
    /// The backend's timeout, and the timer that keeps it for every call; no timer for the
    /// built-in stores, which keep it themselves (Redis) or never wait (memory).
    pub(super) timeout: Duration,
    pub(super) timer: Option<Arc<CoarseTimer>>,
}

impl Store {
    /// A store in this process's memory, with the same semantics as Redis.
    ///
    /// It only coordinates tasks of one process: use it for tests, for single-replica
    /// deployments, and to run the examples without Redis. It keeps time with
    /// [`tokio::time::Instant`], so tests can pause and advance time.
    pub fn memory() -> Self {
        Self::new(MemoryStore::new(), false)
    }

    /// A store on any [`Backend`].
    ///
    /// Every call of the locks, the layers and the heartbeat on it is bounded by the backend's
    /// [`timeout`](Backend::timeout); when the backend delivers notifications
    /// ([`Backend::notify_to`], called here), waiters and shared reads act on what it
    /// delivers. Called within a tokio runtime when the backend spawns a listening task here.
    pub fn from_backend(backend: impl Backend) -> Self {
        Self::new(backend, true)
    }

    /// A store on `backend`; `bound`: whether the handle keeps the backend's timeout for each
    /// call (a built-in store that keeps it itself does not need it kept twice).
    pub(crate) fn new(backend: impl Backend, bound: bool) -> Self {
        let hub = Arc::new(Hub::default());
        let notified = backend.notify_to(hub.sink());
        let timeout = backend.timeout();
        let every_release = backend.announces_every_release();
        let own_releases = backend.delivers_own_releases();
        Self {
            backend: Arc::new(backend),
            waits: Arc::default(),
            hub,
            notified,
            every_release,
            own_releases,
            heartbeat: Heartbeat::default(),
            ghosts: Ghosts::default(),
            timeout,
            timer: bound.then(|| CoarseTimer::new(timeout)),
        }
    }

    /// The write intents this process hears of.
    pub(crate) fn intents(&self) -> &Arc<Intents> {
        &self.hub.intents
    }

    /// Whether the backend delivers notifications (its [`notify_to`](Backend::notify_to)
    /// answered `true`): waiters then wake on the releases it delivers, and shared reads stop
    /// taking new readers on the write intents it delivers, instead of polling (a `RedisStore`
    /// made by `RedisStore::new` has none; one made by `RedisStore::connect` has them).
    pub fn has_notifications(&self) -> bool {
        self.notified
    }

    /// Whether the notifications include the releases nobody was refused for, this process's
    /// own among them.
    pub(crate) fn announces_every_release(&self) -> bool {
        self.every_release
    }

    /// Whether the notifications include this store's own releases, which wake this
    /// process's waiters directly too.
    pub(crate) fn delivers_own_releases(&self) -> bool {
        self.own_releases
    }

    /// The longest one call may take.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Watches the releases of the lock of `mode` on `name` in `namespace`; `None` when the
    /// backend delivers none, or could not watch it within its timeout or by `deadline`.
    pub(crate) async fn watch(
        &self,
        mode: Mode,
        namespace: &str,
        name: &[u8],
        deadline: Instant,
    ) -> Option<Watch> {
        if !self.notified {
            return None;
        }
        let key = Hub::key(mode, namespace, name);
        let (mut releases, first) = self.hub.enter(&key);
        if !first {
            // A release heard here between this waiter's last attempt and now reached only the
            // watchers before it: its first wait ends at once, for one more attempt (the first
            // watcher makes that attempt after subscribing, see `Watch::subscribed_now`).
            releases.mark_changed();
        }
        let watch = Watch {
            backend: self.backend.clone(),
            hub: self.hub.clone(),
            key,
            mode,
            namespace: namespace.into(),
            name: name.into(),
            releases,
            first,
        };
        if !first {
            return Some(watch);
        }
        let deadline = deadline.min(Instant::now() + self.timeout);
        let watching = self.backend.watch(mode, namespace, name);
        match tokio::time::timeout_at(deadline, watching).await {
            Ok(Ok(())) => Some(watch),
            Ok(Err(error)) => {
                tracing::debug!(%error, "watching for releases failed; polling");
                None
            }
            Err(_) => {
                tracing::debug!("watching for releases timed out; polling");
                None
            }
        }
    }

    /// This process's waiters for locks in this store.
    pub(crate) fn wait_rooms(&self) -> &Arc<WaitRooms> {
        &self.waits
    }

    /// Gives back, in the background, what the call on `lease` that failed with `error` may
    /// still take when the store gets to it: see [`Ghosts`].
    pub(crate) fn give_back(&self, lease: LeaseRef<'_>, error: &Error) {
        self.ghosts.give_back(self, lease, error);
    }

    /// The heartbeat of the leases held in this store.
    pub(crate) fn heartbeat(&self) -> &Heartbeat {
        &self.heartbeat
    }

    /// The backend behind this handle. Calls made on it directly are the backend's alone: not
    /// bounded by its timeout, nor given back when they fail.
    pub fn backend(&self) -> &dyn Backend {
        &*self.backend
    }

    /// Checks the store's setup for what can break the locks' guarantees, or slow them: for
    /// Redis, a server older than 5.0, a `maxmemory-policy` that can evict lock keys (on every
    /// primary of a cluster), fewer replicas than `wait_for_replicas` needs, and a store made
    /// by `RedisStore::new` without release notifications. Call it once at startup and report
    /// what it finds; it logs nothing itself.
    ///
    /// ```
    /// # async fn startup(store: tower_lease::Store) -> Result<(), tower_lease::Error> {
    /// for warning in store.check().await? {
    ///     eprintln!("lock store: {warning}");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn check(&self) -> Result<Vec<Warning>> {
        self.backend.check().await
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}
