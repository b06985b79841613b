//! The idempotency records of a [`MemoryStore`](super::MemoryStore), with the semantics of
//! the `idem_*.lua` scripts: a reservation lease, a completed record and an at-most-once
//! marker per key, each expiring on [`tokio::time::Instant`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use super::Bug;
use super::fence_counters::FenceCounters;
use tower_lease::backend::{Begin, Completion, FINGERPRINT_LEN, LeaseRef, Secret};

/// Every namespace's idempotency keys.
#[derive(Clone, Debug, Default)]
pub(super) struct Records {
    state: Arc<Mutex<State>>,
    bug: Bug,
}

#[derive(Debug, Default)]
struct State {
    namespaces: HashMap<Box<str>, Keys>,
    calls_since_sweep: usize,
    kept_at_sweep: usize,
}

#[derive(Debug, Default)]
struct Keys {
    keys: HashMap<Box<[u8]>, Entry>,
    fences: FenceCounters,
}

#[derive(Debug, Default)]
struct Entry {
    reservation: Option<(Secret, Instant)>,
    record: Option<Record>,
    /// Until when an at-most-once key's outcome is unknown once its reservation is gone.
    unknown: Option<Instant>,
}

#[derive(Debug)]
struct Record {
    fingerprint: [u8; FINGERPRINT_LEN],
    response: Bytes,
    by: Secret,
    until: Instant,
}

impl Entry {
    fn forget_expired(&mut self, now: Instant) {
        if self
            .reservation
            .as_ref()
            .is_some_and(|(_, ends)| *ends <= now)
        {
            self.reservation = None;
        }
        if self.record.as_ref().is_some_and(|r| r.until <= now) {
            self.record = None;
        }
        if self.unknown.is_some_and(|until| until <= now) {
            self.unknown = None;
        }
    }

    fn is_empty(&self) -> bool {
        self.reservation.is_none() && self.record.is_none() && self.unknown.is_none()
    }
}

impl Records {
    pub(super) fn new(bug: Bug) -> Self {
        Self {
            bug,
            ..Self::default()
        }
    }

