//! [`Limit`] and [`Beat`]: a layer's time limits and heartbeat, each with the coarse timer
//! that enforces it, made together so that no setter can change one without the other.

use std::sync::Arc;
use std::time::Duration;

use crate::coarse_timer::CoarseTimer;
use crate::store::heartbeat::HeartbeatTiming;

/// A time limit of the layer (how long a request body may take, how long a response waits for
/// its release), with the one coarse timer its requests share.
#[derive(Clone, Debug)]
pub(crate) struct Limit {
    after: Duration,
    timer: Arc<CoarseTimer>,
}

impl Limit {
    pub(crate) fn new(after: Duration) -> Self {
        Self {
            after,
            timer: CoarseTimer::new(after),
        }
    }

    /// How long the limit is.
    pub(crate) fn after(&self) -> Duration {
        self.after
    }

    /// The timer that enforces it.
    pub(crate) fn timer(&self) -> &Arc<CoarseTimer> {
        &self.timer
    }
}

/// How a layer's leases are extended (every so often, for at most so long), with the coarse
/// timer of each lease's first beat, which must tick at the same interval: changed together.
#[derive(Clone, Debug)]
pub(crate) struct Beat {
    timing: HeartbeatTiming,
    first: Arc<CoarseTimer>,
}

impl Beat {
    /// The default for a lease of `ttl`: see [`HeartbeatTiming::for_ttl`].
    pub(crate) fn for_ttl(ttl: Duration) -> Self {
        let timing = HeartbeatTiming::for_ttl(ttl);
        Self {
            timing,
            first: CoarseTimer::new(timing.every),
        }
    }

    pub(crate) fn timing(&self) -> HeartbeatTiming {
        self.timing
    }

    /// The timer of a lease's first beat, one interval after its acquisition.
    pub(crate) fn first_beat_timer(&self) -> &Arc<CoarseTimer> {
        &self.first
    }

    /// Extends every `every`.
    pub(crate) fn set_every(&mut self, every: Duration) {
        self.timing.every = every;
        self.first = CoarseTimer::new(every);
    }

    /// Stops extending `max_hold` after the lease was taken.
    pub(crate) fn set_max_hold(&mut self, max_hold: Duration) {
        self.timing.max_hold = Some(max_hold);
    }
}
