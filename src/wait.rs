//! Bounded waiting for a lock: a queue per name in this process, woken by this process's
//! releases and by the holder's lease end, with jittered polling for releases elsewhere.
//!
//! Within one process only the first waiter of a name contends on the store; the others wait
//! their turn, first come first served, so a release wakes one contender per process, never a
//! herd. The turn is a one-permit [`tokio::sync::Semaphore`], whose queue is FIFO.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::time::{Instant, sleep_until};

use crate::finish_on_drop::{Acquired, FinishOnDrop};
use crate::lock::Spec;
use crate::store::{Mode, Secret, Store};
use crate::telemetry::{self, AcquireOutcome};
use crate::token::{Attempt, Holding};
use crate::write_intent::KeptIntent;

/// The first wait between polls for a release in another process; it doubles up to
/// [`MAX_POLL`], never past the holder's remaining lease.
const FIRST_POLL: Duration = Duration::from_millis(5);
const MAX_POLL: Duration = Duration::from_millis(100);

/// With release notifications, attempts follow the notifications and the holder's lease end;
/// a slow poll remains, in case a notification is lost (a subscription that raced its own
/// removal, a publish on a node that failed over).
const WATCHED_POLL: Duration = Duration::from_secs(1);

/// Which lease a waiter waits for. Readers and writers of an `RwLock` wait in rooms of their
/// own: a waiting writer must not hold back readers that would be let in at once, nor the
/// other way round.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Name {
    mode: Mode,
    namespace: &'static str,
    name: Box<[u8]>,
}

impl Name {
    fn new(mode: Mode, namespace: &'static str, name: &[u8]) -> Self {
        Name {
            mode,
            namespace,
            name: name.into(),
        }
    }
}

/// The waiters of one name in this process.
struct Room {
    /// One permit: whoever holds it contends on the store.
    turn: Semaphore,
    /// Told when this process releases a lease of the name.
    released: Notify,
    /// Told when the waiter with the turn found the store failing: the others try at once
    /// rather than queue behind one failing call after another until their deadlines.
    store_failed: Notify,
    /// Set by a waiter that took the lock as it passes the turn on: the next one waits for this
    /// process's release instead of asking the store about a lock it knows is held.
    held_here: AtomicBool,
}

/// A store's waiting rooms, one per name that has waiters.
#[derive(Default)]
pub(crate) struct WaitRooms {
    rooms: Mutex<HashMap<Name, Arc<Room>>>,
    /// How many rooms there are, read without the lock: every release asks, and almost always
    /// nobody waits.
    open: AtomicUsize,
}

impl fmt::Debug for WaitRooms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner()).len();
        f.debug_struct("WaitRooms").field("rooms", &rooms).finish()
    }
}

impl WaitRooms {
    /// Enters the room of `name`; leaving is dropping the [`Seat`].
    pub(crate) fn enter(
        self: &Arc<Self>,
        mode: Mode,
        namespace: &'static str,
        name: &[u8],
    ) -> Seat {
        let name = Name::new(mode, namespace, name);
        let mut rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        // Cloned under the map's lock, as seats are dropped, so a room's count of references
        // says how many are seated.
        let room = rooms.entry(name.clone()).or_insert_with(|| {
            Arc::new(Room {
                turn: Semaphore::new(1),
                released: Notify::new(),
                store_failed: Notify::new(),
                held_here: AtomicBool::new(false),
            })
        });
        let room = room.clone();
        self.open.store(rooms.len(), Ordering::Release);
        Seat {
            rooms: self.clone(),
            name,
            room,
        }
    }

    /// Says this process released a lease of `name`: the waiter whose turn it is tries now.
    pub(crate) fn released(&self, mode: Mode, namespace: &'static str, name: &[u8]) {
        if self.open.load(Ordering::Acquire) == 0 {
            return;
        }
        let rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        // Any release of an `RwLock` may let readers or writers in.
        let freed: &[Mode] = match mode {
            Mode::Exclusive => &[Mode::Exclusive],
            Mode::Permit => &[Mode::Permit],
            Mode::Reservation => &[Mode::Reservation],
            Mode::Read | Mode::Write => &[Mode::Read, Mode::Write],
        };
        let mut name = Name::new(mode, namespace, name);
        for &mode in freed {
            name.mode = mode;
            if let Some(room) = rooms.get(&name) {
                room.released.notify_one();
            }
        }
    }

