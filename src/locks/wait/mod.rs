//! The bounded wait: the attempt loop ([`acquire_within`]), a waiting writer's write intent
//! ([`write_intent`]) and the backoff between attempts (here). It waits its turn in the store's
//! waiting rooms ([`WaitRooms`](crate::store::rooms::WaitRooms)).
//!
//! Within one process only the first waiter of a name contends on the store; the others wait
//! their turn, first come first served, so a release wakes one contender per process, never a
//! herd. The turn is a one-permit [`tokio::sync::Semaphore`], whose queue is FIFO.

use std::time::Duration;

pub(crate) mod acquire_within;
pub(crate) mod write_intent;

/// The first wait between polls for a release in another process; it doubles up to
/// [`MAX_POLL`], never past the holder's remaining lease.
const FIRST_POLL: Duration = Duration::from_millis(5);
pub(crate) const MAX_POLL: Duration = Duration::from_millis(100);

/// The waits between attempts of one waiter: the holder's remaining lease bounds each, and
/// polls for releases in other processes back off from 5 ms to 100 ms, with jitter so that
/// waiters in several processes do not poll in step.
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Backoff { next: FIRST_POLL }
    }

    /// How long to wait before the next attempt, given the holder's `retry_after`.
    pub(crate) fn after(&mut self, retry_after: Duration) -> Duration {
        let poll = self.next.mul_f64(rand::random_range(0.75..1.25));
        self.next = (self.next * 2).min(MAX_POLL);
        // A lease that ends sooner than the next poll is worth trying at its end (plus a
        // millisecond, as Redis counts whole ones).
        poll.min(retry_after + Duration::from_millis(1))
    }
}
