//! Leases in this process's memory, with the same semantics as the Redis scripts.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use std::time::Duration;

use tokio::time::Instant;

use self::fence_counters::FenceCounters;
use self::idempotency::Records;
use crate::backend::{Acquisition, LeaseRef, Mode, Secret};

mod backend;
mod fence_counters;
mod idempotency;

/// A [`Backend`](crate::backend::Backend) that keeps leases in a map in this process; use it
/// through [`Store::memory`](crate::Store::memory).
///
/// Expired leases are dropped when their name is next touched, and a sweep every so many calls
/// (as many as there are entries) drops the rest, so abandoned names do not pile up. Fence
/// counters expire an hour after their lock's last acquisition (or one TTL, if longer), as in
/// Redis: a fence is `max(last + 1, wall-clock µs)`, so a forgotten counter costs nothing. Time
/// is [`tokio::time::Instant`]: under `tokio::time::pause` leases and counters expire as the
/// paused clock advances.
#[derive(Debug, Default)]
pub struct MemoryStore {
    state: Mutex<State>,
    /// Idempotency keys, apart from the leases of locks.
    idempotency: Records,
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

impl RwEntry {
    fn forget_expired(&mut self, now: Instant) {
        self.readers.retain(|_, ends| *ends > now);
        if self.writer.as_ref().is_some_and(|w| !w.live(now)) {
            self.writer = None;
        }
        if self
            .intent
            .as_ref()
            .is_some_and(|intent| intent.until <= now)
        {
            self.intent = None;
        }
        self.waiting.retain(|_, until| *until > now);
        if self
            .phase
            .as_ref()
            .is_some_and(|phase| phase.until <= now || phase.readers.is_empty())
        {
            self.phase = None;
        }
    }

    fn is_empty(&self) -> bool {
        self.writer.is_none()
            && self.readers.is_empty()
            && self.intent.is_none()
            && self.waiting.is_empty()
            && self.phase.is_none()
    }

    /// A phase-fair reader with `secret` that waits was refused, told `retry_after`: it is
    /// noted as waiting until that much, and two read phases, from now.
    fn note_waiting(&mut self, lease: LeaseRef<'_>, now: Instant, retry_after: Duration) {
        if let Some(phase) = lease.lock.read_phase().filter(|_| lease.waiting) {
            let until = now + retry_after + 2 * phase;
            self.waiting.insert(lease.secret.clone(), until);
        }
    }

    /// A phase-fair write ended by its release: the readers waiting now are let in before the
    /// next writer, for at most `phase`.
    fn begin_read_phase(&mut self, phase: Option<Duration>, now: Instant) {
        let Some(phase) = phase else { return };
        if self.waiting.is_empty() {
            return;
        }
        let readers = self.waiting.drain().map(|(secret, _)| secret).collect();
        self.phase = Some(Phase {
            until: now + phase,
            readers,
        });
    }

    /// Whether `secret` is a reader of the live read phase.
    fn in_phase(&self, secret: &Secret) -> bool {
        self.phase
            .as_ref()
            .is_some_and(|phase| phase.readers.contains(secret))
    }

