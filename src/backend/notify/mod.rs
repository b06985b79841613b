//! [`NotificationSink`]: where a backend delivers what it hears of other processes (releases,
//! write intents), and the [`Hub`] behind it, which hands each to this process's waiters and
//! shared reads.
//!
//! A waiter watches a lock through the [`Store`](crate::Store) handle: the first watcher of a
//! lock in a process makes the handle ask the backend to [`watch`](super::Backend::watch) it
//! (a Redis store subscribes to its channel; a backend that hears everything does nothing),
//! and the last one to leave makes it [`unwatch`](super::Backend::unwatch). Whatever the
//! backend hears, it hands to the sink, which wakes the lock's watcher here.

mod intents;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::watch;

pub(crate) use self::intents::{IntentListener, Intents};
use super::Mode;

/// Where a [`Backend`](super::Backend) delivers the releases and write intents it hears of,
/// so that waiters and shared reads in this process act on them at once, not at their next
/// poll or heartbeat.
///
/// A backend is handed one by [`Backend::notify_to`](super::Backend::notify_to), once, when a
/// [`Store`](crate::Store) is made on it. Cheap to clone, and `Send`: hand it to the task that
/// listens (a subscriber connection, a `LISTEN`ing session), which should stop once
/// [`is_closed`](Self::is_closed) says the store is gone.
///
/// Each call is cheap when nobody in this process waits for the lock it names, so a backend
/// may deliver everything it hears; one that can listen to single locks learns which to
/// listen to from [`Backend::watch`](super::Backend::watch).
#[derive(Clone)]
pub struct NotificationSink {
    hub: Weak<Hub>,
}

impl NotificationSink {
    /// A lease of the lock of `mode` (any mode of an [`RwLock`](crate::RwLock) names the same
    /// lock) on `name` in `namespace` ended, or a write intent on it was withdrawn: something
    /// a waiter may now take. This process's waiter of the lock tries again.
    ///
    /// Deliver it for every release that frees a lease (a release, a withdrawn write intent,
    /// a completed or freed idempotency reservation, [`Mode::Reservation`]), whichever
    /// process made it, this one included.
    pub fn released(&self, mode: Mode, namespace: &str, name: &[u8]) {
        if let Some(hub) = self.hub.upgrade() {
            hub.wake(&Hub::key(mode, namespace, name));
        }
    }

    /// A write attempt on the [intent-leaving](crate::Fairness::leaves_write_intent) `RwLock` on
    /// `name` in `namespace` was refused by readers and left its write intent: this process's
    /// shared reads of it stop taking new readers, so the writer gets in once the reads in
    /// flight end.
    pub fn write_intent(&self, namespace: &str, name: &[u8]) {
        if let Some(hub) = self.hub.upgrade() {
            hub.intents.raise(&Hub::key(Mode::Write, namespace, name));
        }
    }

    /// The backend may have missed notifications (its listening connection was lost, its
    /// queue overflowed): every waiter of this process tries again, since a release may have
    /// gone unheard.
    pub fn missed(&self) {
        if let Some(hub) = self.hub.upgrade() {
            hub.wake_all();
        }
    }

    /// Whether every [`Store`](crate::Store) handle on the backend is gone: nothing delivered
    /// reaches anyone any more, and a listening task can stop.
    pub fn is_closed(&self) -> bool {
        self.hub.strong_count() == 0
    }
}

impl fmt::Debug for NotificationSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NotificationSink")
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// What one store's handles share of notifications: the watched locks of this process, each
/// with the channel its watchers hear releases on, and the write intents its shares listen for.
///
/// Every watcher of a lock hears every release of it: the waiters of one lock in one process
/// may want different things (an `RwLock`'s waiting readers and its waiting writer, each
/// retry of an idempotency key), and a release that woke only one of them would leave the
/// others to their polls. Each watcher keeps its own receiver, so a release that comes while
/// it is busy with an attempt wakes it when it next waits.
#[derive(Default)]
pub(crate) struct Hub {
    watches: Mutex<HashMap<Vec<u8>, watch::Sender<()>>>,
    /// How many locks are watched: a sink call for an unwatched lock costs no lock of the map
    /// while nobody watches anything.
    watched: AtomicUsize,
    pub(crate) intents: Arc<Intents>,
}

impl Hub {
    /// A sink that delivers to this hub.
    pub(crate) fn sink(self: &Arc<Self>) -> NotificationSink {
        NotificationSink {
            hub: Arc::downgrade(self),
        }
    }

    /// The key of the lock of `mode` on `name` in `namespace`: locks of different kinds never
    /// share one, and an `RwLock`'s readers and writer do.
    pub(crate) fn key(mode: Mode, namespace: &str, name: &[u8]) -> Vec<u8> {
        let kind = match mode {
            Mode::Exclusive => b'l',
            Mode::Read | Mode::Write => b'r',
            Mode::Permit => b'p',
            Mode::Reservation => b'i',
        };
        let mut key = Vec::with_capacity(2 + namespace.len() + name.len());
        key.push(kind);
        // A namespace is at most a few dozen printable bytes; its length ends where it ends.
        key.push(namespace.len() as u8);
        key.extend_from_slice(namespace.as_bytes());
        key.extend_from_slice(name);
        key
    }

    fn watches(&self) -> MutexGuard<'_, HashMap<Vec<u8>, watch::Sender<()>>> {
        self.watches.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A watcher of `key` arrives: its receiver of the lock's releases (those from now on),
    /// and whether it is the first watcher of the lock in this process (which must ask the
    /// backend to watch it).
    pub(crate) fn enter(&self, key: &[u8]) -> (watch::Receiver<()>, bool) {
        let mut watches = self.watches();
        if let Some(releases) = watches.get(key) {
            return (releases.subscribe(), false);
        }
        let (releases, receiver) = watch::channel(());
        watches.insert(key.to_vec(), releases);
        self.watched.fetch_add(1, Ordering::Release);
        (receiver, true)
    }

    /// A watcher of `key` leaves (its receiver still alive); `true` when it was the last one,
    /// and the backend may stop watching the lock.
    pub(crate) fn leave(&self, key: &[u8]) -> bool {
        let mut watches = self.watches();
        // The leaving watcher's own receiver is the one left: nobody else here watches.
        if watches
            .get(key)
            .is_some_and(|releases| releases.receiver_count() > 1)
        {
            return false;
        }
        if watches.remove(key).is_some() {
            self.watched.fetch_sub(1, Ordering::Release);
        }
        true
    }

    fn wake(&self, key: &[u8]) {
        if self.watched.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Some(releases) = self.watches().get(key) {
            releases.send_replace(());
        }
    }

    fn wake_all(&self) {
        self.watches().values().for_each(|releases| {
            releases.send_replace(());
        });
    }
}

impl fmt::Debug for Hub {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hub")
            .field("watched", &self.watched.load(Ordering::Relaxed))
            .field("intents", &self.intents)
            .finish()
    }
}
