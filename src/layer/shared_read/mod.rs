//! Read coalescing for [`RwLockLayer`](crate::RwLockLayer): the concurrent read requests of
//! one name in one layer share one reader lease in the store.
//!
//! A layer keeps a registry ([`SharedReads`]) of shares by name. A read request either
//!
//! - **joins** a share whose lease is held and may take newcomers (see [`Held::admits`]): no
//!   store call at all;
//! - **waits** for a share whose acquisition is on the wire, and gets its answer: the lease, or
//!   the same `Busy` or store error (a request that would have asked the store at the same
//!   moment would have heard the same);
//! - or **leads** a new share: it sends the acquisition, and publishes the answer to those that
//!   wait.
//!
//! Each share counts its requests. The count changes only under the registry's lock, and the
//! request that takes it to zero removes the share from the registry under that same lock, then
//! releases the lease: so a request never joins a share whose lease is being released (it
//! finds no share, and leads a fresh one). A share may instead [linger] at zero for the
//! next read of its name; its last request's answer then waits until the share is *settled*:
//! handed to a read that joined it, or released. So an answered read never leaves a lease
//! behind that nobody in flight holds, and a client's next request, to any replica, never
//! meets it.
//!
//! A share that no longer admits newcomers is replaced in the registry by a fresh one; its own
//! requests keep it until they leave. Every way out of a share (the response, the body's end, a
//! request dropped while waiting or running) goes through [`SharedRead`]'s or [`Waiter`]'s
//! drop, so the count stays right.
//!
//! The shared lease is one [`KeptLease`]: one heartbeat enrolment, one extension per beat
//! however many requests share it, and one [`LeaseState`] whose loss every request sees.
//!
//! This file keeps the registry and the held shares; [`acquire`] the requests that wait for a
//! share's acquisition or send it, [`read`] a request's part in a held share, and [`linger`]
//! how long an idle share is kept.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

mod acquire;
mod intent;
mod linger;
mod read;

pub(crate) use self::acquire::{Leader, Waiter};
pub(crate) use self::linger::{IdleShare, Linger};
pub(crate) use self::read::SharedRead;

use crate::Error;
use crate::backend::IntentListener;
use crate::lease::kept::KeptLease;
use crate::store::LeaseState;
use crate::store::heartbeat::{Heartbeat, HeartbeatTiming};
use crate::store::raw::RawLease;

/// A layer's shares of read leases, by name. The layer's lock fixes the namespace, so the name
/// is the whole key.
#[derive(Default)]
pub(crate) struct SharedReads {
    shares: Mutex<HashMap<Box<[u8]>, Arc<Share>>>,
    /// How long a share whose last request left stays held (by default: released at once).
    linger: Linger,
}

/// One reader lease and the requests that share it.
struct Share {
    name: Box<[u8]>,
    /// Requests in the share, waiting for its acquisition or holding it. Changed only under the
    /// registry's lock.
    members: AtomicUsize,
    /// When its last request last left (its making, before that): a linger releases it only a
    /// whole linger after that. Changed only under the registry's lock.
    emptied: Mutex<Instant>,
    /// Whether a linger task watches it; one at a time. Changed only under the registry's lock.
    lingering: AtomicBool,
    /// Whether a second request ever joined or waited for it. Set only under the registry's
    /// lock.
    overlapped: AtomicBool,
    /// How many times its count reached zero and it lingered. Changed only under the
    /// registry's lock.
    idled: AtomicU64,
    /// Up to which of those idle spells it is settled: a read joined, or the lease was
    /// released (`u64::MAX`). The last request of each spell answers once its spell is.
    settled: AtomicU64,
    /// Wakes the last requests waiting for `settled`.
    settling: Notify,
    /// Set once, when the acquisition answers.
    outcome: OnceLock<Outcome>,
    /// Wakes the requests waiting for `outcome`.
    answered: Notify,
}

/// What a share's acquisition came to.
enum Outcome {
    /// The share holds the lease.
    Acquired(Held),
    /// Someone else holds the lock, for about this long.
    Busy(Duration),
    Failed(Error),
    /// The leading request went away before it sent anything: the waiters start again.
    Abandoned,
}

/// A held shared lease.
struct Held {
    state: Arc<LeaseState>,
    acquired_at: Instant,
    timing: HeartbeatTiming,
    /// Whether `lease` is in the heartbeat's care, read without its lock.
    enrolled: AtomicBool,
    /// The lease: taken out by the last request to leave, which releases it.
    lease: Mutex<Option<KeptLease>>,
    /// Hears of a write intent on the name at once (phase-fair or writers-first locks only).
    intent: Option<IntentListener>,
}

