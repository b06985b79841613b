//! Bounded waiting for a lock on a [`Store`]: a turn in the store's waiting room for the name,
//! then attempts woken by this process's releases, the store's release notifications and the
//! holder's lease end, with jittered polling for releases elsewhere.

use std::borrow::Cow;
use std::time::Duration;

use tokio::time::{Instant, sleep_until};

use crate::backend::{Fairness, Mode, Secret};
use crate::definition::Definition;
use crate::definition::attempt::{Attempt, outcome};
use crate::lease::finish_on_drop::{Acquired, FinishOnDrop};
use crate::locks::wait::write_intent::KeptIntent;
use crate::locks::wait::{Backoff, MAX_POLL};
use crate::store::Store;
use crate::store::raw::RawLease;
use crate::telemetry::{self, AcquireOutcome};

/// With release notifications, attempts follow the notifications and the holder's lease end;
/// a slow poll remains, in case a notification is lost (a subscription that raced its own
/// removal, a publish on a node that failed over).
const WATCHED_POLL: Duration = Duration::from_secs(1);

/// Takes the lease on `name`, waiting up to `wait` while someone else holds it; answers the
/// instant the successful (or last) attempt was sent, and what it found.
///
/// Each attempt that reached the store finishes even if this future is dropped (a lease it took
/// is given back); dropping it between attempts leaves nothing behind: no seat, no lease. A
/// writer of a phase-fair or writers-first lock keeps its write intent alive while it waits (see
/// [`KeptIntent`]), and withdraws it when it gives up or is dropped.
/// `on_store_error` is what a store failure counts as in the metrics.
pub(crate) async fn acquire_within(
    store: Store,
    definition: Definition,
    mode: Mode,
    name: Box<[u8]>,
    wait: Duration,
    on_store_error: AcquireOutcome,
) -> Acquired {
    let namespace = definition.namespace;
    let started = Instant::now();
    if let Err(invalid) = crate::name::check_name(&name) {
        telemetry::refused(namespace, mode, AcquireOutcome::InvalidName);
        return (started, Err(invalid));
    }
    let deadline = started + wait;
    let _waiting = Waiting::start(namespace, mode);
    let seat = store.wait_rooms().enter(mode, namespace, &name);
    let mut backoff = Backoff::new();
    // One secret for every attempt, which the write intent they leave holds; it says when
    // the wait began, so that phase-fair writers go in that order across processes.
    let secret = Secret::queued();
    let mut intent = KeptIntent::new(&store, definition, mode, &name, &secret);
    // `waited`: whether this acquisition waited at all (in the queue, or between attempts); one
    // that got its answer from the first attempt counts no wait.
    let end = |outcome: AcquireOutcome, waited: bool| {
        let waited = waited.then(|| started.elapsed());
        telemetry::waited(namespace, mode, outcome, waited)
    };
    // Only the first waiter of the name in this process contends; the others queue, and the
    // turn passes on when this one is done (served, out of time, or dropped).
    // Phase-fair readers each note themselves as waiting in the store, so they all contend.
    let together = mode == Mode::Read && definition.fairness.has_read_phases();
    let turn = loop {
        if together {
            break seat.together();
        }
        if let Some(turn) = seat.turn(deadline).await {
            break turn;
        }
        // The wait ran out in the queue: one attempt still says who holds it, and for how
        // long, so the answer is as exact as an immediate refusal; it leaves no write intent:
        // the waiter whose turn it is keeps one, and this one gives up. Or the waiter with the
        // turn found the store failing: this one's own attempt ends its wait with the store's
        // error too, or if the store answers, queues it again.
        let probe = Definition {
            fairness: Fairness::ReadersFirst,
            ..definition
        };
        let (sent_at, attempt) = attempt(&store, probe, mode, &name, &secret, false).await;
        if matches!(attempt, Ok(Attempt::Busy { .. })) && Instant::now() < deadline {
            continue;
        }
        end(outcome(&attempt, true, on_store_error), true);
        return (sent_at, attempt);
    };
    // Subscribed only once an attempt was refused, and then, for a new subscription, tried
    // again at once, so that a release published before the subscription is not missed: a subscription never holds up
    // the first attempt, and a store that fails (Redis down, a network cut, where subscribing
    // may hang) ends the wait with that attempt's error at once.
    let mut unwatched = store.has_notifications();
    let mut watch: Option<crate::store::Watch> = None;
    let mut held_here = turn.inherit_held();
    // Whether it waited before the attempt that answers: in the queue, or between attempts.
    let mut waited = turn.queued;
    if held_here && std::mem::take(&mut unwatched) {
        // The lock is this process's: there is no attempt to hold up, and the subscription
        // made now sees the release, so the attempt after it is the only one.
        watch = store.watch(mode, namespace, &name, deadline).await;
    }
    loop {
        let released = turn.released();
        // The lock is this process's, taken by the waiter before: wait for its release.
        let waits_here = std::mem::take(&mut held_here) && Instant::now() < deadline;
        if let (false, Some(watch)) = (waits_here, &mut watch) {
            // Woken by this process's release, a waiter may hear it published too: the attempt
            // it sends now sees it, so it sends no second one for it.
            watch.heard();
        }
        let mut published = watch.as_mut().map(|watch| watch.released());
        let retry_after = if waits_here {
            None
        } else {
            // The last attempt, at the deadline, is not noted as a waiting reader's.
            let waiting = Instant::now() < deadline;
            let (sent_at, attempt) =
                attempt(&store, definition, mode, &name, &secret, waiting).await;
            if let (Some(intent), Ok(Attempt::Busy { .. })) = (&mut intent, &attempt) {
                intent.refused();
            }
            match &attempt {
                Ok(Attempt::Acquired(_)) => {
                    if let Some(intent) = intent.take() {
                        intent.acquired();
                    }
                    // Readers and permits share: the next waiter may well get in too.
                    if matches!(mode, Mode::Exclusive | Mode::Write) {
                        turn.pass_on_held();
                    }
                    end(outcome(&attempt, waited, on_store_error), waited);
                    return (sent_at, attempt);
                }
                Err(_) => {
                    turn.pass_on_failure();
                    end(outcome(&attempt, waited, on_store_error), waited);
                    return (sent_at, attempt);
                }
                Ok(Attempt::Busy { .. }) if Instant::now() >= deadline => {
                    end(outcome(&attempt, true, on_store_error), true);
                    // Readers need not wait for a writer that is gone.
                    if let Some(intent) = intent.take() {
                        intent.withdraw().await;
                    }
                    return (sent_at, attempt);
                }
                Ok(Attempt::Busy { retry_after }) => Some(*retry_after),
            }
        };
        if std::mem::take(&mut unwatched) {
            drop(published);
            watch = store.watch(mode, namespace, &name, deadline).await;
            // A release may have come between the refusal and the watch: a subscription made
            // just now tries again here, and a watch that joined this process's others ends
            // its first wait at once.
            if watch.as_ref().is_some_and(|watch| watch.subscribed_now()) {
                continue;
            }
            published = watch.as_mut().map(|watch| watch.released());
        }
        let now = Instant::now();
        let until_lease_end = retry_after.map(|r| r + Duration::from_millis(1));
        let pause = match (&published, until_lease_end) {
            (Some(_), Some(lease_end)) => WATCHED_POLL.min(lease_end),
            (Some(_), None) => WATCHED_POLL,
            (None, Some(_)) => backoff.after(retry_after.unwrap_or_default()),
            (None, None) => MAX_POLL,
        };
        let pause = match &intent {
            Some(intent) => pause.min(intent.renew_within()),
            None => pause,
        };
        // With notifications that bring this process's own releases back as messages, waking
        // for both would send a second attempt per release: such a waiter wakes on messages
        // only. A store whose notifications leave its own releases out (Redis) wakes on the
        // release here and on messages, each release once. Not when waiting on this process's
        // own lease (no attempt was sent, so none marked the name) on a store that announces
        // only the releases someone was refused for: there the release here is the only
        // signal, and the same release heard as a message (published for waiters elsewhere)
        // must not wake it a second time; the attempt that follows counts what was delivered
        // by then as heard (`Watch::heard`).
        let own_release_unannounced = retry_after.is_none() && !store.announces_every_release();
        let by_notification_only =
            published.is_some() && !own_release_unannounced && store.delivers_own_releases();
        let published = async {
            match published {
                Some(published) => published.await,
                None => std::future::pending().await,
            }
        };
        waited = true;
        tokio::select! {
            () = released, if !by_notification_only => {}
            () = published, if !own_release_unannounced => {}
            // Past the deadline, the loop makes its last attempt.
            () = sleep_until(deadline.min(now + pause)) => {}
        }
    }
}

