//! [`LeaseGuard`]: owns a lease the layer holds (or a request's share of a read lease), its
//! place in the heartbeat, and its release.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::heartbeat::{Heartbeat, HeartbeatTiming};
use super::lease::{Lease, LeaseState};
use super::shared_read::SharedRead;
use crate::Result;
use crate::finish_on_drop::FinishOnDrop;
use crate::store::BoxFuture;
use crate::store::watchdog::{Overdue, Watchdog};
use crate::token::{Attempt, Holding};

/// What a request's acquisition came to, as the response future takes it.
pub(crate) type Guarded = Result<Attempt<LeaseGuard>>;

impl FinishOnDrop<Guarded> {
    /// An acquisition: abandoned, a lease it took is released at once (by the guard's drop).
    pub(crate) fn guarded(call: BoxFuture<'static, Guarded>) -> Self {
        Self::new(call, |attempt| {
            drop(attempt);
            None
        })
    }
}

/// What one request holds: a lease of its own, or its part in a read lease shared with other
/// requests of the process ([`shared_read`](super::shared_read)). The response future and the
/// body see one interface for both.
pub(crate) struct LeaseGuard {
    kind: Kind,
}

enum Kind {
    Own(OwnLease),
    /// With the wait for the shared lease's end, once this request has polled for it.
    Shared(SharedRead, Option<Pin<Box<WaitForCancellationFutureOwned>>>),
}

/// Owns a lease the layer holds: its place in the layer's heartbeat, and its release.
///
/// Dropped without [`release`](Self::release) (the client went away, the future or body was
/// dropped), it withdraws the lease from the heartbeat and spawns the release, so the lock is
/// free in about one round trip instead of after the TTL.
pub(crate) struct OwnLease {
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
        /// (most do) never costs a timer, and one that waits costs a slot in the layer's
        /// coarse timer rather than a tokio timer of its own.
        first_beat: Option<Overdue>,
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
        Self::own(OwnLease::new(holding, sent_at, timing))
    }

    pub(super) fn own(lease: OwnLease) -> Self {
        let kind = Kind::Own(lease);
        Self { kind }
    }

    pub(super) fn shared(read: SharedRead) -> Self {
        let kind = Kind::Shared(read, None);
        Self { kind }
    }

    /// Enrols the lease in `heartbeat` once its first extension is due, by `timer` (at most
    /// two of its ticks late); the caller's task is woken then. Must be called within a tokio
    /// runtime.
    pub(crate) fn poll_first_beat(
        &mut self,
        cx: &mut Context<'_>,
        heartbeat: &Heartbeat,
        timer: &Arc<Watchdog>,
    ) {
        match &mut self.kind {
            Kind::Own(own) => own.poll_first_beat(cx, heartbeat, timer),
            Kind::Shared(read, _) => read.poll_first_beat(cx, heartbeat, timer),
        }
    }

    /// Enrols the lease in `heartbeat` now if it is not there yet. Must be called within a
    /// tokio runtime.
    pub(crate) fn enrol_now(&mut self, heartbeat: &Heartbeat) {
        match &mut self.kind {
            Kind::Own(own) => own.enrol_now(heartbeat),
            Kind::Shared(read, _) => read.enrol_now(heartbeat),
        }
    }

    /// The lease's namespace.
    pub(crate) fn namespace(&self) -> &'static str {
        self.state().holding.namespace()
    }

    fn state(&self) -> &Arc<LeaseState> {
        match &self.kind {
            Kind::Own(own) => &own.state,
            Kind::Shared(read, _) => read.state(),
        }
    }

    /// The request extension for this lease.
    pub(crate) fn lease(&self) -> Lease {
        match &self.kind {
            Kind::Own(own) => own.lease(),
            Kind::Shared(read, _) => read.lease(),
        }
    }

    /// Whether the lease was valid at `at` and is not over (for this request).
    #[cfg(test)]
    pub(crate) fn valid_at(&self, at: Instant) -> bool {
        match &self.kind {
            Kind::Own(own) => own.valid_at(at),
            Kind::Shared(read, _) => read.valid_at(at),
        }
    }

    /// Whether the lease is over (for this request) at `now`: ended, or past its deadline on
    /// the monotonic clock, which declares it lost. Ask before each poll of the work it guards.
    pub(crate) fn over_at(&self, now: Instant) -> bool {
        match &self.kind {
            Kind::Own(own) => own.state.over_at(now),
            Kind::Shared(read, _) => read.over_at(now),
        }
    }

    #[cfg(test)]
    pub(super) fn lease_state(&self) -> &LeaseState {
        self.state()
    }

    #[cfg(test)]
    pub(super) fn is_enrolled(&self) -> bool {
        match &self.kind {
            Kind::Own(own) => matches!(own.enrolment, Enrolment::Enrolled { .. }),
            Kind::Shared(..) => false,
        }
    }

    /// Ready once the lease has ended, which before its release means it is lost; otherwise
    /// the task of `cx` is woken when it does.
    pub(crate) fn poll_lost(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.kind {
            // One poller at a time (the response future, then the body): the state's waker
            // slot, without an allocation.
            Kind::Own(own) => own.state.poll_ended(cx),
            // Every request sharing the lease polls for its end: each waits on the state's
            // token, with a future of its own made on first use.
            Kind::Shared(read, lost) => {
                let lost = lost.get_or_insert_with(|| {
                    Box::pin(read.state().ended().clone().cancelled_owned())
                });
                lost.as_mut().poll(cx)
            }
        }
    }

    /// Gives the lease back, or this request's part in a shared one (the last request to leave
    /// gives the shared lease back); the future resolves when the store has answered.
    pub(crate) fn release(self) -> BoxFuture<'static, ()> {
        match self.kind {
            Kind::Own(own) => own.release(),
            Kind::Shared(read, _) => read.release(),
        }
    }
}

impl OwnLease {
    /// Takes charge of `holding`, acquired by a command sent at `sent_at`.
    pub(super) fn new(holding: Holding, sent_at: Instant, timing: HeartbeatTiming) -> Self {
        let state = Arc::new(LeaseState::new(holding, sent_at));
        tracing::debug!(
            namespace = state.holding.namespace(),
            mode = ?state.holding.mode(),
            fence = state.holding.fence(),
            "lease acquired"
        );
        OwnLease {
            state,
            enrolment: Enrolment::Pending {
                first_beat: None,
                acquired_at: sent_at,
                timing,
            },
        }
    }

    /// See [`LeaseGuard::poll_first_beat`].
    fn poll_first_beat(
        &mut self,
        cx: &mut Context<'_>,
        heartbeat: &Heartbeat,
        timer: &Arc<Watchdog>,
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
    pub(super) fn enrol_now(&mut self, heartbeat: &Heartbeat) {
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
    pub(super) fn state(&self) -> &Arc<LeaseState> {
        &self.state
    }

    /// The request extension for this lease.
    fn lease(&self) -> Lease {
        Lease::new(self.state.clone())
    }

    /// Whether the lease was valid at `at` and is not over.
    #[cfg(test)]
    fn valid_at(&self, at: Instant) -> bool {
        self.state.valid_at(at)
    }

    /// Stops the heartbeat and gives the lease back; the future resolves when the store has
    /// answered. Failures are logged: the TTL frees the lock anyway.
    pub(super) fn release(mut self) -> BoxFuture<'static, ()> {
        // Stop extending first, so no extend races the release.
        self.withdraw();
        Box::pin(release(self.state.clone()))
    }
}

impl Drop for OwnLease {
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
            .field("shared", &matches!(self.kind, Kind::Shared(..)))
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
#[path = "guard_tests.rs"]
mod tests;
