//! The heartbeat driver: one task per layer that keeps the layer's held leases alive, sending
//! the extensions that fall due together as one batch.
//!
//! A task per lease costs a timer, a task and a store round trip per lease and beat; at ten
//! thousand held leases that is a good part of a core. One driver sends a due batch with one
//! [`Backend::extend_many`](crate::store::Backend::extend_many) call (one pipeline on Redis) instead.
//!
//! The driver runs only while it has leases: the first lease whose first extension falls due
//! spawns it, and it ends when its last lease is released or lost. So an idle layer owns no
//! task, nothing keeps a runtime busy, and a request that ends before its first beat (most of
//! them) never touches the driver.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{Notify, mpsc};
use tokio::time::{Instant, sleep_until};

use super::lease::Shared;
use crate::Result;
use crate::store::BoxFuture;

/// The most extensions in one store call; a bigger due set goes out as several calls at once,
/// so one slow reply does not hold up every lease.
const MAX_BATCH: usize = 512;

/// The first wait before retrying an extension that failed; it doubles up to a tenth of the TTL.
const FIRST_BACKOFF: Duration = Duration::from_millis(5);

/// The handle on a layer's heartbeat driver, shared by its services.
#[derive(Clone, Default)]
pub(crate) struct Beats {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The running driver's inbox; `None` while no driver runs. Registrations send under the
    /// lock, and the driver ends under it, so no registration lands in a driver that is leaving.
    inbox: Mutex<Option<mpsc::UnboundedSender<(Entry, Instant)>>>,
    /// Registered leases whose guard has not let go yet.
    live: AtomicUsize,
    /// Told when `live` drops to zero, so the driver lets its released leases go and ends now
    /// rather than at their next beat.
    idle: Notify,
}

/// A lease in the driver's care.
struct Entry {
    shared: Arc<Shared>,
    every: Duration,
    stop_at: Option<Instant>,
    backoff: Duration,
    /// `max_hold` is reached: no more extensions, the lease is lost when it runs out.
    ending: bool,
}

impl Beats {
    /// Hands the lease of `shared`, acquired at `acquired_at`, to the driver (spawning it if
    /// none runs); its first extension is due one `every` after the acquisition. Must be called
    /// within a tokio runtime; pair it with one [`deregister`](Self::deregister).
    pub(super) fn register(
        &self,
        shared: Arc<Shared>,
        acquired_at: Instant,
        every: Duration,
        max_hold: Option<Duration>,
    ) {
        let entry = Entry {
            shared,
            every,
            stop_at: max_hold.map(|d| acquired_at + d),
            backoff: FIRST_BACKOFF,
            ending: false,
        };
        let due = acquired_at + every;
        self.inner.live.fetch_add(1, Ordering::AcqRel);
        let mut inbox = self.inner.inbox.lock().unwrap_or_else(|e| e.into_inner());
        // A driver whose runtime shut down left its sender behind: sending fails, start anew.
        let message = match inbox.as_ref() {
            Some(tx) => match tx.send((entry, due)) {
                Ok(()) => return,
                Err(mpsc::error::SendError(message)) => message,
            },
            None => (entry, due),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(message);
        *inbox = Some(tx);
        tokio::spawn(drive(self.inner.clone(), rx));
    }

    /// Says that a registered lease's guard let go (the lease is released or dropped and its
    /// `gone` token cancelled): the driver sends no extension for it from now on.
    pub(super) fn deregister(&self) {
        if self.inner.live.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.inner.idle.notify_one();
        }
    }
}

