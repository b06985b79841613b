//! The conformance suite: every behaviour of the core, run against a real `redis-server`
//! (started per test on a free loopback port), a local Redis Cluster, and `Store::memory()`
//! (under paused time). Tests that look at Redis itself (key names, PTTL, SCRIPT FLUSH) run on
//! Redis and the cluster only, in `redis_only`.

mod exclusive;
mod input;
mod intent_window;
mod redis_only;
mod rw;
mod semaphore;
mod writer_preferred;

use std::time::Duration;

use tower_lease::store::{LeaseRef, LockRef, Secret};
use tower_lease::{Mode, Store};

/// Redis and the clocks count whole milliseconds; allow that much rounding in comparisons.
const ROUNDING: Duration = Duration::from_millis(3);

/// Asserts that a stranger, without the holder's secret, can neither release nor extend the
/// `mode` lease of `lock`.
async fn assert_strangers_refused(store: &Store, lock: LockRef<'_>, mode: Mode) {
    let stranger = Secret::random();
    let backend = store.backend();
    let lease = LeaseRef::new(lock, mode, &stranger);
    assert!(
        !backend.release(lease).await.unwrap(),
        "a stranger released a {mode:?} lease"
    );
    assert!(
        backend.extend(lease).await.unwrap() == tower_lease::store::Extended::Gone,
        "a stranger extended a {mode:?} lease"
    );
}