    /// How many names have waiters in this process (for tests: 0 once every waiter is gone).
    #[cfg(test)]
    pub(crate) fn rooms(&self) -> usize {
        self.rooms.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A waiter's place in the room of a name; the room goes with its last seat.
pub(crate) struct Seat {
    rooms: Arc<WaitRooms>,
    name: Name,
    room: Arc<Room>,
}

impl Seat {
    /// Waits for this waiter's turn to contend, until `deadline`; `None` when it passed first,
    /// or when the waiter with the turn found the store failing.
    pub(crate) async fn turn(&self, deadline: Instant) -> Option<Turn<'_>> {
        if let Ok(_permit) = self.room.turn.try_acquire() {
            let queued = false;
            return Some(Turn {
                seat: self,
                _permit,
                queued,
            });
        }
        tokio::select! {
            permit = self.room.turn.acquire() => {
                let _permit = permit.expect("the turn semaphore is never closed");
                let queued = true;
                Some(Turn { seat: self, _permit, queued })
            }
            () = self.room.store_failed.notified() => None,
            () = sleep_until(deadline) => None,
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut rooms = self.rooms.rooms.lock().unwrap_or_else(|e| e.into_inner());
        // The map's copy and ours: nobody else is seated.
        if Arc::strong_count(&self.room) == 2 {
            rooms.remove(&self.name);
            self.rooms.open.store(rooms.len(), Ordering::Release);
        }
    }
}

/// The right to contend on the store for a name, until dropped.
pub(crate) struct Turn<'a> {
    seat: &'a Seat,
    _permit: tokio::sync::SemaphorePermit<'a>,
    /// Whether the waiter queued for it behind others of this process.
    queued: bool,
}

impl Turn<'_> {
    /// A wake-up registered now, before the attempt it follows, so a release that lands between
    /// the attempt and the wait is not missed.
    pub(crate) fn released(&self) -> tokio::sync::futures::Notified<'_> {
        self.seat.room.released.notified()
    }

    /// Whether the waiter that had the turn before took the lock (and so this process holds it).
    fn inherit_held(&self) -> bool {
        self.seat.room.held_here.swap(false, Ordering::AcqRel)
    }

    /// Says the store failed this waiter's attempt, for the ones queued behind it.
    fn pass_on_failure(&self) {
        self.seat.room.store_failed.notify_waiters();
    }

    /// Says this waiter took the lock, for the next one.
    fn pass_on_held(&self) {
        self.seat.room.held_here.store(true, Ordering::Release);
    }
}

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