impl fmt::Debug for Beats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Beats")
            .field("live", &self.inner.live.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// A batch of extensions in flight, and what it found.
struct Flight {
    entries: Vec<Entry>,
    sent_at: Instant,
    /// `None` when the earliest deadline in the batch passed before the store answered.
    answers: Option<Vec<Result<bool>>>,
}

#[derive(Default)]
struct Driver {
    /// Leases by when they are next due: to extend, retry, or (when `ending`) run out.
    schedule: BTreeMap<Instant, Vec<Entry>>,
    flights: Vec<BoxFuture<'static, Flight>>,
}

async fn drive(inner: Arc<Inner>, mut inbox: mpsc::UnboundedReceiver<(Entry, Instant)>) {
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
            flight = driver.landed(), if !driver.flights.is_empty() => driver.settle(flight),
            _ = inbox.recv_many(&mut arrived, MAX_BATCH) => {
                for (entry, due) in arrived.drain(..) {
                    driver.schedule(entry, due);
                }
            }
            () = inner.idle.notified() => driver.prune(),
        }
        if driver.schedule.is_empty() && driver.flights.is_empty() {
            let mut slot = inner.inbox.lock().unwrap_or_else(|e| e.into_inner());
            match inbox.try_recv() {
                Ok((entry, due)) => driver.schedule(entry, due),
                Err(_) => {
                    *slot = None;
                    return;
                }
            }
        }
    }
}

impl Driver {
    /// Puts `entry` in the schedule for its next extension at `next`, or, past `max_hold`, for
    /// the moment it runs out.
    fn schedule(&mut self, mut entry: Entry, next: Instant) {
        if entry.stop_at.is_some_and(|stop| next >= stop) {
            entry.ending = true;
            let until = entry.shared.valid_until();
            self.schedule.entry(until).or_default().push(entry);
        } else {
            self.schedule.entry(next).or_default().push(entry);
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
            .and_then(|(_, entries)| entries.first())
            .map_or(Duration::ZERO, |entry| entry.every / 8);
        let mut batch = Vec::new();
        while let Some(slot) = self.schedule.first_entry() {
            if *slot.key() > now + window {
                break;
            }
            let early = *slot.key() > now;
            for entry in slot.remove() {
                if entry.shared.gone.is_cancelled() {
                    continue;
                }
                let valid_until = entry.shared.valid_until();
                if entry.ending {
                    if now >= valid_until {
                        lost(&entry, "max_hold reached");
                    } else {
                        // Not due yet: only extensions go early.
                        debug_assert!(early);
                        self.schedule.entry(valid_until).or_default().push(entry);
                    }
                } else if now >= valid_until {
                    lost(&entry, "no extension confirmed before the lease ran out");
                } else {
                    batch.push(entry);
                    if batch.len() == MAX_BATCH {
                        self.fly(std::mem::take(&mut batch));
                    }
                }
            }
        }
        if !batch.is_empty() {
            self.fly(batch);
        }
    }

    fn fly(&mut self, entries: Vec<Entry>) {
        let store = entries[0].shared.held.store().clone();
        self.flights.push(Box::pin(async move {
            // A hung call must not make a lease outlive its deadline: give up on the batch at
            // the earliest one, so that lease is declared lost on time and the others retry.
            let deadline = entries
                .iter()
                .map(|entry| entry.shared.valid_until())
                .min()
                .expect("a batch is never empty");
            let sent_at = Instant::now();
            let answers = {
                let leases: Vec<_> = entries.iter().map(|e| e.shared.held.lease_ref()).collect();
                tokio::select! {
                    biased;
                    () = sleep_until(deadline) => None,
                    answers = store.backend().extend_many(&leases) => Some(answers),
                }
            };
            Flight {
                entries,
                sent_at,
                answers,
            }
        }));
    }

    /// Resolves with the first batch whose answers are in.
    async fn landed(&mut self) -> Flight {
        std::future::poll_fn(|cx| {
            for i in 0..self.flights.len() {
                if let Poll::Ready(flight) = self.flights[i].as_mut().poll(cx) {
                    drop(self.flights.swap_remove(i));
                    return Poll::Ready(flight);
                }
            }
            Poll::Pending
        })
        .await
    }

    fn settle(&mut self, flight: Flight) {
        let now = Instant::now();
        let Flight {
            entries,
            sent_at,
            answers,
        } = flight;
        let mut answers = answers.map(Vec::into_iter);
        for mut entry in entries {
            let answer = answers.as_mut().and_then(Iterator::next);
            if entry.shared.gone.is_cancelled() {
                continue;
            }
            match answer {
                Some(Ok(true)) => {
                    entry.shared.confirm(sent_at);
                    entry.backoff = FIRST_BACKOFF;
                    let next = sent_at + entry.every;
                    self.schedule(entry, next);
                }
                Some(Ok(false)) => lost(&entry, "the store no longer holds the lease"),
                failed => {
                    let namespace = entry.shared.held.namespace();
                    match failed {
                        Some(Err(error)) => {
                            tracing::debug!(namespace, %error, "extending the lease failed, retrying");
                        }
                        _ => tracing::debug!(namespace, "extending the lease timed out, retrying"),
                    }
                    let valid_until = entry.shared.valid_until();
                    if now >= valid_until {
                        lost(&entry, "no extension confirmed before the lease ran out");
                        continue;
                    }
                    let retry = (now + entry.backoff).min(valid_until);
                    entry.backoff = (entry.backoff * 2)
                        .min(entry.shared.held.ttl() / 10)
                        .max(Duration::from_millis(1));
                    self.schedule.entry(retry).or_default().push(entry);
                }
            }
        }
    }

    /// Lets go of the released leases waiting for their next beat.
    fn prune(&mut self) {
        self.schedule.retain(|_, entries| {
            entries.retain(|entry| !entry.shared.gone.is_cancelled());
            !entries.is_empty()
        });
    }
}

fn lost(entry: &Entry, reason: &'static str) {
    tracing::warn!(
        namespace = entry.shared.held.namespace(),
        reason,
        "lease lost"
    );
    entry.shared.gone.cancel();
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::sync::atomic::AtomicU8;

    use super::*;
    use crate::layer::lease::{Heartbeat, LeaseGuard};
    use crate::store::{Acquisition, Backend, LeaseRef, MemoryStore, Mode};
    use crate::token::{Attempt, Holding};
    use crate::{Error, Lock, Store};

    const LOCK: Lock<str> = Lock::new("driver", Duration::from_millis(300));
    const EVERY: Duration = Duration::from_millis(100);

    const ANSWER: u8 = 0;
    const FAIL: u8 = 1;
    const HANG: u8 = 2;
    const GONE: u8 = 3;

    /// The memory store, with extensions that can fail, hang or find the lease gone, and a
    /// record of every batch's size.
    #[derive(Default)]
    struct Scripted {
        memory: MemoryStore,
        extends: AtomicU8,
        batches: Mutex<Vec<usize>>,
    }

    impl Backend for Arc<Scripted> {
        fn acquire<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Acquisition>> {
            self.memory.acquire(lease)
        }

        fn extend<'a>(&'a self, _: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
            unreachable!("the driver extends in batches")
        }

        fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
            self.memory.release(lease)
        }

