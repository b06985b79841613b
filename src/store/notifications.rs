//! `Notifications`: the release notifications a [`Store`](crate::Store) hands its waiters, and
//! the `Watch` a waiter holds on one name.
//!
//! Only a Redis store publishes releases (see `redis/notify/`); without the `redis` feature
//! both types are empty enums, so the waiters' code is the same with and without it, and polls.

#[cfg(not(feature = "redis"))]
pub(crate) use self::none::{Notifications, Watch};
#[cfg(feature = "redis")]
pub(crate) use crate::store::redis::notify::{Notifications, Watch};

#[cfg(not(feature = "redis"))]
mod none {
    use std::time::Duration;

    use tokio::sync::futures::Notified;

    use crate::backend::Mode;

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
