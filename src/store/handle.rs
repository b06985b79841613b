//! [`Store`]: the handle applications hold, on a [`Backend`] with what the process keeps beside
//! it (the waiting rooms, the heartbeat, the release notifications).

use std::fmt;
use std::sync::Arc;

use super::ghosts::Ghosts;
use super::intents::Intents;
use super::memory::MemoryStore;
use super::notifications::Notifications;
use crate::backend::{Backend, LeaseRef, Mode, Warning};
use crate::lease::heartbeat::Heartbeat;
use crate::wait::rooms::WaitRooms;
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
    backend: Arc<dyn Backend>,
    /// This process's waiters for locks in this store.
    waits: Arc<WaitRooms>,
    /// Release notifications from the store, when it publishes them.
    notifications: Option<Notifications>,
    /// The one heartbeat of the leases held in this store, shared by every layer and every
    /// [`Held`](crate::Held) of the process.
    heartbeat: Heartbeat,
    /// The write intents this process hears of, for the layer's shared reads.
    intents: Arc<Intents>,
    /// What failed calls may still take, given back once the store answers again.
    ghosts: Ghosts,
}

impl Store {
    /// A store in this process's memory, with the same semantics as Redis.
    ///
    /// It only coordinates tasks of one process: use it for tests, for single-replica
    /// deployments, and to run the examples without Redis. It keeps time with
    /// [`tokio::time::Instant`], so tests can pause and advance time.
    pub fn memory() -> Self {
        Self::from_backend(MemoryStore::new())
    }

    /// A store on any [`Backend`].
    pub fn from_backend(backend: impl Backend) -> Self {
        Self {
            backend: Arc::new(backend),
            waits: Arc::default(),
            notifications: None,
            heartbeat: Heartbeat::default(),
            intents: Arc::default(),
            ghosts: Ghosts::default(),
        }
    }

    /// This store, with release notifications for its waiters.
    #[cfg(feature = "redis")]
    pub(crate) fn with_notifications(mut self, notifications: Option<Notifications>) -> Self {
        if let Some(notifications) = &notifications {
            // The notifier raises the intents it hears of from other processes.
            self.intents = notifications.notifier.intents().clone();
        }
        self.notifications = notifications;
        self
    }

    /// The write intents this process hears of.
    pub(crate) fn intents(&self) -> &Arc<Intents> {
        &self.intents
    }

    /// The key of the intents on `name` in [`intents`](Self::intents): the lock's channel when
    /// the store has notifications (where the notifier hears them), the namespace and the name
    /// otherwise.
    pub(crate) fn intent_key(&self, namespace: &str, name: &[u8]) -> Vec<u8> {
        match &self.notifications {
            Some(n) => n.channel(Mode::Write, namespace, name),
            None => [
                &(namespace.len() as u64).to_be_bytes(),
                namespace.as_bytes(),
                name,
            ]
            .concat(),
        }
    }

    /// The store's release notifications, if it has them.
    pub(crate) fn notifications(&self) -> Option<&Notifications> {
        self.notifications.as_ref()
    }

    /// This process's waiters for locks in this store.
    pub(crate) fn wait_rooms(&self) -> &Arc<WaitRooms> {
        &self.waits
    }

    /// Gives back, in the background, what the call on `lease` that failed with `error` may
    /// still take when the store gets to it: see [`Ghosts`].
    pub(crate) fn give_back(&self, lease: LeaseRef<'_>, error: &Error) {
        self.ghosts.give_back(&self.backend, lease, error);
    }

    /// The heartbeat of the leases held in this store.
    pub(crate) fn heartbeat(&self) -> &Heartbeat {
        &self.heartbeat
    }

    /// The backend behind this handle.
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