        fn extend_many<'a>(
            &'a self,
            leases: &'a [LeaseRef<'a>],
        ) -> BoxFuture<'a, Vec<Result<bool>>> {
            self.batches.lock().unwrap().push(leases.len());
            match self.extends.load(Ordering::SeqCst) {
                ANSWER => self.memory.extend_many(leases),
                FAIL => Box::pin(async move {
                    let timeout = || Err(Error::Timeout(Duration::from_millis(1)));
                    leases.iter().map(|_| timeout()).collect()
                }),
                HANG => Box::pin(std::future::pending()),
                _ => Box::pin(async move { leases.iter().map(|_| Ok(false)).collect() }),
            }
        }
    }

    fn scripted() -> (Arc<Scripted>, Store) {
        let backend = Arc::new(Scripted::default());
        (backend.clone(), Store::from_backend(backend))
    }

    /// Acquires `name` now and hands it to `beats` at once, as a body holding the lease does.
    async fn hold(store: &Store, beats: &Beats, name: &str) -> LeaseGuard {
        let sent_at = Instant::now();
        let name = Cow::Owned(name.as_bytes().to_vec());
        let held = match Holding::acquire(store.clone(), LOCK.spec(), Mode::Exclusive, name)
            .await
            .unwrap()
        {
            Attempt::Acquired(held) => held,
            Attempt::Busy { .. } => panic!("free at first"),
        };
        let config = Heartbeat {
            every: EVERY,
            max_hold: None,
        };
        let mut guard = LeaseGuard::start(held, sent_at, config);
        guard.spawn_heartbeat(beats);
        guard
    }

    fn alive_tasks() -> usize {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    }

    #[tokio::test(start_paused = true)]
    async fn leases_due_at_nearby_moments_share_one_task_and_one_call_per_beat() {
        let (backend, store) = scripted();
        let beats = Beats::default();
        let mut guards = Vec::new();
        // 100 leases taken 1 ms apart: their first beats spread over 100 ms.
        for i in 0..100 {
            guards.push(hold(&store, &beats, &format!("n{i}")).await);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(alive_tasks(), 1, "one driver, not a task per lease");
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(guards.iter().all(|g| g.valid_at(Instant::now())));

        let batches = backend.batches.lock().unwrap().clone();
        let extends: usize = batches.iter().sum();
        // About 30 beats of 100 leases; sending a little early may add a few.
        assert!((2_900..=3_600).contains(&extends), "{extends} extends");
        // The first beat gathers an eighth of a beat's worth (13 leases); the groups stay
        // together after that, so about 8 calls per beat instead of 100.
        assert!(batches.len() * 8 <= extends, "{} calls", batches.len());

        for guard in guards {
            guard.release().await;
        }
        tokio::task::yield_now().await;
        assert_eq!(alive_tasks(), 0, "the driver ends with its last lease");
        let calls = backend.batches.lock().unwrap().len();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            backend.batches.lock().unwrap().len(),
            calls,
            "no extend after release"
        );

        // And it starts again on demand.
        let guard = hold(&store, &beats, "again").await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(guard.valid_at(Instant::now()));
        assert_eq!(alive_tasks(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_store_loses_the_lease_at_its_deadline_not_later() {
        let (backend, store) = scripted();
        let beats = Beats::default();
        let started = Instant::now();
        let guard = hold(&store, &beats, "hung").await;
        backend.extends.store(HANG, Ordering::SeqCst);
        guard.lease().lost().await;
        // The extend sent at 100 ms never answers; the lease ends at 300 − (3 + 2) ms.
        assert_eq!(started.elapsed(), Duration::from_millis(295));
        assert!(!guard.valid_at(Instant::now()));
    }

    #[tokio::test(start_paused = true)]
    async fn errors_are_retried_until_the_deadline() {
        let (backend, store) = scripted();
        let beats = Beats::default();
        let started = Instant::now();
        let kept = hold(&store, &beats, "kept").await;
        backend.extends.store(FAIL, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(200)).await;
        let failed = backend.batches.lock().unwrap().len();
        assert!(failed >= 4, "retried with a short backoff: {failed} calls");
        backend.extends.store(ANSWER, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert!(kept.valid_at(Instant::now()), "a retry got through in time");

        // Failing for good: lost at the deadline of the last confirmed extend, not after.
        backend.extends.store(FAIL, Ordering::SeqCst);
        let last = backend.batches.lock().unwrap().len();
        kept.lease().lost().await;
        let now = Instant::now();
        assert!(backend.batches.lock().unwrap().len() > last);
        assert_eq!(
            now,
            kept.shared().valid_until(),
            "lost at its deadline ({:?} in)",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(alive_tasks(), 0, "nothing left to extend");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_the_store_no_longer_holds_is_lost_at_the_beat() {
        let (backend, store) = scripted();
        let beats = Beats::default();
        let started = Instant::now();
        let gone = hold(&store, &beats, "gone").await;
        let other = hold(&store, &beats, "other").await;
        backend.extends.store(GONE, Ordering::SeqCst);
        gone.lease().lost().await;
        assert_eq!(started.elapsed(), EVERY);
        assert!(
            !other.valid_at(Instant::now()),
            "the store answered false for both"
        );
    }
}
