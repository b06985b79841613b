//! [`LeaseGuard`]: owns a lease the layer holds (or a request's share of a read lease), its
//! place in the heartbeat, and its release.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;
use tokio_util::sync::WaitForCancellationFutureOwned;

use crate::Result;
use crate::backend::BoxFuture;
use crate::coarse_timer::CoarseTimer;
use crate::definition::attempt::Attempt;
use crate::layer::shared_read::SharedRead;
use crate::lease::Lease;
use crate::lease::finish_on_drop::FinishOnDrop;
use crate::lease::kept::KeptLease;
use crate::store::LeaseState;
use crate::store::heartbeat::{Heartbeat, HeartbeatTiming};
use crate::store::raw::RawLease;

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
/// requests of the process ([`shared_read`](crate::layer::shared_read)). The response future and the
/// body see one interface for both.
pub(crate) struct LeaseGuard {
    kind: Kind,
}

enum Kind {
    Own(KeptLease),
    /// With the wait for the shared lease's end, once this request has polled for it.
    Shared(SharedRead, Option<Pin<Box<WaitForCancellationFutureOwned>>>),
}

impl LeaseGuard {
    /// Takes charge of `holding`, acquired by a command sent at `sent_at`; its heartbeat starts
    /// when the first extension is due (see [`poll_first_beat`](Self::poll_first_beat)).
    pub(crate) fn new(holding: RawLease, sent_at: Instant, timing: HeartbeatTiming) -> Self {
        Self::own(KeptLease::new(holding, sent_at, timing))
    }

    pub(in crate::layer) fn own(lease: KeptLease) -> Self {
        let kind = Kind::Own(lease);
        Self { kind }
    }

    pub(in crate::layer) fn shared(read: SharedRead) -> Self {
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
        timer: &Arc<CoarseTimer>,
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

    /// Whether the lease is over (for this request) at `now`: ended, or past its expiry on
    /// the monotonic clock, which declares it lost. Ask before each poll of the work it guards.
    pub(crate) fn over_at(&self, now: Instant) -> bool {
        match &self.kind {
            Kind::Own(own) => own.state.over_at(now),
            Kind::Shared(read, _) => read.over_at(now),
        }
    }

    #[cfg(test)]
    pub(in crate::layer) fn is_enrolled(&self) -> bool {
        match &self.kind {
            Kind::Own(own) => own.is_enrolled(),
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

impl fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("lease", &self.lease())
            .field("shared", &matches!(self.kind, Kind::Shared(..)))
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
