//! A copy of `src/store/memory/` (the memory store, the reference semantics) with one bug
//! planted, chosen per store by [`Bug`]; `Bug::None` is the copy as it is.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::time::Instant;

use self::fence_counters::FenceCounters;
use self::idempotency::Records;
use tower_lease::backend::{Acquisition, LeaseRef, Mode, Secret};

mod backend;
mod bug;
mod fence_counters;
mod idempotency;
mod notify;
mod rw_entry;
mod sweep;

pub use self::bug::Bug;

/// The connections of [`Bug::LeaksConnections`]'s pool.
const POOL: usize = 8;

/// A [`Backend`](tower_lease::backend::Backend) that keeps leases in a map in this process; use it
/// through [`Store::memory`](crate::Store::memory).
///
/// Expired leases are dropped when their name is next touched, and a sweep every so many calls
/// (as many as there are entries) drops the rest, so abandoned names do not pile up. Fence
/// counters expire an hour after their lock's last acquisition (or one TTL, if longer), as in
/// Redis: a fence is `max(last + 1, wall-clock µs)`, so a forgotten counter costs nothing. Time
/// is [`tokio::time::Instant`]: under `tokio::time::pause` leases and counters expire as the
/// paused clock advances.
#[derive(Clone, Debug)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    /// Idempotency keys, apart from the leases of locks.
    idempotency: Records,
    bug: Bug,
    /// The "connections" a call takes, which [`Bug::LeaksConnections`] loses.
    pool: Arc<tokio::sync::Semaphore>,
    /// What every store made on this backend hears: releases and write intents.
    bus: tokio::sync::broadcast::Sender<notify::Event>,
}

#[derive(Debug, Default)]
struct State {
    namespaces: HashMap<Box<str>, Namespace>,
    calls_since_sweep: usize,
    /// How many entries the last sweep kept.
    kept_at_sweep: usize,
}

#[derive(Debug, Default)]
struct Namespace {
    locks: HashMap<Box<[u8]>, StoredLease>,
    rwlocks: HashMap<Box<[u8]>, RwEntry>,
    lock_fences: FenceCounters,
    rwlock_fences: FenceCounters,
    semaphores: HashMap<Box<[u8]>, Permits>,
}

/// The live permits of one semaphore name, by secret, with their lease ends.
type Permits = HashMap<Secret, Instant>;

#[derive(Debug)]
struct StoredLease {
    secret: Secret,
    ends: Instant,
}

#[derive(Debug, Default)]
struct RwEntry {
    writer: Option<StoredLease>,
    readers: HashMap<Secret, Instant>,
    /// The write intent that refuses new readers for a waiting writer (phase-fair and
    /// writers-first locks).
    intent: Option<Intent>,
    /// Phase-fair locks: the readers that wait for a writer or an intent, with how long each
    /// note lasts.
    waiting: HashMap<Secret, Instant>,
    /// Phase-fair locks: the read phase a write's release began, while a reader of it has not
    /// entered.
    phase: Option<Phase>,
}

/// The read phase of a phase-fair lock: the readers that waited for the write that ended, let
/// in before the next writer, until they all came in or the phase ends.
#[derive(Debug)]
struct Phase {
    until: Instant,
    readers: HashSet<Secret>,
}

/// A write intent: until when it lives, and the secret of the writer attempt that left it.
#[derive(Debug)]
struct Intent {
    until: Instant,
    secret: Secret,
}

