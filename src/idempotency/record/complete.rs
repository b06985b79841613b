//! Storing the first request's record before its response goes out: tried again while it
//! fails, with the reservation kept alive, then in the background once the client was told
//! `503`.
//!
//! A completion is safe to send again: the store compares the reservation's secret, and a
//! completion that went through answers the same the second time. So a call that failed (or
//! whose answer was lost) is simply sent again until the store says stored or taken.

use std::future::{Future, poll_fn};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::cache::Replays;
use crate::Store;
use crate::backend::{Completion, FINGERPRINT_LEN};
use crate::coarse_timer::Overdue;
use crate::idempotency::config::Config;
use crate::lease::kept::KeptLease;
use crate::rejection::Reason;

/// The first and the longest pause between two tries.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const LAST_PAUSE: Duration = Duration::from_secs(1);

/// What a client told `503` waits before retrying: the store is usually back (or failed over)
/// within about a second, and the background completion tries at least that often.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// One completion, until the store answers.
struct Pending {
    store: Store,
    replays: Arc<Replays>,
    /// The reservation, kept by the heartbeat while storing fails; stopped without a release
    /// when this is dropped (a release could free the key for a second run).
    own: Option<KeptLease>,
    fingerprint: [u8; FINGERPRINT_LEN],
    record: Bytes,
    retention: Duration,
    namespace: &'static str,
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(own) = self.own.take() {
            own.stop();
        }
    }
}

/// How one try came out.
enum Tried {
    Stored,
    /// Another request holds or completed the key: ours can never be stored.
    Taken,
    Failed,
}

impl Pending {
    async fn try_once(&mut self) -> Tried {
        let own = self.own.as_ref().expect("held until the end");
        let lease = own.state().holding.lease_ref();
        let completion = Completion::new(&self.fingerprint, &self.record, self.retention);
        let sent_at = Instant::now();
        match self.store.complete(lease, completion).await {
            Ok(true) => {
                let name = own.state().holding.name();
                let record = self.record.clone();
                let replays = &self.replays;
                replays.put(name, self.fingerprint, record, sent_at, self.retention);
                Tried::Stored
            }
            Ok(false) => {
                let namespace = self.namespace;
                tracing::warn!(
                    namespace,
                    "another request took the key before its response was stored"
                );
                Tried::Taken
            }
            Err(error) => {
                tracing::debug!(namespace = self.namespace, %error, "storing the response failed");
                Tried::Failed
            }
        }
    }

    /// Keeps the reservation alive from now on: the work is done, and its key must not run
    /// out (and run again) while the record is not stored.
    fn keep(&mut self) {
        if let Some(own) = &mut self.own {
            own.enrol_now(self.store.heartbeat());
        }
    }

    /// Tries again in the background until stored, taken, or the retention passed (a record
    /// stored after it would be dropped at once anyway), or until the layer is gone.
    async fn in_background(mut self, since: Instant) {
        let until = since + self.retention;
        let mut pause = LAST_PAUSE;
        loop {
            tokio::time::sleep(pause).await;
            match self.try_once().await {
                Tried::Stored => {
                    tracing::info!(namespace = self.namespace, "the response was stored late");
                    return;
                }
                Tried::Taken => return,
                Tried::Failed if Instant::now() >= until => {
                    let namespace = self.namespace;
                    tracing::warn!(
                        namespace,
                        "the response could not be stored within its retention"
                    );
                    return;
                }
                Tried::Failed => pause = LAST_PAUSE,
            }
        }
    }
}

/// Stores `record` under the reservation `own` within the layer's `complete_within`: `Ok`
/// once stored, else the `503` to answer (storing then goes on in the background unless the
/// key was taken).
pub(in crate::idempotency) async fn complete(
    config: &Config,
    own: KeptLease,
    fingerprint: [u8; FINGERPRINT_LEN],
    record: Bytes,
) -> Result<(), Reason> {
    let since = Instant::now();
    let deadline = since + config.complete_within;
    let mut pending = Pending {
        store: config.store.clone(),
        replays: config.replays.clone(),
        own: Some(own),
        fingerprint,
        record,
        retention: config.idempotency.retention,
        namespace: config.idempotency.definition.namespace,
    };
    let unknown = Reason::IdempotencyOutcomeUnknown {
        retry_after: Some(RETRY_AFTER),
    };
    let mut pause = FIRST_PAUSE;
    let mut warned = false;
    // The layer's coarse timer rather than a tokio timer per request: one deadline for every
    // try, registered only if a try has to wait.
    let mut overdue = Overdue::until(config.first_beat_timer.clone(), deadline);
    loop {
        let tried = {
            let mut call = std::pin::pin!(pending.try_once());
            poll_fn(|cx| match call.as_mut().poll(cx) {
                Poll::Ready(tried) => Poll::Ready(Some(tried)),
                Poll::Pending => overdue.poll(cx).map(|()| None),
            })
            .await
        };
        match tried {
            Some(Tried::Stored) => return Ok(()),
            Some(Tried::Taken) => return Err(unknown),
            Some(Tried::Failed) | None => {}
        }
        if !warned {
            let namespace = pending.namespace;
            tracing::warn!(namespace, "storing the response failed; trying again");
            warned = true;
        }
        pending.keep();
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        let next = (now + pause).min(deadline);
        tokio::time::sleep_until(next).await;
        if next == deadline {
            break;
        }
        pause = (pause * 2).min(LAST_PAUSE);
    }
    tracing::warn!(
        namespace = pending.namespace,
        "the response was not stored in time; answering 503 and storing it in the background"
    );
    config.background.spawn(pending.in_background(since));
    Err(unknown)
}
