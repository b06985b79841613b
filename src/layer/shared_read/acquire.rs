//! The requests of a share whose acquisition is on the wire: the [`Leader`] that sends it, and
//! the [`Waiter`]s that get its answer.

use std::sync::Arc;

use tokio::time::Instant;

use super::{Held, Outcome, Share, SharedRead, SharedReads};
use crate::definition::attempt::Attempt;
use crate::lease::kept::KeptLease;
use crate::store::heartbeat::HeartbeatTiming;
use crate::store::raw::RawLease;
use crate::{Error, Result};

/// A request waiting for the acquisition another request of its share sent.
pub(crate) struct Waiter {
    reads: Arc<SharedReads>,
    /// `None` once the waiter has left or become a [`SharedRead`].
    share: Option<Arc<Share>>,
}

impl Waiter {
    pub(super) fn new(reads: Arc<SharedReads>, share: Arc<Share>) -> Self {
        let share = Some(share);
        Waiter { reads, share }
    }

    /// The share's answer for this request; `None` when the leading request went away before
    /// it asked the store, and this one must enter again.
    pub(crate) async fn outcome(mut self) -> Option<Result<Attempt<SharedRead>>> {
        let share = self.share.clone().expect("waits once");
        loop {
            let answered = share.answered.notified();
            let mut answered = std::pin::pin!(answered);
            // Registered before looking, so a publication in between still wakes us.
            answered.as_mut().enable();
            if let Some(outcome) = share.outcome.get() {
                let answer = match outcome {
                    Outcome::Acquired(_) => {
                        self.share = None;
                        let read = SharedRead::new(self.reads.clone(), share.clone());
                        return Some(Ok(Attempt::Acquired(read)));
                    }
                    Outcome::Busy(retry_after) => Some(Ok(Attempt::Busy {
                        retry_after: *retry_after,
                    })),
                    Outcome::Failed(error) => Some(Err(copy(error))),
                    Outcome::Abandoned => None,
                };
                // Dropping `self` leaves the share.
                return answer;
            }
            answered.await;
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if let Some(share) = self.share.take() {
            drop(self.reads.leave(&share));
        }
    }
}

/// The request that sends a share's acquisition.
pub(crate) struct Leader {
    reads: Arc<SharedReads>,
    /// `None` once published.
    share: Option<Arc<Share>>,
}

impl Leader {
    pub(super) fn new(reads: Arc<SharedReads>, share: Arc<Share>) -> Self {
        let share = Some(share);
        Leader { reads, share }
    }

    /// Publishes the store's answer to the share (`attempt`, sent at `sent_at`) and answers the
    /// leading request.
    pub(crate) fn publish(
        mut self,
        attempt: Result<Attempt<RawLease>>,
        sent_at: Instant,
        timing: HeartbeatTiming,
    ) -> Result<Attempt<SharedRead>> {
        let share = self.share.take().expect("publishes once");
        let (outcome, answer) = match attempt {
            Ok(Attempt::Acquired(holding)) => {
                let lease = KeptLease::new(holding, sent_at, timing);
                let held = Held::new(lease, sent_at, timing);
                self.reads.publish(&share, Outcome::Acquired(held));
                let read = SharedRead::new(self.reads.clone(), share);
                return Ok(Attempt::Acquired(read));
            }
            Ok(Attempt::Busy { retry_after }) => {
                let answer = Ok(Attempt::Busy { retry_after });
                (Outcome::Busy(retry_after), answer)
            }
            Err(error) => (Outcome::Failed(copy(&error)), Err(error)),
        };
        self.reads.publish(&share, outcome);
        drop(self.reads.leave(&share));
        answer
    }
}

impl Drop for Leader {
    fn drop(&mut self) {
        if let Some(share) = self.share.take() {
            self.reads.publish(&share, Outcome::Abandoned);
            drop(self.reads.leave(&share));
        }
    }
}

/// The same failure again, for each request that waited on a failed acquisition.
fn copy(error: &Error) -> Error {
    match error {
        #[cfg(feature = "redis")]
        Error::Redis(e) => Error::Redis(e.clone()),
        Error::Timeout(d) => Error::Timeout(*d),
        Error::InvalidName { len } => Error::InvalidName { len: *len },
        other => Error::UnexpectedReply(other.to_string()),
    }
}
