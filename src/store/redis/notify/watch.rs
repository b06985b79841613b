//! What a [`Store`](crate::Store) holds of a Redis store's release notifications
//! ([`Notifications`]), and the [`Watch`] a waiter holds on one name.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::sync::futures::Notified;

use super::{Notifier, channel};
use crate::backend::Mode;
use crate::store::redis::KeyLayout;

/// A store's release notifications, and how it names their channels.
#[derive(Clone, Debug)]
pub(crate) struct Notifications {
    pub(crate) notifier: Arc<Notifier>,
    pub(crate) layout: KeyLayout,
    /// The store's deadline, which bounds a subscription too.
    pub(crate) timeout: Duration,
}

impl Notifications {
    /// The store's deadline, which bounds a subscription too.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The channel of the releases of `name` in `namespace` (the lock of `mode`).
    pub(crate) fn channel(&self, mode: Mode, namespace: &str, name: &[u8]) -> Vec<u8> {
        channel(&self.layout, mode, namespace, name)
    }

    /// Watches the releases of `name` in `namespace` (the lock of `mode`); `None` when the
    /// subscription failed, or was not confirmed within the store's deadline or by
    /// `deadline` (redis-rs bounds neither a subscriber's connection nor its `SUBSCRIBE`).
    pub(crate) async fn watch(
        &self,
        mode: Mode,
        namespace: &str,
        name: &[u8],
        deadline: tokio::time::Instant,
    ) -> Option<Watch> {
        let channel = self.channel(mode, namespace, name);
        let deadline = deadline.min(tokio::time::Instant::now() + self.timeout);
        let watch = tokio::time::timeout_at(deadline, self.notifier.watch(channel)).await;
        watch.unwrap_or_else(|_| {
            tracing::debug!("subscribing to release notifications timed out; polling");
            None
        })
    }
}

/// A waiter's subscription to the release notifications of one name; dropped, it unsubscribes.
pub(crate) struct Watch {
    pub(super) notifier: Arc<Notifier>,
    pub(super) channel: Vec<u8>,
    pub(super) notify: Arc<Notify>,
    /// Whether this watch subscribed (rather than finding the channel watched in this process).
    pub(super) subscribed_now: bool,
}

impl Watch {
    /// Whether this watch made the subscription, so that a release published just before it
    /// was confirmed may have gone unseen.
    pub(crate) fn subscribed_now(&self) -> bool {
        self.subscribed_now
    }

    /// Resolves at the next release published for the name (one already published since the
    /// last call counts), or when the subscriber connection was lost.
    pub(crate) fn released(&self) -> Notified<'_> {
        self.notify.notified()
    }

    /// Wakes every other watcher of the name in this process that waits right now, and
    /// leaves no wake-up behind for later ones: a message wakes one watcher, which is enough
    /// where only one may take the lock, but where each watcher wants the news (every retry of
    /// an idempotency key its response), the one it woke passes it on.
    pub(crate) fn wake_others(&self) {
        self.notify.notify_waiters();
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        {
            let mut state = self.notifier.state();
            // The map's copy and ours: nobody else in this process watches the name.
            if Arc::strong_count(&self.notify) > 2 {
                return;
            }
            state.channels.remove(&self.channel);
            #[cfg(feature = "cluster")]
            state.stale.remove(&self.channel);
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (notifier, channel) = (self.notifier.clone(), std::mem::take(&mut self.channel));
        runtime.spawn(async move {
            let _commands = notifier.commands.lock().await;
            // Watched again meanwhile: that watch's subscription stands.
            let sink = {
                let state = notifier.state();
                if state.channels.contains_key(&channel) {
                    return;
                }
                state.sink.clone()
            };
            if let Some(mut sink) = sink {
                let _ = sink.unsubscribe(&channel).await;
            }
        });
    }
}
