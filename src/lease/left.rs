//! [`LeftShare`]: whether one request is done with the read lease it shares with others.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// Set once, when a request leaves the read lease it shared; its [`Lease`](super::Lease)
/// handles learn of it. Made for every request that joins a share, so it is a flag and a
/// `Notify` in one allocation, where a `CancellationToken` (a tree of tokens, behind a mutex
/// that every check takes) would cost most of a hot read's own work.
#[derive(Clone, Debug, Default)]
pub(crate) struct LeftShare(Arc<Signal>);

#[derive(Debug, Default)]
struct Signal {
    left: AtomicBool,
    notify: Notify,
}

impl LeftShare {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Whether the request left.
    pub(crate) fn is_set(&self) -> bool {
        self.0.left.load(Ordering::Acquire)
    }

    /// Says the request left; answers whether it had not already.
    pub(crate) fn set(&self) -> bool {
        let first = !self.0.left.swap(true, Ordering::AcqRel);
        if first {
            self.0.notify.notify_waiters();
        }
        first
    }

    /// Resolves once the request left.
    pub(crate) async fn left(self) {
        loop {
            let notified = self.0.notify.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the flag is read: a `set` after the read wakes it.
            notified.as_mut().enable();
            if self.is_set() {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::LeftShare;

    #[tokio::test]
    async fn a_waiter_before_and_after_the_leave_both_resolve() {
        let left = LeftShare::new();
        let early = tokio::spawn(left.clone().left());
        tokio::task::yield_now().await;
        assert!(!left.is_set());
        assert!(left.set());
        assert!(!left.set(), "set twice");
        tokio::time::timeout(Duration::from_secs(1), early)
            .await
            .expect("the waiter registered before the leave resolves")
            .unwrap();
        tokio::time::timeout(Duration::from_secs(1), left.clone().left())
            .await
            .expect("a waiter after the leave resolves at once");
    }
}
