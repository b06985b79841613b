//! [`Attempt`]: an acquisition's answer when the caller wants to know how long to wait.

use std::time::Duration;

use crate::Result;
use crate::telemetry::AcquireOutcome;

/// The answer to an acquisition that says how long to wait when the lock is held.
#[derive(Debug)]
#[must_use]
pub enum Attempt<T> {
    /// The lease was taken.
    Acquired(T),
    /// Someone else holds the lock.
    Busy {
        /// How long until the blocking lease ends, unless its holder extends or releases it.
        retry_after: Duration,
    },
}

impl<T> Attempt<T> {
    /// The token, if the lease was taken.
    pub fn acquired(self) -> Option<T> {
        match self {
            Attempt::Acquired(token) => Some(token),
            Attempt::Busy { .. } => None,
        }
    }

    /// How long until the blocking lease ends, if the lock was held.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Attempt::Acquired(_) => None,
            Attempt::Busy { retry_after } => Some(*retry_after),
        }
    }

    /// Maps the token, keeping a `Busy` answer as it is.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Attempt<U> {
        match self {
            Attempt::Acquired(token) => Attempt::Acquired(f(token)),
            Attempt::Busy { retry_after } => Attempt::Busy { retry_after },
        }
    }
}

/// What `answer` counts as in `tower_lease_acquire_total`: a lease taken is `acquired`, or
/// `waited` when the caller waited for it; a refusal is `busy`, or `timed_out_waiting` after a
/// wait; a store failure counts as `on_store_error` (the layer's `fail_open` runs the request
/// unlocked and counts it so).
pub(crate) fn outcome<T>(
    answer: &Result<Attempt<T>>,
    waited: bool,
    on_store_error: AcquireOutcome,
) -> AcquireOutcome {
    match (answer, waited) {
        (Ok(Attempt::Acquired(_)), false) => AcquireOutcome::Acquired,
        (Ok(Attempt::Acquired(_)), true) => AcquireOutcome::Waited,
        (Ok(Attempt::Busy { .. }), false) => AcquireOutcome::Busy,
        (Ok(Attempt::Busy { .. }), true) => AcquireOutcome::TimedOutWaiting,
        (Err(_), _) => on_store_error,
    }
}