/// Takes the lease on `name`, waiting up to `wait` while someone else holds it; answers the
/// instant the successful (or last) attempt was sent, and what it found.
///
/// Each attempt that reached the store finishes even if this future is dropped (a lease it took
/// is given back); dropping it between attempts leaves nothing behind: no seat, no lease. A
/// writer of a writer-preferred lock keeps its write intent alive while it waits (see
/// [`KeptIntent`]), and withdraws it when it gives up or is dropped.
/// `on_store_error` is what a store failure counts as in the metrics.
pub(crate) async fn acquire_within(
    store: Store,
    spec: Spec,
    mode: Mode,
    name: Box<[u8]>,
    wait: Duration,
    on_store_error: AcquireOutcome,
) -> Acquired {
    let namespace = spec.namespace;
    let started = Instant::now();
    if let Err(invalid) = crate::name::check_name(&name) {
        telemetry::refused(namespace, mode, AcquireOutcome::InvalidName);
        return (started, Err(invalid));
    }
    let deadline = started + wait;
    let _waiting = Waiting::start(namespace, mode);
    let seat = store.wait_rooms().enter(mode, namespace, &name);
    let mut backoff = Backoff::new();
    // One secret for every attempt, which the write intent they leave holds.
    let secret = Secret::random();
    let mut intent = KeptIntent::new(&store, spec, mode, &name, &secret);
    // `waited`: whether this acquisition waited at all (in the queue, or between attempts); one
    // that got its answer from the first attempt counts no wait.
    let end = |outcome: AcquireOutcome, waited: bool| {
        let waited = waited.then(|| started.elapsed());
        telemetry::waited(namespace, mode, outcome, waited)
    };
    // Only the first waiter of the name in this process contends; the others queue, and the
    // turn passes on when this one is done (served, out of time, or dropped).
    let turn = loop {
        if let Some(turn) = seat.turn(deadline).await {
            break turn;
        }
        // The wait ran out in the queue: one attempt still says who holds it, and for how
        // long, so the answer is as exact as an immediate refusal; it leaves no write intent:
        // the waiter whose turn it is keeps one, and this one gives up. Or the waiter with the
        // turn found the store failing: this one's own attempt ends its wait with the store's
        // error too, or if the store answers, queues it again.
        let probe = Spec {
            writer_preferred: false,
            ..spec
        };
        let (sent_at, attempt) = attempt(&store, probe, mode, &name, &secret).await;
        if matches!(attempt, Ok(Attempt::Busy { .. })) && Instant::now() < deadline {
            continue;
        }
        let outcome = match &attempt {
            Ok(Attempt::Acquired(_)) => AcquireOutcome::Waited,
            Ok(Attempt::Busy { .. }) => AcquireOutcome::TimedOutWaiting,
            Err(_) => on_store_error,
        };
        end(outcome, true);
        return (sent_at, attempt);
    };
    // Subscribed only once an attempt was refused, and then, for a new subscription, tried
    // again at once, so that a release published before the subscription is not missed: a subscription never holds up
    // the first attempt, and a store that fails (Redis down, a network cut, where subscribing
    // may hang) ends the wait with that attempt's error at once.
    let mut unwatched = store.notifications();
    let mut watch: Option<crate::store::Watch> = None;
    let mut held_here = turn.inherit_held();
    // Whether it waited before the attempt that answers: in the queue, or between attempts.
    let mut waited = turn.queued;
    if held_here && let Some(notifications) = unwatched.take() {
        // The lock is this process's: there is no attempt to hold up, and the subscription
        // made now sees the release, so the attempt after it is the only one.
        watch = notifications.watch(mode, namespace, &name, deadline).await;
    }
    loop {
        let released = turn.released();
        let mut published = watch.as_ref().map(|watch| watch.released());
        let now = Instant::now();
        // The lock is this process's, taken by the waiter before: wait for its release.
        let retry_after = if std::mem::take(&mut held_here) && now < deadline {
            None
        } else {
            let (sent_at, attempt) = attempt(&store, spec, mode, &name, &secret).await;
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
                    if waited {
                        end(AcquireOutcome::Waited, true);
                    } else {
                        end(AcquireOutcome::Acquired, false);
                    }
                    return (sent_at, attempt);
                }
                Err(_) => {
                    turn.pass_on_failure();
                    end(on_store_error, waited);
                    return (sent_at, attempt);
                }
                Ok(Attempt::Busy { .. }) if Instant::now() >= deadline => {
                    end(AcquireOutcome::TimedOutWaiting, true);
                    // Readers need not wait for a writer that is gone.
                    if let Some(intent) = intent.take() {
                        intent.withdraw().await;
                    }
                    return (sent_at, attempt);
                }
                Ok(Attempt::Busy { retry_after }) => Some(*retry_after),
            }
        };
        if let Some(notifications) = unwatched.take() {
            drop(published);
            watch = notifications.watch(mode, namespace, &name, deadline).await;
            // A release published on a channel this process already watched wakes the watch
            // even before it waits (the notification keeps a permit); only a subscription made
            // just now may have missed one.
            if watch.as_ref().is_some_and(|watch| watch.subscribed_now()) {
                continue;
            }
            published = watch.as_ref().map(|watch| watch.released());
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
        let published = async {
            match published {
                Some(published) => published.await,
                None => std::future::pending().await,
            }
        };
        waited = true;
        tokio::select! {
            // With notifications, this process's own releases arrive as messages too: waking
            // for both would send a second attempt per release.
            () = released, if watch.is_none() => {}
            () = published => {}
            // Past the deadline, the loop makes its last attempt.
            () = sleep_until(deadline.min(now + pause)) => {}
        }
    }
}

/// One attempt with `secret`, with the instant it was sent; finished in a task of its own if the waiter is
/// dropped while it is on the wire.
async fn attempt(store: &Store, spec: Spec, mode: Mode, name: &[u8], secret: &Secret) -> Acquired {
    let (store, name, secret) = (store.clone(), name.to_vec(), secret.clone());
    let call = Box::pin(async move {
        // Taken before the command leaves, so the lease's end is never overestimated.
        let sent_at = Instant::now();
        let name = Cow::Owned(name);
        let attempt = Holding::acquire_with(store, spec, mode, name, None, secret).await;
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

#[cfg(test)]
#[path = "wait_tests.rs"]
mod tests;