    pub(super) fn lose_data(&self) {
        *self.lock() = State::default();
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update is a single insert or remove: a panic leaves the maps consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The first look at a key; `once` is the retention of an at-most-once key's marker.
    pub(super) fn begin(
        &self,
        lease: LeaseRef<'_>,
        fingerprint: &[u8; FINGERPRINT_LEN],
        once: Option<Duration>,
    ) -> Begin {
        let LeaseRef { lock, secret, .. } = lease;
        let now = Instant::now();
        let mut state = self.lock();
        state.sweep_sometimes(now);
        let keys = state.namespaces.entry(lock.namespace.into()).or_default();
        let entry = keys.keys.entry(lock.name.into()).or_default();
        entry.forget_expired(now);
        if let Some(record) = &entry.record {
            return match record.fingerprint == *fingerprint {
                true => Begin::Completed {
                    response: record.response.clone(),
                    expires_in: record.until - now,
                },
                false => Begin::Mismatch,
            };
        }
        let ours = match &entry.reservation {
            Some((held, _)) if held == secret => true,
            Some((_, ends)) if self.bug != Bug::ReservationOverwrite => {
                return Begin::InFlight {
                    retry_after: *ends - now,
                };
            }
            _ => {
                if let (Some(_), Some(until)) = (once, entry.unknown) {
                    return Begin::OutcomeUnknown {
                        expires_in: until - now,
                    };
                }
                entry.reservation = Some((secret.clone(), now + lock.ttl));
                if let Some(retention) = once.filter(|_| self.bug != Bug::BeginOnceNoMarker) {
                    entry.unknown = Some(now + millis(retention));
                }
                false
            }
        };
        // Our own reservation again (as a begin sent twice finds it): the fence it took.
        let fence = lock.fenced.then(|| match ours {
            true => keys.fences.current(lock.name, now, lock.ttl),
            false => keys.fences.next(lock.name, now, lock.ttl, self.bug),
        });
        Begin::Reserved { fence }
    }

    pub(super) fn complete(&self, lease: LeaseRef<'_>, completion: Completion<'_>) -> bool {
        let LeaseRef { lock, secret, .. } = lease;
        let now = Instant::now();
        let mut state = self.lock();
        let keys = state.namespaces.entry(lock.namespace.into()).or_default();
        let entry = keys.keys.entry(lock.name.into()).or_default();
        entry.forget_expired(now);
        if let Some(record) = &entry.record {
            return record.by == *secret;
        }
        // An empty key takes the record too: nobody else runs the request, and ours ran.
        if entry
            .reservation
            .as_ref()
            .is_some_and(|(held, _)| held != secret)
            && self.bug != Bug::StrangerCompletes
        {
            return false;
        }
        entry.reservation = None;
        entry.record = Some(Record {
            fingerprint: *completion.fingerprint,
            response: Bytes::copy_from_slice(completion.response),
            by: secret.clone(),
            until: now + millis(completion.retention),
        });
        true
    }

    /// Extends (`extend`) or releases the reservation `lease`; `false` if it is not held with
    /// its secret.
    pub(super) fn update(&self, lease: LeaseRef<'_>, extend: bool) -> bool {
        let ttl = lease.lock.ttl;
        self.with_reservation(lease, |entry, now| match (&mut entry.reservation, extend) {
            (Some((_, ends)), true) => *ends = now + ttl,
            _ => entry.reservation = None,
        })
    }

    /// Frees the reservation `lease` and its at-most-once marker; `false` if it is not held
    /// with its secret.
    pub(super) fn free(&self, lease: LeaseRef<'_>) -> bool {
        self.with_reservation(lease, |entry, _| {
            entry.reservation = None;
            entry.unknown = None;
        })
    }

    /// Runs `change` on the entry of `lease` when its reservation is held with the lease's
    /// secret, then forgets the entry if nothing is left in it; `false` if it is not held.
    fn with_reservation(
        &self,
        lease: LeaseRef<'_>,
        change: impl FnOnce(&mut Entry, Instant),
    ) -> bool {
        let LeaseRef { lock, secret, .. } = lease;
        let now = Instant::now();
        let mut state = self.lock();
        let Some(keys) = state.namespaces.get_mut(lock.namespace) else {
            return false;
        };
        let Some(entry) = keys.keys.get_mut(lock.name) else {
            return false;
        };
        entry.forget_expired(now);
        let ours = entry
            .reservation
            .as_ref()
            .is_some_and(|(held, _)| held == secret);
        if ours {
            change(entry, now);
        }
        if entry.is_empty() {
            keys.keys.remove(lock.name);
        }
        ours
    }
}

/// A retention counted in whole milliseconds, as Redis counts it.
fn millis(retention: Duration) -> Duration {
    Duration::from_millis(retention.as_millis().min(u64::MAX as u128) as u64)
}

impl State {
    /// Drops expired entries once per as many calls as the last sweep kept, as the lease maps
    /// of the memory store do.
    fn sweep_sometimes(&mut self, now: Instant) {
        self.calls_since_sweep += 1;
        if self.calls_since_sweep < self.kept_at_sweep.max(64) {
            return;
        }
        self.calls_since_sweep = 0;
        for keys in self.namespaces.values_mut() {
            keys.keys.retain(|_, entry| {
                entry.forget_expired(now);
                !entry.is_empty()
            });
            keys.fences.forget_expired(now);
        }
        self.namespaces.retain(|_, keys| keys.len() > 0);
        self.kept_at_sweep = self.namespaces.values().map(Keys::len).sum();
    }
}

impl Keys {
    fn len(&self) -> usize {
        self.keys.len() + self.fences.len()
    }
}
