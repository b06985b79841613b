//! A lock key without an expiry, as another tool may leave one: busy like any other, with the
//! definition's TTL as `retry_after`, and a bounded wait on it backs off instead of asking
//! Redis about once a millisecond.

use std::time::{Duration, Instant};

use tower_lease::Attempt;
use tower_lease::Lock;
use tower_lease::store::KeyRole;

use tower_lease_harness::Backing;

const IMPORT: Lock<str> = Lock::new("import", Duration::from_millis(300));
const FENCED: Lock<str> = Lock::new("fenced-import", Duration::from_millis(300)).fenced();

tower_lease_harness::store_tests!(
    Layer: [],
    redis: [
        a_key_without_expiry_is_busy_for_a_ttl,
        a_bounded_wait_on_a_key_without_expiry_backs_off,
    ]
);

/// Sets `name`'s lock key in `namespace` as another tool would: a value and no expiry.
async fn set_forever(env: &Backing, namespace: &str, name: &str) {
    let key = env.raw().key(KeyRole::Lock, namespace, name.as_bytes());
    let () = env
        .raw()
        .query(redis::cmd("SET").arg(key).arg("held-by-another-tool"))
        .await;
}

async fn a_key_without_expiry_is_busy_for_a_ttl(env: Backing) {
    for lock in [IMPORT, FENCED] {
        set_forever(&env, lock.namespace(), "a").await;
        match lock.attempt(&env.store, "a").await.unwrap() {
            Attempt::Busy { retry_after } => assert_eq!(retry_after, lock.ttl()),
            Attempt::Acquired(_) => panic!("acquired a key another tool holds"),
        }
        // Asked again (the unfenced lock's next SET NX now carries its PTTL along).
        let again = lock.attempt(&env.store, "a").await.unwrap();
        assert_eq!(again.retry_after(), Some(lock.ttl()));
    }
}

async fn a_bounded_wait_on_a_key_without_expiry_backs_off(env: Backing) {
    let wait = Duration::from_secs(1);
    for lock in [IMPORT, FENCED] {
        set_forever(&env, lock.namespace(), "b").await;
        let (set, pttl, eval) = calls(&env).await;
        let begun = Instant::now();
        let token = lock.try_lock_for(&env.store, "b", wait).await.unwrap();
        let took = begun.elapsed();
        assert!(token.is_none());
        assert!(took >= wait, "gave up after {took:?}");
        let (set_after, pttl_after, eval_after) = calls(&env).await;
        // One `PTTL` per refused attempt (its own, or the script's), and a `SET NX` or a
        // script call each. As for any busy name, polls back off from 5 ms to 100 ms: about
        // 15 attempts in the first second, where a busy loop made hundreds.
        let counts = [set_after - set, pttl_after - pttl, eval_after - eval];
        assert!(
            counts.iter().all(|&n| n <= 20),
            "SET, PTTL, EVALSHA: {counts:?} in {took:?} on {}",
            lock.namespace()
        );
    }
}

/// `SET`, `PTTL` and script calls so far (a script's own `PTTL` counts too).
async fn calls(env: &Backing) -> (u64, u64, u64) {
    let raw = env.raw();
    let evals = raw.command_calls("evalsha").await + raw.command_calls("eval").await;
    (
        raw.command_calls("set").await,
        raw.command_calls("pttl").await,
        evals,
    )
}
