//! [`HoldTimes`]: how long the leases of a layer were held lately, for the `Retry-After` of a
//! busy answer.
//!
//! A busy name's holder keeps extending its lease while it works, so its remaining lease says
//! little about when it will be done: about a TTL, for a job of a few milliseconds. What this
//! process has seen holds of the namespace take is a better guess. The layer keeps the last
//! [`RING`] of them and answers a high percentile, capped by the holder's remaining lease.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

/// How many recent holds the estimate looks at: enough that one slow request is an outlier,
/// few enough that the estimate follows a change within a few dozen requests.
const RING: usize = 16;

/// The recent hold times of one layer's leases, in milliseconds.
///
/// Recording is on every request's path, so it is two relaxed atomic operations and no lock;
/// reading sorts a copy of the ring, and only a refused request reads.
#[derive(Debug, Default)]
pub(crate) struct HoldTimes {
    /// Each hold in whole milliseconds, rounded up (0: a slot never written).
    ring: [AtomicU32; RING],
    /// How many holds were recorded: the next slot to write, modulo [`RING`].
    recorded: AtomicUsize,
}

impl HoldTimes {
    /// Notes a hold that lasted `held`.
    pub(crate) fn record(&self, held: Duration) {
        let ms = u32::try_from(held.as_millis()).unwrap_or(u32::MAX);
        // Never 0, which marks an empty slot.
        let ms = ms
            .saturating_add(u32::from(!held.subsec_nanos().is_multiple_of(1_000_000)))
            .max(1);
        let slot = self.recorded.fetch_add(1, Ordering::Relaxed) % RING;
        self.ring[slot].store(ms, Ordering::Relaxed);
    }

    /// The expected wait for a name whose holder's lease has `remaining` left: the 90th
    /// percentile of the recent holds, never more than `remaining`; `remaining` itself before
    /// any hold was seen.
    pub(crate) fn expected_wait(&self, remaining: Duration) -> Duration {
        let mut seen = [0u32; RING];
        let mut n = 0;
        for slot in &self.ring {
            let ms = slot.load(Ordering::Relaxed);
            if ms > 0 {
                seen[n] = ms;
                n += 1;
            }
        }
        if n == 0 {
            return remaining;
        }
        let seen = &mut seen[..n];
        seen.sort_unstable();
        // The nearest-rank 90th percentile: the slowest of ten, the second slowest of sixteen.
        let rank = (n * 9).div_ceil(10);
        let p90 = Duration::from_millis(u64::from(seen[rank - 1]));
        p90.min(remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn before_any_hold_the_remaining_lease() {
        let holds = HoldTimes::default();
        assert_eq!(holds.expected_wait(5000 * MS), 5000 * MS);
    }

    #[test]
    fn a_high_percentile_of_the_recent_holds_capped_by_the_lease() {
        let holds = HoldTimes::default();
        for _ in 0..15 {
            holds.record(30 * MS);
        }
        holds.record(4000 * MS);
        // One slow hold in sixteen is an outlier.
        assert_eq!(holds.expected_wait(5000 * MS), 30 * MS);
        holds.record(2000 * MS);
        assert_eq!(holds.expected_wait(5000 * MS), 2000 * MS);
        assert_eq!(holds.expected_wait(700 * MS), 700 * MS);
    }

    #[test]
    fn old_holds_leave_the_ring() {
        let holds = HoldTimes::default();
        for _ in 0..RING {
            holds.record(3000 * MS);
        }
        for _ in 0..RING {
            holds.record(Duration::from_micros(200));
        }
        assert_eq!(holds.expected_wait(5000 * MS), MS);
    }

    #[test]
    fn few_holds_answer_the_slowest() {
        let holds = HoldTimes::default();
        holds.record(30 * MS);
        holds.record(1200 * MS);
        assert_eq!(holds.expected_wait(5000 * MS), 1200 * MS);
    }
}