/// What a request's leave left behind.
pub(super) enum Left {
    /// Other requests are still in the share.
    Others,
    /// The lease, for the last request out to release.
    Lease(KeptLease),
    /// The share lingers: the last request out answers once this idle spell is settled.
    Lingering(u64),
}

/// Where a read request stands on entering: see the module docs.
pub(crate) enum Entry {
    Joined(SharedRead),
    Waiting(Waiter),
    Leading(Leader),
}

impl SharedReads {
    /// How long a share outlives its last request.
    pub(crate) fn linger(&self) -> Linger {
        self.linger
    }

    /// Shares that linger after their last request as `linger` says (see
    /// [`linger`](linger::linger)).
    pub(crate) fn lingering(linger: Linger) -> Self {
        SharedReads {
            linger,
            ..Self::default()
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Box<[u8]>, Arc<Share>>> {
        // Every update under this lock is one insert or removal and one count change.
        self.shares.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Joins the share of `name` if its lease is held and admits newcomers.
    pub(crate) fn join(self: &Arc<Self>, name: &[u8]) -> Option<SharedRead> {
        let now = Instant::now();
        let shares = self.lock();
        let share = shares.get(name)?;
        match share.outcome.get() {
            Some(Outcome::Acquired(held)) if held.admits(now) => {
                share.add_member();
                Some(SharedRead::new(self.clone(), share.clone()))
            }
            _ => None,
        }
    }

    /// Joins the share of `name`, waits for its acquisition, or leads a new one.
    pub(crate) fn enter(self: &Arc<Self>, name: &[u8]) -> Entry {
        let now = Instant::now();
        let mut shares = self.lock();
        if let Some(share) = shares.get(name) {
            match share.outcome.get() {
                None => {
                    share.add_member();
                    return Entry::Waiting(Waiter::new(self.clone(), share.clone()));
                }
                Some(Outcome::Acquired(held)) if held.admits(now) => {
                    share.add_member();
                    return Entry::Joined(SharedRead::new(self.clone(), share.clone()));
                }
                // Lost, closed to newcomers, or (briefly) a failed acquisition: start afresh.
                _ => {}
            }
        }
        let share = Arc::new(Share::new(name, None));
        shares.insert(name.into(), share.clone());
        Entry::Leading(Leader::new(self.clone(), share))
    }

    /// Shares `holding`, taken after a wait, when no share of its name can take newcomers
    /// (`Ok`, the request's part in the new share); otherwise the request keeps it to itself
    /// (`Err`).
    pub(crate) fn adopt(
        self: &Arc<Self>,
        holding: RawLease,
        sent_at: Instant,
        timing: HeartbeatTiming,
    ) -> Result<SharedRead, KeptLease> {
        let lease = KeptLease::new(holding, sent_at, timing);
        let now = Instant::now();
        let mut shares = self.lock();
        let state = lease.state().clone();
        let name = state.holding.name();
        let taken = shares
            .get(name)
            .is_some_and(|share| match share.outcome.get() {
                Some(Outcome::Acquired(held)) => held.admits(now),
                None => true,
                Some(_) => false,
            });
        if taken {
            return Err(lease);
        }
        let share = Arc::new(Share::new(name, Some(Held::new(lease, sent_at, timing))));
        shares.insert(name.into(), share.clone());
        Ok(SharedRead::new(self.clone(), share))
    }

    /// Takes one request out of `share`; the last one out gets the lease to release, unless
    /// the share lingers (see [`linger`](linger::linger)): then the linger's end releases it,
    /// or a read that joins meanwhile takes it over, and the last one out waits for either.
    fn leave(self: &Arc<Self>, share: &Arc<Share>) -> Left {
        let mut shares = self.lock();
        if share.members.fetch_sub(1, Ordering::Relaxed) != 1 {
            return Left::Others;
        }
        let current = shares
            .get(&share.name)
            .is_some_and(|other| Arc::ptr_eq(other, share));
        if current
            && !self.linger.of(share).is_zero()
            && let Some(held) = share.held()
            && held.admits(Instant::now())
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            // Still in the registry with no request: the next one of the name joins it. One
            // linger task at a time watches it.
            *share.emptied.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            let spell = share.idled.fetch_add(1, Ordering::Relaxed) + 1;
            let watched = share.lingering.swap(true, Ordering::Relaxed);
            drop(shares);
            if !watched {
                runtime.spawn(linger::linger(self.clone(), share.clone()));
            }
            return Left::Lingering(spell);
        }
        if current {
            shares.remove(&share.name);
        }
        drop(shares);
        // Out of the registry with no request left: nobody else can reach the lease.
        match share.take_lease() {
            Some(lease) => Left::Lease(lease),
            None => Left::Others,
        }
    }

    /// Publishes what `share`'s acquisition came to and wakes its waiters. A share that holds
    /// no lease leaves the registry at once, so the next request asks the store again.
    fn publish(&self, share: &Arc<Share>, outcome: Outcome) {
        let held = matches!(outcome, Outcome::Acquired(_));
        {
            let mut shares = self.lock();
            if share.outcome.set(outcome).is_err() {
                unreachable!("a share's acquisition answers once");
            }
            if !held
                && shares
                    .get(&share.name)
                    .is_some_and(|other| Arc::ptr_eq(other, share))
            {
                shares.remove(&share.name);
            }
        }
        share.answered.notify_waiters();
    }
}

impl Share {
    fn new(name: &[u8], held: Option<Held>) -> Self {
        let outcome = OnceLock::new();
        if let Some(held) = held {
            let _ = outcome.set(Outcome::Acquired(held));
        }
        Share {
            name: name.into(),
            members: AtomicUsize::new(1),
            emptied: Mutex::new(Instant::now()),
            lingering: AtomicBool::new(false),
            overlapped: AtomicBool::new(false),
            idled: AtomicU64::new(0),
            settled: AtomicU64::new(0),
            settling: Notify::new(),
            outcome,
            answered: Notify::new(),
        }
    }

    /// One more request in the share; called under the registry's lock. A share at zero is
    /// lingering: the newcomer takes it over, which settles its idle spell.
    fn add_member(&self) {
        if self.members.fetch_add(1, Ordering::Relaxed) == 0 {
            self.settle(self.idled.load(Ordering::Relaxed));
        }
        self.overlapped.store(true, Ordering::Relaxed);
    }

    /// Settles the idle spells up to `spell` (`u64::MAX`: the lease is released) and wakes
    /// their last requests.
    fn settle(&self, spell: u64) {
        self.settled.fetch_max(spell, Ordering::Release);
        self.settling.notify_waiters();
    }

    /// Resolves once idle spell `spell` is settled.
    async fn settled(self: Arc<Self>, spell: u64) {
        loop {
            let settling = self.settling.notified();
            let mut settling = std::pin::pin!(settling);
            // Registered before looking, so a settlement in between still wakes us.
            settling.as_mut().enable();
            if self.settled.load(Ordering::Acquire) >= spell {
                return;
            }
            settling.await;
        }
    }

    fn take_lease(&self) -> Option<KeptLease> {
        self.held()
            .and_then(|held| held.lease.lock().unwrap_or_else(|e| e.into_inner()).take())
    }

    fn held(&self) -> Option<&Held> {
        match self.outcome.get() {
            Some(Outcome::Acquired(held)) => Some(held),
            _ => None,
        }
    }
}

impl Held {
    fn new(lease: KeptLease, acquired_at: Instant, timing: HeartbeatTiming) -> Self {
        Held {
            intent: intent::listen(lease.state()),
            state: lease.state().clone(),
            acquired_at,
            timing,
            enrolled: AtomicBool::new(false),
            lease: Mutex::new(Some(lease)),
        }
    }

    /// Whether a request arriving at `now` may join: the lease is not lost and has a quarter of
    /// a beat left (time for the heartbeat to extend it), no writer is known to wait (from an
    /// extension, or at once from the intent's message: new readers must go to the store,
    /// which refuses them while the intent lives), and,
    /// under `max_hold`, half of it is still ahead (so a joiner runs at least that long).
    fn admits(&self, now: Instant) -> bool {
        let timing = self.timing;
        self.state.valid_at(now + timing.every / 4)
            && !self.state.writer_waiting()
            && !self.intent.as_ref().is_some_and(IntentListener::raised)
            && timing
                .max_hold
                .is_none_or(|max_hold| now < self.acquired_at + max_hold / 2)
    }

    /// Hands the lease to `heartbeat` if it is not there yet.
    fn enrol(&self, heartbeat: &Heartbeat) {
        let mut lease = self.lease.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(lease) = lease.as_mut() {
            lease.enrol_now(heartbeat);
        }
        self.enrolled.store(true, Ordering::Release);
    }

    fn first_beat(&self) -> Instant {
        self.acquired_at + self.timing.every
    }
}

impl fmt::Debug for SharedReads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedReads")
            .field("shares", &self.lock().len())
            .finish()
    }
}

#[cfg(test)]
mod tests;
