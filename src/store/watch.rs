//! [`Watch`]: a waiter's watch on one lock, through which the releases the store's backend
//! hears of (in this process or any other) wake it.
//!
//! Made by [`Store::watch`](super::Store::watch) on a store whose backend delivers
//! notifications ([`Backend::notify_to`]); the first watch of a lock in this process asks
//! the backend to [`watch`](Backend::watch) it, and the drop of the last one to
//! [`unwatch`](Backend::unwatch) it.

use std::sync::Arc;

use tokio::sync::Notify;
use tokio::sync::futures::Notified;

use crate::backend::{Backend, Hub, Mode};

/// A waiter's watch on the releases of one lock; dropped, it stops watching.
pub(crate) struct Watch {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) hub: Arc<Hub>,
    pub(super) key: Vec<u8>,
    pub(super) mode: Mode,
    pub(super) namespace: Box<str>,
    pub(super) name: Box<[u8]>,
    pub(super) notify: Arc<Notify>,
    /// Whether this watch asked the backend to watch (rather than finding the lock watched in
    /// this process).
    pub(super) first: bool,
}

impl Watch {
    /// Whether this watch made the backend watch the lock, so that a release made just
    /// before that may have gone unheard.
    pub(crate) fn subscribed_now(&self) -> bool {
        self.first
    }

    /// Resolves at the next release delivered for the lock (one delivered since the last call
    /// counts), or when the backend may have missed some.
    pub(crate) fn released(&self) -> Notified<'_> {
        self.notify.notified()
    }

    /// Wakes every other watcher of the lock in this process that waits right now, and
    /// leaves no wake-up behind for later ones: a release wakes one watcher, which is enough
    /// where only one may take the lock, but where each watcher wants the news (every retry of
    /// an idempotency key its response), the one it woke passes it on.
    pub(crate) fn wake_others(&self) {
        self.notify.notify_waiters();
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if self.hub.leave(&self.key, &self.notify) {
            self.backend.unwatch(self.mode, &self.namespace, &self.name);
        }
    }
}
