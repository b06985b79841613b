//! `Backend::extend_many`, which the layer's heartbeat sends its batches through: one answer per
//! lease in order, the same answers as single extends, and scripts reloaded after a flush; on
//! one Redis, on a cluster (names on different nodes) and in memory.

use std::time::Duration;

use tower_lease::Store;
use tower_lease::backend::{LeaseRef, LockRef, Mode, Secret};

use tower_lease_harness::{Backing, Raw, Setup};

const TTL: Duration = Duration::from_millis(2_000);

/// Takes `count` leases of each mode, extends them all plus two that are not held (a stranger's
/// token, a name nobody took) in one call, and checks each answer. `flush`, if given, empties
/// the script cache right before the batch.
async fn extends_in_order(store: &Store, flush: Option<&Raw>) {
    let backend = store.backend();
    let names: Vec<Vec<u8>> = (0..40).map(|i| format!("n{i}").into_bytes()).collect();
    let modes = [Mode::Exclusive, Mode::Read, Mode::Write];
    let tokens: Vec<Secret> = names.iter().map(|_| Secret::random()).collect();
    let lock = |i: usize| {
        let lock = LockRef::new("batch", &names[i], TTL);
        if i.is_multiple_of(7) {
            lock.fenced()
        } else {
            lock
        }
    };
    let lease = |i: usize, secret| LeaseRef::new(lock(i), modes[i % 3], secret);
    for (i, secret) in tokens.iter().enumerate() {
        let acquired = backend.acquire(lease(i, secret)).await;
        assert!(matches!(
            acquired,
            Ok(tower_lease::backend::Acquisition::Acquired { .. })
        ));
    }
    let stranger = Secret::random();
    let nobody = b"nobody".to_vec();
    let mut leases: Vec<LeaseRef<'_>> = (0..names.len()).map(|i| lease(i, &tokens[i])).collect();
    leases.insert(5, lease(5, &stranger));
    let nobody = LockRef::new("batch", &nobody, TTL);
    leases.push(LeaseRef::new(nobody, Mode::Exclusive, &stranger));

    tokio::time::sleep(Duration::from_millis(300)).await;
    if let Some(raw) = flush {
        let () = raw.query(redis::cmd("SCRIPT").arg("FLUSH")).await;
    }
    let answers = backend.extend_many(&leases).await;
    assert_eq!(answers.len(), leases.len());
    for (i, answer) in answers.into_iter().enumerate() {
        let expected = i != 5 && i != leases.len() - 1;
        assert_eq!(answer.unwrap().is_held(), expected, "answer {i}");
    }
    // Extended means the full TTL again: an exclusive lease taken 300 ms ago still blocks for
    // longer than the 1.7 s its acquisition left it.
    let other = Secret::random();
    match backend
        .acquire(LeaseRef::new(lock(3), Mode::Exclusive, &other))
        .await
        .unwrap()
    {
        tower_lease::backend::Acquisition::Busy { retry_after } => {
            assert!(
                retry_after > Duration::from_millis(1_750),
                "{retry_after:?}"
            );
        }
        acquired @ tower_lease::backend::Acquisition::Acquired { .. } => {
            panic!("not held: {acquired:?}")
        }
    }
}

#[tokio::test]
async fn redis_extends_a_batch_in_order() {
    let env = Backing::redis(Setup::Core).await;
    extends_in_order(&env.store, None).await;
}

#[tokio::test]
async fn redis_reloads_the_scripts_after_a_flush() {
    let env = Backing::redis(Setup::Core).await;
    extends_in_order(&env.store, Some(env.raw())).await;
}

#[tokio::test]
async fn memory_extends_a_batch_in_order() {
    extends_in_order(&Store::memory(), None).await;
}

#[cfg(feature = "cluster")]
#[tokio::test]
async fn cluster_extends_a_batch_across_nodes() {
    let env = Backing::cluster(Setup::Core).await;
    extends_in_order(&env.store, None).await;
}