    /// A reader with `secret` entered: it waits no more, and has left its phase.
    fn entered(&mut self, secret: &Secret) {
        self.waiting.remove(secret);
        if let Some(phase) = &mut self.phase {
            phase.readers.remove(secret);
            if phase.readers.is_empty() {
                self.phase = None;
            }
        }
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
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
                let stored = StoredLease {
                    secret: lease.secret.clone(),
                    ends,
                };
                ns.locks.insert(lock.name.into(), stored);
                Acquisition::Acquired {
                    fence: lock
                        .fenced
                        .then(|| ns.lock_fences.next(lock.name, now, lock.ttl)),
                }
            }
            Mode::Permit => {
                let permits = ns.semaphores.entry(lock.name.into()).or_default();
                permits.retain(|_, ends| *ends > now);
                if permits.len() >= lock.permits as usize {
                    let earliest = permits.values().min().map_or(now, |&ends| ends);
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
                    // Phase-fair writers that wait go in the order their waits began (a
                    // secret's first six bytes); an older one takes over a younger one's intent.
                    return Acquisition::Busy {
                        retry_after: intent.until - now,
                    };
                }
                // Readers block a writer, and so does a read phase while one of its readers
                // has not come in.
                let blocked_until = shared
                    .writer
                    .as_ref()
                    .map(|w| w.ends)
                    .or_else(|| shared.readers.values().max().copied())
                    .or_else(|| shared.phase.as_ref().map(|phase| phase.until));
                if let Some(until) = blocked_until {
                    if let Some(intent) = lease.write_intent().filter(|_| {
                        shared.writer.is_none() || (lock.read_phase().is_some() && lease.waiting)
                    }) {
                        // Refused by readers (or, a phase-fair writer that waits, by a writer):
                        // new readers wait while the intent lives.
                        shared.intent = Some(Intent {
                            until: now + intent,
                            secret: lease.secret.clone(),
                        });
                    }
                    return Acquisition::Busy {
                        retry_after: until - now,
                    };
                }
                shared.intent = None;
                shared.writer = Some(StoredLease {
                    secret: lease.secret.clone(),
                    ends,
                });
                Acquisition::Acquired {
                    fence: lock
                        .fenced
                        .then(|| ns.rwlock_fences.next(lock.name, now, lock.ttl)),
                }
            }
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
                if !stored.live(now) {
                    ns.locks.remove(lock.name);
                    return false;
                }
                if stored.secret != *secret {
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
                permits.retain(|_, ends| *ends > now);
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
                shared.forget_expired(now);
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
                                shared.begin_read_phase(lock.read_phase(), now);
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
            Mode::Reservation => unreachable!("handled above"),
        }
    }
}

impl MemoryStore {
    /// Whether a write intent lives on the lock of the reader `lease`, as `read_extend.lua`
    /// reports it (a separate look: the intent is advisory, a race with its end is harmless).
    fn writer_waits(&self, lease: LeaseRef<'_>) -> bool {
        if lease.mode != Mode::Read {
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

impl State {
    fn namespace(&mut self, namespace: &str) -> &mut Namespace {
        if !self.namespaces.contains_key(namespace) {
            self.namespaces
                .insert(namespace.into(), Namespace::default());
        }
        self.namespaces.get_mut(namespace).expect("inserted above")
    }

    /// Drops expired leases and counters once per as many calls as the last sweep kept
    /// entries, so the sweep costs O(1) per call on average and the entries never grow past
    /// twice the live ones (plus the calls since).
    fn sweep_sometimes(&mut self, now: Instant) {
        self.calls_since_sweep += 1;
        // Counted against what the last sweep kept, not what there is now: every call on a new
        // name adds an entry, so a stream of new names would otherwise outrun the count for
        // good, and the map would grow without bound.
        if self.calls_since_sweep < self.kept_at_sweep.max(64) {
            return;
        }
        self.calls_since_sweep = 0;
        for ns in self.namespaces.values_mut() {
            ns.locks.retain(|_, lease| lease.live(now));
            ns.rwlocks.retain(|_, shared| {
                shared.forget_expired(now);
                !shared.is_empty()
            });
            ns.semaphores.retain(|_, permits| {
                permits.retain(|_, ends| *ends > now);
                !permits.is_empty()
            });
            ns.lock_fences.forget_expired(now);
            ns.rwlock_fences.forget_expired(now);
        }
        self.namespaces.retain(|_, ns| ns.len() > 0);
        self.kept_at_sweep = self.namespaces.values().map(Namespace::len).sum();
    }
}

impl Namespace {
    /// How many entries the namespace keeps: names with leases (live or not yet swept) and
    /// fence counters.
    fn len(&self) -> usize {
        self.locks.len()
            + self.rwlocks.len()
            + self.semaphores.len()
            + self.lock_fences.len()
            + self.rwlock_fences.len()
    }
}

#[cfg(test)]
impl MemoryStore {
    /// How many entries the store keeps (names with leases not yet swept, fence counters).
    pub(crate) fn entries(&self) -> usize {
        let leases: usize = self.lock().namespaces.values().map(Namespace::len).sum();
        leases + self.idempotency.entries()
    }
}

#[cfg(test)]
mod tests;
