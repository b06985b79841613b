//! [`LeaseGuard`]: owns a lease the layer holds, its place in the heartbeat, and its release.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep, sleep_until};

use super::heartbeat::{Heartbeat, HeartbeatTiming};
use super::lease::{Lease, LeaseState};
use crate::store::BoxFuture;
use crate::token::Holding;

/// Owns a lease the layer holds: its place in the layer's heartbeat, and its release.
///
/// Dropped without [`release`](Self::release) (the client went away, the future or body was
/// dropped), it withdraws the lease from the heartbeat and spawns the release, so the lock is
/// free in about one round trip instead of after the TTL.
pub(crate) struct LeaseGuard {
    state: Arc<LeaseState>,
    enrolment: Enrolment,
}

/// Where the lease stands with the layer's heartbeat.
enum Enrolment {
    /// Not handed to the heartbeat yet. Most requests end before the first extension is due,
    /// and enrolling and withdrawing each of them would cost as much as the lock's own round
    /// trips; so the response future waits on this timer while it is polled anyway, and enrols
    /// the lease only when it fires (or when the body takes the lease, as nobody may poll that).
    Pending {
        /// Made the first time the response future waits: a handler that answers at once
        /// (most do) never costs a timer.
        first_beat: Option<Pin<Box<Sleep>>>,
        acquired_at: Instant,
        timing: HeartbeatTiming,
    },
    /// In the care of the layer's heartbeat.
    Enrolled { heartbeat: Heartbeat },
    /// Withdrawn for the release, which is under way or done: nothing extends the lease any
    /// more, and dropping the guard does nothing.
    Released,
}

impl LeaseGuard {
    /// Takes charge of `holding`, acquired by a command sent at `sent_at`; its heartbeat starts
    /// when the first extension is due (see [`poll_first_beat`](Self::poll_first_beat)).
    pub(crate) fn new(holding: Holding, sent_at: Instant, timing: HeartbeatTiming) -> Self {
        let state = Arc::new(LeaseState::new(holding, sent_at));
        tracing::debug!(
            namespace = state.holding.namespace(),
            mode = ?state.holding.mode(),
            fence = state.holding.fence(),
            "lease acquired"
        );
        LeaseGuard {
            state,
            enrolment: Enrolment::Pending {
                first_beat: None,
                acquired_at: sent_at,
                timing,
            },
        }
    }

    /// Enrols the lease in `heartbeat` once its first extension is due; the caller's task is
    /// woken then. Must be called within a tokio runtime.
    pub(crate) fn poll_first_beat(&mut self, cx: &mut Context<'_>, heartbeat: &Heartbeat) {
        let Enrolment::Pending {
            first_beat,
            acquired_at,
            timing,
        } = &mut self.enrolment
        else {
            return;
        };
        let due = *acquired_at + timing.every;
        let first_beat = first_beat.get_or_insert_with(|| Box::pin(sleep_until(due)));
        if first_beat.as_mut().poll(cx).is_ready() {
            self.enrol_now(heartbeat);
        }
    }

    /// Enrols the lease in `heartbeat` now if it is not there yet: from here on the lease must
    /// be kept alive whether or not anyone polls. Must be called within a tokio runtime.
    pub(crate) fn enrol_now(&mut self, heartbeat: &Heartbeat) {
        let Enrolment::Pending {
            acquired_at,
            timing,
            ..
        } = self.enrolment
        else {
            return;
        };
        heartbeat.enrol(self.state.clone(), acquired_at, timing);
        self.enrolment = Enrolment::Enrolled {
            heartbeat: heartbeat.clone(),
        };
    }

    /// Ends the lease's heartbeat for its release: the state is marked over first, so the
    /// heartbeat sends no extension for it from now on. Answers whether the lease was still to
    /// be released.
    fn withdraw(&mut self) -> bool {
        self.state.end();
        match std::mem::replace(&mut self.enrolment, Enrolment::Released) {
            Enrolment::Enrolled { heartbeat } => heartbeat.withdraw(),
            Enrolment::Pending { .. } => {}
            Enrolment::Released => return false,
        }
        true
    }

    /// The lease's namespace.
    pub(crate) fn namespace(&self) -> &'static str {
        self.state.holding.namespace()
    }

    /// The request extension for this lease.
    pub(crate) fn lease(&self) -> Lease {
        Lease::new(self.state.clone())
    }

    /// Whether the lease was valid at `at` and is not over.
    pub(crate) fn valid_at(&self, at: Instant) -> bool {
        self.state.valid_at(at)
    }

    #[cfg(test)]
    pub(super) fn lease_state(&self) -> &LeaseState {
        &self.state
    }

    /// Ready once the lease has ended, which before its release means it is lost; otherwise
    /// the task of `cx` is woken when it does.
    pub(crate) fn poll_lost(&self, cx: &mut Context<'_>) -> Poll<()> {
        self.state.poll_ended(cx)
    }

    /// Stops the heartbeat and gives the lease back; the future resolves when the store has
    /// answered. Failures are logged: the TTL frees the lock anyway.
    pub(crate) fn release(mut self) -> BoxFuture<'static, ()> {
        // Stop extending first, so no extend races the release.
        self.withdraw();
        Box::pin(release(self.state.clone()))
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if !self.withdraw() {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(release(self.state.clone()));
            }
            Err(_) => tracing::warn!(
                namespace = self.state.holding.namespace(),
                "lease dropped outside a tokio runtime; it stays held until its TTL runs out"
            ),
        }
    }
}

