//! The heartbeat driver: the task that extends a layer's enrolled leases in batches.
//!
//! # Lifecycle
//!
//! - **Starts** when a lease is enrolled and no driver runs for the layer: the first lease
//!   whose first extension falls due spawns it ([`Heartbeat::enrol`](super::Heartbeat::enrol)).
//!   So an idle layer owns no task, and a request that ends before its first beat (most of
//!   them) never touches the driver.
//! - **Owns** the schedule of its enrolled leases (when each is next due) and the batches of
//!   extensions it has sent and not yet heard back from. It holds each lease's shared state,
//!   never its release: guards release, the driver only extends or declares lost.
//! - **Stops** when it has no lease left to extend and no batch in flight: it takes its inbox
//!   out of the layer's slot under the slot's lock, so the next enrolment starts a new driver.
//!   A lease leaves its schedule when it is declared lost, or at its next due time once its
//!   guard marked it over; when the last enrolled guard withdraws, the driver is told at once
//!   and lets the rest go, so it does not linger until their next beat.
//! - **A dropped guard** (client gone) marks its lease over and withdraws it before spawning
//!   the release, so the driver never extends a lease that is being released. If the runtime
//!   shuts down, the task is dropped with it and the leases run out by their TTL.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};

use super::{DriverSlot, HeartbeatTiming};
use crate::Result;
use crate::backend::{BoxFuture, Extended};
use crate::store::LeaseState;
use crate::telemetry::{self, ExtendOutcome, LossReason};

/// The most extensions in one store call; a bigger due set goes out as several calls at once,
/// so one slow reply does not hold up every lease.
const MAX_BATCH: usize = 512;

/// The first wait before retrying an extension that failed; it doubles up to a tenth of the TTL.
const FIRST_BACKOFF: Duration = Duration::from_millis(5);

/// A lease in the driver's care.
pub(super) struct EnrolledLease {
    state: Arc<LeaseState>,
    every: Duration,
    stop_at: Option<Instant>,
    backoff: Duration,
    /// `max_hold` is reached: no more extensions, the lease is lost when it runs out.
    ending: bool,
}

impl EnrolledLease {
    pub(super) fn new(
        state: Arc<LeaseState>,
        acquired_at: Instant,
        timing: HeartbeatTiming,
    ) -> Self {
        Self {
            state,
            every: timing.every,
            stop_at: timing.max_hold.map(|d| acquired_at + d),
            backoff: FIRST_BACKOFF,
            ending: false,
        }
    }
}

/// A batch of extensions sent to the store, and what it answered.
struct SentBatch {
    leases: Vec<EnrolledLease>,
    sent_at: Instant,
    /// `None` when the earliest expiry in the batch passed before the store answered.
    answers: Option<Vec<Result<Extended>>>,
}

#[derive(Default)]
struct Driver {
    /// Leases by when they are next due: to extend, retry, or (when `ending`) run out.
    schedule: BTreeMap<Instant, Vec<EnrolledLease>>,
    /// Batches sent and not answered yet.
    unanswered: FuturesUnordered<BoxFuture<'static, SentBatch>>,
}

/// The driver's task: runs until it has nothing left to extend (see the module docs).
pub(super) async fn drive(
    slot: Arc<DriverSlot>,
    mut inbox: mpsc::UnboundedReceiver<(EnrolledLease, Instant)>,
) {
    let mut driver = Driver::default();
    let mut arrived = Vec::new();
    loop {
        let next = driver.schedule.first_key_value().map(|(at, _)| *at);
        tokio::select! {
            // Sending what is due comes first: a flood of new leases must not delay it.
            biased;
            () = sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {
                driver.send_due();
            }
            Some(batch) = driver.unanswered.next(), if !driver.unanswered.is_empty() => {
                driver.apply_answers(batch);
            }
            _ = inbox.recv_many(&mut arrived, MAX_BATCH) => {
                for (lease, due) in arrived.drain(..) {
                    driver.schedule(lease, due);
                }
            }
            () = slot.idle.notified() => driver.forget_ended(),
        }
        if driver.schedule.is_empty() && driver.unanswered.is_empty() {
            let mut inbox_slot = slot.inbox.lock().unwrap_or_else(|e| e.into_inner());
            match inbox.try_recv() {
                Ok((lease, due)) => driver.schedule(lease, due),
                Err(_) => {
                    *inbox_slot = None;
                    return;
                }
            }
        }
    }
}

impl Driver {
    /// Puts `lease` in the schedule for its next extension at `next`, or, past `max_hold`, for
    /// the moment it runs out.
    fn schedule(&mut self, mut lease: EnrolledLease, next: Instant) {
        if lease.stop_at.is_some_and(|stop| next >= stop) {
            lease.ending = true;
            let until = lease.state.valid_until();
            self.schedule.entry(until).or_default().push(lease);
        } else {
            self.schedule.entry(next).or_default().push(lease);
        }
    }

