//! [`Deadline`]: a layer's time limit and the coarse timer that enforces it, made together so
//! that no setter can change one without the other.

use std::sync::Arc;
use std::time::Duration;

use crate::store::watchdog::Watchdog;

/// A time limit of the layer (how long a request body may take, how long a response waits for
/// its release), with the one coarse timer its requests share.
#[derive(Clone, Debug)]
pub(crate) struct Deadline {
    after: Duration,
    timer: Arc<Watchdog>,
}

impl Deadline {
    pub(crate) fn new(after: Duration) -> Self {
        Self {
            after,
            timer: Watchdog::new(after),
        }
    }

    /// How long the limit is.
    pub(crate) fn after(&self) -> Duration {
        self.after
    }

    /// The timer that enforces it.
    pub(crate) fn timer(&self) -> &Arc<Watchdog> {
        &self.timer
    }
}
