//! The sweep of expired entries ([`State::sweep_sometimes`]), and what a namespace counts.

use tokio::time::Instant;

use super::{Bug, Namespace, State};

impl State {
    pub(super) fn namespace(&mut self, namespace: &str) -> &mut Namespace {
        if !self.namespaces.contains_key(namespace) {
            self.namespaces
                .insert(namespace.into(), Namespace::default());
        }
        self.namespaces.get_mut(namespace).expect("inserted above")
    }

    /// Drops expired leases and counters once per as many calls as the last sweep kept
    /// entries, so the sweep costs O(1) per call on average and the entries never grow past
    /// twice the live ones (plus the calls since).
    pub(super) fn sweep_sometimes(&mut self, now: Instant) {
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
    /// With [`Bug::KindsShareState`]: until when the `RwLock` of `name` holds (a writer, or
    /// the last reader), which then refuses the `Lock` of the same name.
    pub(super) fn rwlock_until(&self, name: &[u8], now: Instant, bug: Bug) -> Option<Instant> {
        if bug != Bug::KindsShareState {
            return None;
        }
        let shared = self.rwlocks.get(name)?;
        let writer = shared
            .writer
            .as_ref()
            .filter(|w| w.live(now))
            .map(|w| w.ends);
        let readers = shared.readers.values().filter(|ends| **ends > now).max();
        writer.or(readers.copied())
    }

    /// How many entries the namespace keeps: names with leases (live or not yet swept) and
    /// fence counters.
    pub(super) fn len(&self) -> usize {
        self.locks.len()
            + self.rwlocks.len()
            + self.semaphores.len()
            + self.lock_fences.len()
            + self.rwlock_fences.len()
    }
}
