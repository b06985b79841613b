//! Fences that keep growing: `max(last + 1, the store's clock in µs)`, so a fence issued after
//! the backend lost its counters (a flush, a restart without persistence) is still larger than
//! every fence before.

use std::time::Duration;

use tower_lease::backend::{Acquisition, Begin, LeaseRef, LockRef, Mode, Secret};

use crate::Env;

const NS: &str = "conformance-fences";
const TTL: Duration = Duration::from_millis(500);
/// A fence below this is not the store's clock in µs (1e15 µs is September 2001): a plain
/// counter.
pub const CLOCK_FLOOR: u64 = 1_000_000_000_000_000;

/// Takes and releases one fenced lease of `mode` on `name`, answering its fence.
async fn fence(env: &Env, name: &[u8], mode: Mode) -> u64 {
    let backend = env.backend();
    let secret = Secret::random();
    let lease = LeaseRef::new(LockRef::new(NS, name, TTL).fenced(), mode, &secret);
    let fence = if mode == Mode::Reservation {
        match backend
            .idempotency_begin(lease, b"fingerprint-0001")
            .await
            .unwrap()
        {
            Begin::Reserved { fence: Some(fence) } => fence,
            other => panic!("a fenced reservation of a free key answered {other:?}"),
        }
    } else {
        match backend.acquire(lease).await.unwrap() {
            Acquisition::Acquired { fence: Some(fence) } => fence,
            other => panic!("a fenced {mode:?} acquisition of a free lock answered {other:?}"),
        }
    };
    assert!(backend.release(lease).await.unwrap(), "release {mode:?}");
    fence
}

const MODES: [Mode; 3] = [Mode::Exclusive, Mode::Write, Mode::Reservation];

/// The first fence of a fresh name (exclusive, write, reservation) is the store's clock in µs,
/// not a small counter: at least [`CLOCK_FLOOR`].
pub async fn fences_of_a_fresh_name_follow_the_clock(env: Env) {
    for mode in MODES {
        let fence = fence(&env, b"fresh", mode).await;
        assert!(
            fence >= CLOCK_FLOOR,
            "the first {mode:?} fence of a name is {fence}: a counter, not max(last + 1, clock µs)"
        );
    }
}

/// After the backend lost its data ([`Env::with_data_loss`]), a fence of each kind is larger
/// than every fence issued before; passes without looking when the `Env` has no data-loss hook.
pub async fn fences_keep_growing_across_data_loss(env: Env) {
    let mut before = Vec::new();
    for mode in MODES {
        let mut last = 0;
        for _ in 0..3 {
            let fence = fence(&env, b"lost", mode).await;
            assert!(fence > last, "{mode:?} fence {fence} after {last}");
            last = fence;
        }
        before.push(last);
    }
    if !env.lose_data().await {
        return;
    }
    // A real pause (not tokio's, which the wall clock ignores): three fences taken within one
    // µs of the loss could still be ahead of the clock.
    std::thread::sleep(Duration::from_millis(2));
    for (mode, last) in MODES.into_iter().zip(before) {
        let fence = fence(&env, b"lost", mode).await;
        assert!(
            fence > last,
            "the {mode:?} fence after data loss is {fence}, not above {last} before it"
        );
    }
}
