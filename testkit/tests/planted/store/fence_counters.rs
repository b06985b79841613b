//! The fence counters of [`MemoryStore`](super::MemoryStore), which expire as the Redis ones do.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::Bug;

/// How long a fence counter outlives its lock's last acquisition (or one TTL, if longer), as in
/// the Redis scripts: a fence is `max(last + 1, wall-clock µs)`, so the counter only matters for
/// the few µs it may be ahead of the clock, and a name nobody uses is forgotten.
pub(super) const FENCE_LIFE: Duration = Duration::from_secs(3600);

/// The last fence issued per name, each until its expiry.
#[derive(Debug, Default)]
pub(super) struct FenceCounters {
    counters: HashMap<Box<[u8]>, Counter>,
}

#[derive(Debug)]
struct Counter {
    last: u64,
    expires: Instant,
}

impl FenceCounters {
    /// The next fence of `name`: `max(last + 1, wall-clock time in µs)`, as the Redis scripts
    /// compute it, so memory and Redis hand out fences of the same shape.
    pub(super) fn next(&mut self, name: &[u8], now: Instant, ttl: Duration, bug: Bug) -> u64 {
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_micros() as u64)
            * u64::from(bug != Bug::CounterFence);
        let expires = now + FENCE_LIFE.max(ttl);
        let counter = match self.counters.get_mut(name) {
            Some(counter) => counter,
            None => self
                .counters
                .entry(name.into())
                .or_insert(Counter { last: 0, expires }),
        };
        let last = if counter.expires > now {
            counter.last
        } else {
            0
        };
        counter.last = (last + 1).max(wall);
        counter.expires = expires;
        counter.last
    }

    /// The last fence of `name` (0 for none), for a reader's write generation: a read
    /// acquisition keeps the counter alive, as `read_acquire.lua` does.
    pub(super) fn current(&mut self, name: &[u8], now: Instant, ttl: Duration) -> u64 {
        match self.counters.get_mut(name) {
            Some(counter) if counter.expires > now => {
                counter.expires = counter.expires.max(now + FENCE_LIFE.max(ttl));
                counter.last
            }
            _ => 0,
        }
    }

    /// Drops the expired counters.
    pub(super) fn forget_expired(&mut self, now: Instant) {
        self.counters.retain(|_, counter| counter.expires > now);
    }

    pub(super) fn len(&self) -> usize {
        self.counters.len()
    }
}
