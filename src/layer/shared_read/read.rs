//! [`SharedRead`]: one request's part in a held shared lease.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::Context;

use tokio::time::Instant;

use super::{Held, Left, Share, SharedReads};
use crate::backend::BoxFuture;
use crate::coarse_timer::{CoarseTimer, Overdue};
use crate::lease::Lease;
use crate::lease::left::LeftShare;
use crate::store::LeaseState;
use crate::store::heartbeat::Heartbeat;

/// A request's part in a held shared lease: what its `LeaseGuard` holds.
pub(crate) struct SharedRead {
    reads: Arc<SharedReads>,
    pub(super) share: Arc<Share>,
    /// Set when this request leaves, for its [`Lease`].
    left: LeftShare,
    /// The shared lease's first beat, made when this request's future first waits.
    first_beat: Option<Overdue>,
}

impl SharedRead {
    pub(super) fn new(reads: Arc<SharedReads>, share: Arc<Share>) -> Self {
        debug_assert!(share.held().is_some());
        SharedRead {
            reads,
            share,
            left: LeftShare::new(),
            first_beat: None,
        }
    }

    fn held(&self) -> &Held {
        self.share.held().expect("a shared read holds a lease")
    }

    pub(in crate::layer) fn state(&self) -> &Arc<LeaseState> {
        &self.held().state
    }

    pub(in crate::layer) fn lease(&self) -> Lease {
        Lease::shared(self.state().clone(), self.left.clone())
    }

    #[cfg(test)]
    pub(in crate::layer) fn valid_at(&self, at: Instant) -> bool {
        !self.left.is_set() && self.state().valid_at(at)
    }

    /// As `LeaseGuard::over_at`: this request left, or the shared lease is over.
    pub(in crate::layer) fn over_at(&self, now: Instant) -> bool {
        self.left.is_set() || self.state().over_at(now)
    }

    /// As `LeaseGuard::poll_first_beat`: any request of the share whose future waits may
    /// enrol the shared lease when its first beat is due.
    pub(in crate::layer) fn poll_first_beat(
        &mut self,
        cx: &mut Context<'_>,
        heartbeat: &Heartbeat,
        timer: &Arc<CoarseTimer>,
    ) {
        let share = self.share.clone();
        let held = share.held().expect("a shared read holds a lease");
        if held.enrolled.load(Ordering::Acquire) {
            return;
        }
        let due = held.first_beat();
        let first_beat = self
            .first_beat
            .get_or_insert_with(|| Overdue::until(timer.clone(), due));
        if first_beat.poll(cx).is_ready() {
            held.enrol(heartbeat);
        }
    }

    pub(in crate::layer) fn enrol_now(&mut self, heartbeat: &Heartbeat) {
        let held = self.held();
        if !held.enrolled.load(Ordering::Acquire) {
            held.enrol(heartbeat);
        }
    }

    /// Enrols the shared lease when its first beat is past: a stream of requests that each end
    /// at once (none waits on the timer) must not let it run out. Outside a tokio runtime
    /// (a service called there, its future polled later) it leaves that to the next request,
    /// or to this one's first wait, since the heartbeat spawns its task.
    pub(crate) fn enrol_if_due(&self, heartbeat: &Heartbeat) {
        let held = self.held();
        if !held.enrolled.load(Ordering::Acquire)
            && Instant::now() >= held.first_beat()
            && tokio::runtime::Handle::try_current().is_ok()
        {
            held.enrol(heartbeat);
        }
    }

    /// Leaves the share: the lease to release when this was its last request.
    fn leave(&mut self) -> Left {
        if !self.left.set() {
            return Left::Others;
        }
        self.reads.leave(&self.share)
    }

    /// Leaves the share; the future resolves when this request may be answered: at once if
    /// others are still in the share, once the store has answered the release if this was the
    /// last, and once a lingering share is settled (another read took it over, or it was
    /// released) otherwise.
    pub(in crate::layer) fn release(mut self) -> BoxFuture<'static, ()> {
        match self.leave() {
            Left::Lease(lease) => lease.release(),
            Left::Lingering(spell) => Box::pin(self.share.clone().settled(spell)),
            // A future of no size: boxing it allocates nothing, on every read but the last.
            Left::Others => Box::pin(std::future::poll_fn(|_| std::task::Poll::Ready(()))),
        }
    }
}

impl Drop for SharedRead {
    fn drop(&mut self) {
        // The last one out drops the lease, which releases it in the background; a lingering
        // share is released by its linger.
        drop(self.leave());
    }
}
