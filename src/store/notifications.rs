//! [`Notifications`]: the release notifications a [`Store`](super::Store) hands its waiters,
//! and the [`Watch`] a waiter holds on one name.
//!
//! Only a Redis store publishes releases; without the `redis` feature both types are empty
//! enums, so the waiters' code is the same with and without it and polls.

#[cfg(not(feature = "redis"))]
pub(crate) use self::none::{Notifications, Watch};
#[cfg(feature = "redis")]
pub(crate) use self::redis::{Notifications, Watch};

#[cfg(feature = "redis")]
mod redis {
    use std::sync::Arc;
    use std::time::Duration;

    use super::super::keys::KeyLayout;
    use super::super::notify;
    use crate::store::Mode;

    pub(crate) use super::super::notify::Watch;

    /// A store's release notifications, and how it names their channels.
    #[derive(Clone, Debug)]
    pub(crate) struct Notifications {
        pub(crate) notifier: Arc<notify::Notifier>,
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
            notify::channel(&self.layout, mode, namespace, name)
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
}

#[cfg(not(feature = "redis"))]
mod none {
    use std::time::Duration;

    use tokio::sync::futures::Notified;

    use crate::store::Mode;

    /// No store publishes releases without Redis: there is no value of this type.
    #[derive(Clone, Debug)]
    pub(crate) enum Notifications {}

    impl Notifications {
        pub(crate) fn timeout(&self) -> Duration {
            match *self {}
        }

        pub(crate) fn channel(&self, _: Mode, _: &str, _: &[u8]) -> Vec<u8> {
            match *self {}
        }

        pub(crate) async fn watch(
            &self,
            _: Mode,
            _: &str,
            _: &[u8],
            _: tokio::time::Instant,
        ) -> Option<Watch> {
            match *self {}
        }
    }

    /// A watch on a store without notifications: there is none.
    pub(crate) enum Watch {}

    impl Watch {
        pub(crate) fn subscribed_now(&self) -> bool {
            match *self {}
        }

        pub(crate) fn released(&self) -> Notified<'_> {
            match *self {}
        }

        pub(crate) fn wake_others(&self) {
            match *self {}
        }
    }
}
