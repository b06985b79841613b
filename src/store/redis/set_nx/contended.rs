//! The names a store was lately refused, so that its next attempt on one asks `PTTL` in the
//! same round trip as its `SET NX`.
//!
//! An exclusive acquisition sends `SET NX PX` alone: most succeed, and a `PTTL` with every one
//! would cost the acquired path a command. A refused one then needs a second round trip for
//! an exact `retry_after`. On a name that is held and asked for again and again (a hot invoice,
//! a waiter retrying) that second round trip is most of the refused path's cost; a name
//! remembered here has its `PTTL` pipelined with the `SET` instead, one request for both.
//!
//! A fixed table of slots indexed by a hash of the name, without locks: a slot holds the hash
//! of the last name refused there and until when that refusal is news (the holder's lease end).
//! Two names that share a slot only cost one of them a pipelined `PTTL` it did not need, or its
//! next refusal a second round trip: the hint never changes an answer.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How many names are remembered at most: far more than the names contended at one moment in
/// a process, and 4 KiB per store.
const SLOTS: usize = 256;

pub(in crate::store::redis) struct ContendedNames {
    /// Per slot, the hash of the name last refused there (0 for none).
    names: Box<[AtomicU64]>,
    /// Per slot, until when (milliseconds since `epoch`) that name counts as contended.
    until: Box<[AtomicU64]>,
    epoch: Instant,
}

impl ContendedNames {
    pub(in crate::store::redis) fn new() -> Self {
        Self {
            names: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            until: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            epoch: Instant::now(),
        }
    }

    /// The slot of a name and the nonzero tag that marks it there: FNV-1a, a few instructions
    /// per byte, since every exclusive acquisition asks.
    fn slot(namespace: &str, name: &[u8]) -> (usize, u64) {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        // Namespaces never hold `:`, so no two (namespace, name) pairs hash the same bytes.
        for &byte in namespace.as_bytes().iter().chain(b":").chain(name) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        ((hash as usize) % SLOTS, hash | 1)
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Whether `name` was refused lately, and its holder's lease has not ended since.
    pub(in crate::store::redis) fn is_contended(&self, namespace: &str, name: &[u8]) -> bool {
        let (slot, tag) = Self::slot(namespace, name);
        // The clock is read only for a name that was refused: the common case is one load.
        self.names[slot].load(Ordering::Relaxed) == tag
            && self.now() < self.until[slot].load(Ordering::Relaxed)
    }

    /// Remembers that `name` was refused, its holder's lease ending in `retry_after`.
    pub(in crate::store::redis) fn refused(
        &self,
        namespace: &str,
        name: &[u8],
        retry_after: Duration,
    ) {
        let (slot, tag) = Self::slot(namespace, name);
        let until = self.now().saturating_add(retry_after.as_millis() as u64);
        // Two stores racing on one slot may pair one name with the other's time: a hint that
        // lasts a little longer or shorter, never a wrong answer.
        self.until[slot].store(until, Ordering::Relaxed);
        self.names[slot].store(tag, Ordering::Relaxed);
    }

    /// Forgets `name`: this store holds it now.
    pub(in crate::store::redis) fn acquired(&self, namespace: &str, name: &[u8]) {
        let (slot, tag) = Self::slot(namespace, name);
        let _ = self.names[slot].compare_exchange(tag, 0, Ordering::Relaxed, Ordering::Relaxed);
    }
}

impl fmt::Debug for ContendedNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContendedNames").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_name_is_contended_until_its_holders_lease_ends_or_it_is_acquired() {
        let names = ContendedNames::new();
        assert!(!names.is_contended("jobs", b"a"));
        names.refused("jobs", b"a", Duration::from_secs(60));
        assert!(names.is_contended("jobs", b"a"));
        assert!(!names.is_contended("jobs", b"b"));
        assert!(!names.is_contended("job", b"sa"));
        names.acquired("jobs", b"a");
        assert!(!names.is_contended("jobs", b"a"));

        names.refused("jobs", b"a", Duration::from_millis(30));
        assert!(names.is_contended("jobs", b"a"));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!names.is_contended("jobs", b"a"));
    }

    #[test]
    fn acquiring_a_name_leaves_another_in_its_slot_alone() {
        let names = ContendedNames::new();
        names.refused("jobs", b"a", Duration::from_secs(60));
        let (slot, _) = ContendedNames::slot("jobs", b"a");
        let other = (0u32..)
            .map(|i| i.to_string())
            .find(|other| ContendedNames::slot("jobs", other.as_bytes()).0 == slot && other != "a")
            .unwrap();
        names.acquired("jobs", other.as_bytes());
        assert!(names.is_contended("jobs", b"a"));
    }
}