/// One attempt with `secret`, with the instant it was sent; finished in a task of its own if the waiter is
/// dropped while it is on the wire. `waiting`: the wait goes on if it is refused (see
/// [`LeaseRef::waiting`](crate::backend::LeaseRef::waiting)).
async fn attempt(
    store: &Store,
    definition: Definition,
    mode: Mode,
    name: &[u8],
    secret: &Secret,
    waiting: bool,
) -> Acquired {
    let (store, name, secret) = (store.clone(), name.to_vec(), secret.clone());
    let call = Box::pin(async move {
        // Taken before the command leaves, so the lease's end is never overestimated.
        let sent_at = Instant::now();
        let name = Cow::Owned(name);
        let attempt =
            RawLease::acquire_with_secret(store, definition, mode, name, None, secret, waiting)
                .await;
        (sent_at, attempt)
    });
    FinishOnDrop::acquisition(call).await
}

/// A waiter, for the `tower_lease_waiters` gauge.
struct Waiting {
    namespace: &'static str,
    mode: Mode,
}

impl Waiting {
    fn start(namespace: &'static str, mode: Mode) -> Self {
        telemetry::waiters(namespace, mode, 1.0);
        Waiting { namespace, mode }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        telemetry::waiters(self.namespace, self.mode, -1.0);
    }
}
