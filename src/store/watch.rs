//! [`Watch`]: a waiter's watch on one lock, through which the releases the store's backend
//! hears of (in this process or any other) wake it.
//!
//! Made by [`Store::watch`](super::Store::watch) on a store whose backend delivers
//! notifications ([`Backend::notify_to`]); the first watch of a lock in this process asks
//! the backend to [`watch`](Backend::watch) it, and the drop of the last one to
//! [`unwatch`](Backend::unwatch) it.

use std::sync::Arc;

use tokio::sync::watch;

use crate::backend::{Backend, Hub, Mode};

/// A waiter's watch on the releases of one lock; dropped, it stops watching.
pub(crate) struct Watch {
    pub(super) backend: Arc<dyn Backend>,
    pub(super) hub: Arc<Hub>,
    pub(super) key: Vec<u8>,
    pub(super) mode: Mode,
    pub(super) namespace: Box<str>,
    pub(super) name: Box<[u8]>,
    /// This watcher's own news of the lock's releases.
    pub(super) releases: watch::Receiver<()>,
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

    /// Counts every release delivered so far as heard: called just before an attempt, which
    /// sees what those releases freed (each was delivered after it happened, and so before the
    /// attempt is sent), so they wake nobody after it.
    pub(crate) fn heard(&mut self) {
        self.releases.mark_unchanged();
    }

    /// Resolves at the next release delivered for the lock (one delivered since the last one
    /// this resolved for, or since the watch began, counts at once), or when the backend may
    /// have missed some. Every watcher of the lock in this process hears each release.
    pub(crate) async fn released(&mut self) {
        if self.releases.changed().await.is_err() {
            // The hub let go of the lock's channel, which it does only once no watcher is
            // left: never while this one lives. Polling remains.
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if self.hub.leave(&self.key) {
            self.backend.unwatch(self.mode, &self.namespace, &self.name);
        }
    }
}