    /// Sends the extensions that are due, together with those due within an eighth of a beat:
    /// sending a little early costs nothing (the lease counts from the send) and puts leases
    /// acquired at nearby moments in one batch from then on.
    fn send_due(&mut self) {
        let now = Instant::now();
        let window = self
            .schedule
            .first_key_value()
            .and_then(|(_, leases)| leases.first())
            .map_or(Duration::ZERO, |lease| lease.every / 8);
        let mut batch = Vec::new();
        while let Some(slot) = self.schedule.first_entry() {
            if *slot.key() > now + window {
                break;
            }
            let early = *slot.key() > now;
            for lease in slot.remove() {
                if lease.state.is_over() {
                    continue;
                }
                let valid_until = lease.state.valid_until();
                if lease.ending {
                    if now >= valid_until {
                        lease.state.declare_lost(LossReason::MaxHold);
                    } else {
                        // Not due yet: only extensions go early.
                        debug_assert!(early);
                        self.schedule.entry(valid_until).or_default().push(lease);
                    }
                } else if now >= valid_until {
                    lease.state.declare_lost(LossReason::Expired);
                } else {
                    batch.push(lease);
                    if batch.len() == MAX_BATCH {
                        self.send_batch(std::mem::take(&mut batch));
                    }
                }
            }
        }
        if !batch.is_empty() {
            self.send_batch(batch);
        }
    }

    fn send_batch(&mut self, leases: Vec<EnrolledLease>) {
        let store = leases[0].state.holding.store().clone();
        self.unanswered.push(Box::pin(async move {
            // A hung call must not make a lease outlive its expiry: give up on the batch at
            // the earliest one, so that lease is declared lost on time and the others retry.
            let deadline = leases
                .iter()
                .map(|lease| lease.state.valid_until())
                .min()
                .expect("a batch is never empty");
            let sent_at = Instant::now();
            let answers = {
                let refs: Vec<_> = leases.iter().map(|l| l.state.holding.lease_ref()).collect();
                tokio::select! {
                    biased;
                    () = sleep_until(deadline) => None,
                    answers = store.extend_many(&refs) => Some(answers),
                }
            };
            SentBatch {
                leases,
                sent_at,
                answers,
            }
        }));
    }

    fn apply_answers(&mut self, batch: SentBatch) {
        let now = Instant::now();
        let SentBatch {
            leases,
            sent_at,
            answers,
        } = batch;
        let mut answers = answers.map(Vec::into_iter);
        for mut lease in leases {
            let answer = answers.as_mut().and_then(Iterator::next);
            if lease.state.is_over() {
                continue;
            }
            let (namespace, mode) = (lease.state.holding.namespace(), lease.state.holding.mode());
            let outcome = match answer {
                Some(Ok(Extended::Gone)) => ExtendOutcome::Lost,
                Some(Ok(_)) => ExtendOutcome::Ok,
                _ => ExtendOutcome::Error,
            };
            telemetry::extend(namespace, mode, outcome);
            match answer {
                Some(Ok(extended @ (Extended::Held | Extended::HeldWriterWaiting))) => {
                    if extended == Extended::HeldWriterWaiting {
                        // A shared read lease stops taking new requests, so the writer gets in.
                        lease.state.writer_waits();
                    }
                    lease.state.confirm(sent_at);
                    lease.backoff = FIRST_BACKOFF;
                    let next = sent_at + lease.every;
                    self.schedule(lease, next);
                }
                Some(Ok(Extended::Gone)) => lease.state.declare_lost(LossReason::StoreSaidGone),
                failed => {
                    match failed {
                        Some(Err(error)) => {
                            tracing::debug!(namespace, %error, "extending the lease failed, retrying");
                        }
                        _ => tracing::debug!(namespace, "extending the lease timed out, retrying"),
                    }
                    let valid_until = lease.state.valid_until();
                    if now >= valid_until {
                        lease.state.declare_lost(LossReason::Expired);
                        continue;
                    }
                    let retry = (now + lease.backoff).min(valid_until);
                    lease.backoff = (lease.backoff * 2)
                        .min(lease.state.holding.ttl() / 10)
                        .max(Duration::from_millis(1));
                    self.schedule.entry(retry).or_default().push(lease);
                }
            }
        }
    }

    /// Lets go of the leases that are over, waiting for their next beat.
    fn forget_ended(&mut self) {
        self.schedule.retain(|_, leases| {
            leases.retain(|lease| !lease.state.is_over());
            !leases.is_empty()
        });
    }
}