impl fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("lease", &self.lease())
            .finish_non_exhaustive()
    }
}

async fn release(state: Arc<LeaseState>) {
    let namespace = state.holding.namespace();
    match state.holding.release().await {
        Ok(true) => tracing::debug!(namespace, "lease released"),
        Ok(false) => tracing::debug!(namespace, "lease had already run out at release"),
        Err(error) => tracing::warn!(
            namespace,
            %error,
            "releasing the lease failed; it stays held until its TTL runs out"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::time::Duration;

    use super::*;
    use crate::lock::Spec;
    use crate::store::Mode;
    use crate::token::Attempt;
    use crate::{Lock, Store};

    const LOCK: Lock<str> = Lock::new("beat", Duration::from_millis(300));
    const EVERY_100_MS: HeartbeatTiming = HeartbeatTiming {
        every: Duration::from_millis(100),
        max_hold: None,
    };

    async fn guard(store: &Store, timing: HeartbeatTiming) -> (LeaseGuard, Instant) {
        let spec: Spec = LOCK.spec();
        let sent_at = Instant::now();
        let held = match Holding::acquire(store.clone(), spec, Mode::Exclusive, Cow::Borrowed(b"x"))
            .await
            .unwrap()
        {
            Attempt::Acquired(held) => held,
            Attempt::Busy { .. } => panic!("free at first"),
        };
        let mut guard = LeaseGuard::new(held, sent_at, timing);
        guard.enrol_now(&Heartbeat::default());
        (guard, sent_at)
    }

    #[tokio::test(start_paused = true)]
    async fn the_heartbeat_starts_when_its_first_beat_is_due_under_a_polling_future() {
        let store = Store::memory();
        let timing = EVERY_100_MS;
        let (held, sent_at) = match Holding::acquire(
            store.clone(),
            LOCK.spec(),
            Mode::Exclusive,
            Cow::Borrowed(b"lazy"),
        )
        .await
        .unwrap()
        {
            Attempt::Acquired(held) => (held, Instant::now()),
            Attempt::Busy { .. } => panic!("free at first"),
        };
        let mut guard = LeaseGuard::new(held, sent_at, timing);
        assert!(
            matches!(guard.enrolment, Enrolment::Pending { .. }),
            "no task before it is due"
        );

        // What the response future does while the handler runs: poll, and be woken on time.
        let heartbeat = Heartbeat::default();
        let polling = std::future::poll_fn(|cx| {
            guard.poll_first_beat(cx, &heartbeat);
            std::task::Poll::<()>::Pending
        });
        let _ = tokio::time::timeout(Duration::from_millis(150), polling).await;
        assert!(
            matches!(guard.enrolment, Enrolment::Enrolled { .. }),
            "registered when due"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            guard.valid_at(Instant::now()),
            "the driver extends it on its own"
        );
        assert!(LOCK.try_lock(&store, "lazy").await.unwrap().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_heartbeat_keeps_the_lease_and_max_hold_ends_it_at_the_margin() {
        let store = Store::memory();
        let timing = HeartbeatTiming {
            every: Duration::from_millis(100),
            max_hold: Some(Duration::from_millis(250)),
        };
        let (guard, acquired) = guard(&store, timing).await;
        let lease = guard.lease();

        // Extends at 100 and 200 ms; none at 300 ms (past max_hold), so the lease counts as
        // lost at 200 + 300 − (3 + 2) ms = 495 ms, just before the store's end at 500 ms.
        lease.lost().await;
        assert_eq!(acquired.elapsed(), Duration::from_millis(495));
        assert!(!lease.is_held());
        assert!(!guard.valid_at(Instant::now()));
        assert!(
            LOCK.try_lock(&store, "x").await.unwrap().is_none(),
            "still in the store"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(LOCK.try_lock(&store, "x").await.unwrap().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_stays_valid_while_extended_and_release_ends_it() {
        let store = Store::memory();
        let timing = EVERY_100_MS;
        let (guard, _) = guard(&store, timing).await;
        let lease = guard.lease();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(lease.is_held() && guard.valid_at(Instant::now()));
        assert!(LOCK.try_lock(&store, "x").await.unwrap().is_none());

        guard.release().await;
        assert!(!lease.is_held());
        lease.ended().await;
        let lost = tokio::time::timeout(Duration::from_secs(60), lease.lost()).await;
        assert!(lost.is_err(), "a released lease is not lost");
        assert!(LOCK.try_lock(&store, "x").await.unwrap().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_guard_releases_in_the_background() {
        let store = Store::memory();
        let timing = EVERY_100_MS;
        let (guard, _) = guard(&store, timing).await;
        drop(guard);
        tokio::task::yield_now().await;
        assert!(LOCK.try_lock(&store, "x").await.unwrap().is_some());
    }
}