impl StoredLease {
    fn live(&self, now: Instant) -> bool {
        self.ends > now
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new(bug: Bug) -> Self {
        Self {
            state: Arc::default(),
            idempotency: Records::new(bug),
            bug,
            pool: Arc::new(tokio::sync::Semaphore::new(POOL)),
            bus: notify::bus(),
        }
    }

    /// A connection for one call, under [`Bug::LeaksConnections`] (waiting for one while all
    /// are taken); nothing otherwise.
    async fn connection(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        match self.bug {
            Bug::LeaksConnections => Some(self.pool.clone().acquire_owned().await.unwrap()),
            _ => None,
        }
    }

    /// Forgets everything, as a restart without persistence would.
    pub fn lose_data(&self) {
        *self.lock() = State::default();
        self.idempotency.lose_data();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this mutex cannot leave a map half-updated: every update is a
        // single insert or remove, so the state is still consistent.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn acquire_now(&self, lease: LeaseRef<'_>) -> Acquisition {
        let LeaseRef { lock, mode, .. } = lease;
        let now = Instant::now();
        let mut state = self.lock();
        state.sweep_sometimes(now);
        let ns = state.namespace(lock.namespace);
        let ends = now + lock.ttl;
        match mode {
            Mode::Exclusive => {
                if let Some(holder) = ns.locks.get(lock.name).filter(|l| l.live(now)) {
                    return Acquisition::Busy {
                        retry_after: holder.ends - now,
                    };
                }
                if let Some(until) = ns.rwlock_until(lock.name, now, self.bug) {
                    return Acquisition::Busy {
                        retry_after: until - now,
                    };
                }
                let stored = StoredLease {
                    secret: lease.secret.clone(),
                    ends,
                };
                ns.locks.insert(lock.name.into(), stored);
                Acquisition::Acquired {
                    fence: lock
                        .fenced
                        .then(|| ns.lock_fences.next(lock.name, now, lock.ttl, self.bug)),
                }
            }
            Mode::Permit => {
                let permits = ns.semaphores.entry(lock.name.into()).or_default();
                permits.retain(|_, ends| *ends > now);
                if permits.len() >= lock.permits as usize {
                    let earliest = match self.bug {
                        Bug::PermitsRetryMax => permits.values().max(),
                        _ => permits.values().min(),
                    };
                    let earliest = earliest.map_or(now, |&ends| ends);
                    return Acquisition::Busy {
                        retry_after: earliest - now,
                    };
                }
                permits.insert(lease.secret.clone(), ends);
                Acquisition::Acquired { fence: None }
            }
            Mode::Read => {
                let shared = ns.rwlocks.entry(lock.name.into()).or_default();
                shared.forget_expired(now);
                if let Some(writer) = &shared.writer {
                    let retry_after = writer.ends - now;
                    shared.note_waiting(lease, now, retry_after);
                    return Acquisition::Busy { retry_after };
                }
                if let Some(intent) = &shared.intent {
                    let retry_after = intent.until - now;
                    if shared.readers.contains_key(lease.secret) {
                        // A retry whose first reply was lost: our own live lease.
                    } else if shared.in_phase(lease.secret) {
                        // Waited for the write that ended: in before the next writer.
                        shared.entered(lease.secret);
                        shared.readers.insert(lease.secret.clone(), ends);
                    } else {
                        shared.note_waiting(lease, now, retry_after);
                        return Acquisition::Busy { retry_after };
                    }
                } else {
                    shared.entered(lease.secret);
                    shared.readers.insert(lease.secret.clone(), ends);
                }
                let fence = lock
                    .fenced
                    .then(|| ns.rwlock_fences.current(lock.name, now, lock.ttl));
                Acquisition::Acquired { fence }
            }
            Mode::Reservation => unreachable!("reservations are taken by idempotency_begin"),
            Mode::Write => {
                let shared = ns.rwlocks.entry(lock.name.into()).or_default();
                shared.forget_expired(now);
                if shared
                    .writer
                    .as_ref()
                    .is_some_and(|writer| writer.secret == *lease.secret)
                {
                    // A retry whose first reply was lost: our own live lease, with the fence
                    // it was given, before any order of waits (it would refuse us, and the
                    // lease we hold would refuse everyone for its TTL).
                    let fence = lock
                        .fenced
                        .then(|| ns.rwlock_fences.current(lock.name, now, lock.ttl));
                    return Acquisition::Acquired { fence };
                }
                if let Some(intent) = shared.intent.as_ref().filter(|intent| {
                    lock.read_phase().is_some()
                        && lease.waiting
                        && intent.secret != *lease.secret
                        && intent.secret.as_bytes()[..6] <= lease.secret.as_bytes()[..6]
                }) {
                    // Phase-fair writers that wait go in the order their waits began.
                    return Acquisition::Busy {
                        retry_after: intent.until - now,
                    };
                }
                // Readers block a writer, and so does a read phase while one of its readers
                // has not come in.
                let shared_lock = ns
                    .locks
                    .get(lock.name)
                    .filter(|l| self.bug == Bug::KindsShareState && l.live(now))
                    .map(|l| l.ends);
                let blocked_until = shared
                    .writer
                    .as_ref()
                    .map(|w| w.ends)
                    .or(shared_lock)
                    .or_else(|| match self.bug {
                        Bug::ReadersRetryMin => shared.readers.values().min().copied(),
                        _ => shared.readers.values().max().copied(),
                    })
                    .or_else(|| shared.phase.as_ref().map(|phase| phase.until));
                if let Some(until) = blocked_until {
                    let intent = match self.bug {
                        Bug::OneShotIntentShort => lock.write_intent(),
                        _ => lease.write_intent(),
                    };
                    if let Some(intent) = intent
                        .filter(|_| {
                            shared.writer.is_none()
                                || (lock.read_phase().is_some() && lease.waiting)
                        })
                        .filter(|_| self.bug != Bug::NoWriteIntent)
                    {
                        // Refused by readers (or, a phase-fair writer that waits, by a writer):
                        // new readers wait while the intent lives.
                        shared.intent = Some(Intent {
                            until: now + intent,
                            secret: lease.secret.clone(),
                        });
                        self.announce_intent(lease);
                    }
                    return Acquisition::Busy {
                        retry_after: until - now,
                    };
                }
                if self.bug != Bug::IntentKeptAfterWrite {
                    shared.intent = None;
                }
                shared.writer = Some(StoredLease {
                    secret: lease.secret.clone(),
                    ends,
                });
                Acquisition::Acquired {
                    fence: lock
                        .fenced
                        .then(|| ns.rwlock_fences.next(lock.name, now, lock.ttl, self.bug)),
                }
            }
            _ => unreachable!("no other modes"),
        }
    }

    /// Extends (`extend`) or releases `lease`; `false` if it is not held with its secret.
    fn update_now(&self, lease: LeaseRef<'_>, extend: bool) -> bool {
        if lease.mode == Mode::Reservation {
            return self.idempotency.update(lease, extend);
        }
        let LeaseRef {
            lock, mode, secret, ..
        } = lease;
        let now = Instant::now();
        let new_end = now + lock.ttl;
        let mut state = self.lock();
        state.sweep_sometimes(now);
        let Some(ns) = state.namespaces.get_mut(lock.namespace) else {
            return false;
        };
        match mode {
            Mode::Exclusive => {
                let Some(stored) = ns.locks.get_mut(lock.name) else {
                    return false;
                };
                let own = stored.secret == *secret;
                if !stored.live(now) {
                    if own && extend && self.bug == Bug::ExtendRevives {
                        stored.ends = new_end;
                        return true;
                    }
                    ns.locks.remove(lock.name);
                    return own && !extend && self.bug == Bug::ReleaseExpiredTrue;
                }
                let ignored = match extend {
                    true => self.bug == Bug::ExtendIgnoresSecret,
                    false => self.bug == Bug::ReleaseIgnoresSecret,
                };
                if !own && !ignored {
                    return false;
                }
                if extend {
                    stored.ends = new_end;
                } else {
                    ns.locks.remove(lock.name);
                }
                true
            }
            Mode::Permit => {
                let Some(permits) = ns.semaphores.get_mut(lock.name) else {
                    return false;
                };
                let expired_own = permits.get(secret).is_some_and(|ends| *ends <= now);
                permits.retain(|_, ends| *ends > now);
                if expired_own && !extend && self.bug == Bug::ReleaseExpiredTrue {
                    return true;
                }
                let done = match permits.get_mut(secret) {
                    Some(ends) if extend => {
                        *ends = new_end;
                        true
                    }
                    Some(_) => permits.remove(secret).is_some(),
                    None => false,
                };
                if permits.is_empty() {
                    ns.semaphores.remove(lock.name);
                }
                done
            }
            Mode::Read | Mode::Write => {
                let Some(shared) = ns.rwlocks.get_mut(lock.name) else {
                    return false;
                };
                let expired_own = mode == Mode::Read
                    && shared.readers.get(secret).is_some_and(|ends| *ends <= now);
                shared.forget_expired(now);
                if expired_own && !extend && self.bug == Bug::ReleaseExpiredTrue {
                    return true;
                }
                let done = if mode == Mode::Read {
                    match shared.readers.get_mut(secret) {
                        Some(ends) if extend => {
                            *ends = new_end;
                            true
                        }
                        Some(_) => shared.readers.remove(secret).is_some(),
                        None => false,
                    }
                } else {
                    match &mut shared.writer {
                        Some(writer) if writer.secret == *secret => {
                            if extend {
                                writer.ends = new_end;
                            } else {
                                shared.writer = None;
                                if self.bug != Bug::NoReadPhase {
                                    shared.begin_read_phase(lock.read_phase(), now);
                                }
                            }
                            true
                        }
                        _ => false,
                    }
                };
                if shared.is_empty() {
                    ns.rwlocks.remove(lock.name);
                }
                done
            }
            _ => unreachable!("handled above"),
        }
    }
}

impl MemoryStore {
    /// Whether a write intent lives on the lock of the reader `lease`, as `read_extend.lua`
    /// reports it (a separate look: the intent is advisory, a race with its end is harmless).
    fn writer_waits(&self, lease: LeaseRef<'_>) -> bool {
        if lease.mode != Mode::Read || self.bug == Bug::NoWriterWaitingFlag {
            return false;
        }
        let now = Instant::now();
        let state = self.lock();
        let entry = state
            .namespaces
            .get(lease.lock.namespace)
            .and_then(|ns| ns.rwlocks.get(lease.lock.name));
        entry
            .and_then(|e| e.intent.as_ref())
            .is_some_and(|intent| intent.until > now)
    }

    /// Removes the write intent on the lock of the writer `lease` if that writer left it, as
    /// `withdraw_intent.lua` does.
    fn withdraw_now(&self, lease: LeaseRef<'_>) -> bool {
        let now = Instant::now();
        let mut state = self.lock();
        let Some(ns) = state.namespaces.get_mut(lease.lock.namespace) else {
            return false;
        };
        let Some(shared) = ns.rwlocks.get_mut(lease.lock.name) else {
            return false;
        };
        shared.forget_expired(now);
        let ours = shared
            .intent
            .as_ref()
            .is_some_and(|intent| intent.secret == *lease.secret);
        if ours {
            shared.intent = None;
        }
        if shared.is_empty() {
            ns.rwlocks.remove(lease.lock.name);
        }
        ours
    }
}
