//! The heartbeat: one task per store that keeps the leases held through it alive (every layer's
//! and every `Held`'s), sending the extensions that fall due together as one batch.
//!
//! A task per lease costs a timer, a task and a store round trip per lease and beat; at ten
//! thousand held leases that is a good part of a core. One driver sends a due batch with one
//! [`Backend::extend_many`](crate::backend::Backend::extend_many) call (one pipeline on Redis)
//! instead.
//!
//! [`Heartbeat`] is the store's handle on its driver; the driver itself is in [`driver`].

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use super::LeaseState;

mod driver;

use self::driver::{EnrolledLease, drive};

/// When and for how long the heartbeat extends a lease: the layer's
/// [`heartbeat`](crate::LockLayer::heartbeat) and [`max_hold`](crate::LockLayer::max_hold).
#[derive(Clone, Copy, Debug)]
pub(crate) struct HeartbeatTiming {
    pub(crate) every: Duration,
    pub(crate) max_hold: Option<Duration>,
}

impl HeartbeatTiming {
    /// The default for a lease of `ttl`: extended every third of it, so two extensions can
    /// fail before it runs out; no `max_hold`.
    pub(crate) fn for_ttl(ttl: Duration) -> Self {
        Self {
            every: ttl / 3,
            max_hold: None,
        }
    }
}

/// A layer's handle on its heartbeat driver, shared by every service and guard it makes.
#[derive(Clone, Default)]
pub(crate) struct Heartbeat {
    driver: Arc<DriverSlot>,
}

/// Where a layer's driver is reached, and what tells it to stop.
#[derive(Default)]
struct DriverSlot {
    /// The running driver's inbox; `None` while no driver runs. Enrolments send under the lock,
    /// and the driver ends under it, so no enrolment lands in a driver that is leaving.
    inbox: Mutex<Option<mpsc::UnboundedSender<(EnrolledLease, Instant)>>>,
    /// Enrolled leases whose guard has not withdrawn them yet.
    enrolled: AtomicUsize,
    /// Told when `enrolled` drops to zero, so the driver lets its released leases go and ends
    /// now rather than at their next beat.
    idle: Notify,
}

impl Heartbeat {
    /// Hands the lease of `state`, acquired at `acquired_at`, to the driver (spawning it if
    /// none runs); its first extension is due one beat after the acquisition. Must be called
    /// within a tokio runtime; pair it with one [`withdraw`](Self::withdraw).
    pub(crate) fn enrol(
        &self,
        state: Arc<LeaseState>,
        acquired_at: Instant,
        timing: HeartbeatTiming,
    ) {
        let lease = EnrolledLease::new(state, acquired_at, timing);
        let due = acquired_at + timing.every;
        self.driver.enrolled.fetch_add(1, Ordering::AcqRel);
        let mut inbox = self.driver.inbox.lock().unwrap_or_else(|e| e.into_inner());
        // A driver whose runtime shut down left its sender behind: sending fails, start anew.
        let message = match inbox.as_ref() {
            Some(tx) => match tx.send((lease, due)) {
                Ok(()) => return,
                Err(mpsc::error::SendError(message)) => message,
            },
            None => (lease, due),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(message);
        *inbox = Some(tx);
        tokio::spawn(drive(self.driver.clone(), rx));
    }

    /// Says that an enrolled lease's guard let go (the lease is released or dropped, and its
    /// state marked over): the driver sends no extension for it from now on.
    pub(crate) fn withdraw(&self) {
        if self.driver.enrolled.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.driver.idle.notify_one();
        }
    }
}

impl fmt::Debug for Heartbeat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Heartbeat")
            .field("enrolled", &self.driver.enrolled.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}
