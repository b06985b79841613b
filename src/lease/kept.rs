//! [`KeptLease`]: owns one held lease: its place in the store's heartbeat, and its release.

use std::sync::Arc;
use std::task::Context;

use tokio::time::Instant;

use super::handle::Lease;
use crate::backend::BoxFuture;
use crate::coarse_timer::{CoarseTimer, Overdue};
use crate::store::LeaseState;
use crate::store::heartbeat::{Heartbeat, HeartbeatTiming};
use crate::store::raw::RawLease;

/// Owns a lease the layer holds: its place in the store's heartbeat, and its release.
///
/// Dropped without [`release`](Self::release) (the client went away, the future or body was
/// dropped), it withdraws the lease from the heartbeat and spawns the release, so the lock is
/// free in about one round trip instead of after the TTL.
pub(crate) struct KeptLease {
    pub(crate) state: Arc<LeaseState>,
    enrolment: Enrolment,
}

/// Where the lease stands with the store's heartbeat.
enum Enrolment {
    /// Not handed to the heartbeat yet. Most requests end before the first extension is due,
    /// and enrolling and withdrawing each of them would cost as much as the lock's own round
    /// trips; so the response future waits on this timer while it is polled anyway, and enrols
    /// the lease only when it fires (or when the body takes the lease, as nobody may poll that).
    Pending {
        /// Made the first time the response future waits: a handler that answers at once
        /// (most do) never costs a timer, and one that waits costs a slot in the layer's
        /// coarse timer rather than a tokio timer of its own.
        first_beat: Option<Overdue>,
        acquired_at: Instant,
        timing: HeartbeatTiming,
    },
    /// In the care of the store's heartbeat.
    Enrolled { heartbeat: Heartbeat },
    /// Withdrawn for the release, which is under way or done: nothing extends the lease any
    /// more, and dropping the guard does nothing.
    Released,
}

impl KeptLease {
    /// Takes charge of `holding`, acquired by a command sent at `sent_at`.
    pub(crate) fn new(holding: RawLease, sent_at: Instant, timing: HeartbeatTiming) -> Self {
        let state = Arc::new(LeaseState::new(holding, sent_at));
        tracing::debug!(
            namespace = state.holding.namespace(),
            mode = ?state.holding.mode(),
            fence = state.holding.fence(),
            "lease acquired"
        );
        KeptLease {
            state,
            enrolment: Enrolment::Pending {
                first_beat: None,
                acquired_at: sent_at,
                timing,
            },
        }
    }

    /// Enrols the lease in `heartbeat` once its first extension is due, by `timer` (at most
    /// two of its ticks late); the caller's task is woken then. Must be called within a tokio
    /// runtime.
    pub(crate) fn poll_first_beat(
        &mut self,
        cx: &mut Context<'_>,
        heartbeat: &Heartbeat,
        timer: &Arc<CoarseTimer>,
    ) {
        let Enrolment::Pending {
            first_beat,
            acquired_at,
            timing,
        } = &mut self.enrolment
        else {
            return;
        };
        let due = *acquired_at + timing.every;
        let first_beat = first_beat.get_or_insert_with(|| Overdue::until(timer.clone(), due));
        if first_beat.poll(cx).is_ready() {
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

    /// The lease's shared state.
    pub(crate) fn state(&self) -> &Arc<LeaseState> {
        &self.state
    }

    /// The request extension for this lease.
    pub(crate) fn lease(&self) -> Lease {
        Lease::new(self.state.clone())
    }

    /// Whether the lease was valid at `at` and is not over.
    #[cfg(test)]
    pub(crate) fn valid_at(&self, at: Instant) -> bool {
        self.state.valid_at(at)
    }

    /// Stops the heartbeat and gives the lease back; the future resolves when the store has
    /// answered. Failures are logged: the TTL frees the lock anyway.
    pub(crate) fn release(mut self) -> BoxFuture<'static, ()> {
        // Stop extending first, so no extend races the release.
        self.withdraw();
        Box::pin(release(self.state.clone()))
    }
}

impl KeptLease {
    /// Stops the heartbeat for a release the caller makes itself, and answers the state to
    /// release: dropped after this, the lease spawns no release of its own.
    pub(crate) fn stop(mut self) -> Arc<LeaseState> {
        self.withdraw();
        self.state.clone()
    }

    /// Whether the lease is in the care of the heartbeat.
    #[cfg(test)]
    pub(crate) fn is_enrolled(&self) -> bool {
        matches!(self.enrolment, Enrolment::Enrolled { .. })
    }
}

impl Drop for KeptLease {
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
