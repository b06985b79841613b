//! `Held`: a lease that the store's heartbeat keeps alive while any code works, on a real
//! `redis-server`, a local Redis Cluster and in memory. It outlives its TTL, `run` gives the
//! work's output, dropping it releases, readers and permits keep their leases too, and it is
//! lost when the store says so, when the store is down past its expiry, or when the process
//! was frozen past it (the work then never takes its next step).

mod cancelled;
mod into_token;
mod no_expiry;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tower_lease::store::KeyRole;
use tower_lease::{Lock, RwLock, Semaphore};

use tower_lease_harness::{Backing, DropFlag};

const JOB: Lock<str> = Lock::new("job", Duration::from_millis(300));
const FENCED: Lock<str> = Lock::new("fenced-job", Duration::from_millis(300)).fenced();
const DOCS: RwLock<str> = RwLock::new("docs", Duration::from_millis(300));
const SLOTS: Semaphore<str> = Semaphore::new("slots", 1, Duration::from_millis(300));

tower_lease_harness::store_tests!(
    Layer: [
        a_held_lease_outlives_its_ttl_and_releases,
        run_gives_the_output_of_work_that_finished_under_the_lease,
        dropping_a_held_lease_releases_it,
        readers_and_permits_are_kept_alive_too,
        a_frozen_process_never_takes_the_works_next_step,
    ],
    redis: [a_lease_the_store_lost_ends_the_work]
);

/// On a single server, which the test stops.
mod redis_only {
    use tower_lease_harness::{Backing, Setup};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_store_that_is_down_loses_the_lease_by_its_expiry() {
        let env = Backing::redis(Setup::Layer).await;
        super::a_store_that_is_down_loses_the_lease_by_its_expiry(env).await
    }
}

/// Three TTLs long: only the heartbeat keeps the lease for that long.
const THREE_TTLS: Duration = Duration::from_millis(900);

async fn a_held_lease_outlives_its_ttl_and_releases(env: Backing) {
    let token = FENCED.try_lock(&env.store, "a").await.unwrap().unwrap();
    let fence = token.fence();
    assert!(fence.is_some());
    let held = token.keep_alive();
    assert_eq!(held.fence(), fence);
    assert_eq!(held.lease().fence(), fence);
    tokio::time::sleep(THREE_TTLS).await;
    assert!(held.is_held(), "the heartbeat kept the lease");
    assert!(
        FENCED.try_lock(&env.store, "a").await.unwrap().is_none(),
        "nobody else got in after three TTLs"
    );
    assert!(held.release().await.unwrap());
    let next = FENCED.try_lock(&env.store, "a").await.unwrap();
    assert!(next.expect("free once released").release().await.unwrap());
}

async fn run_gives_the_output_of_work_that_finished_under_the_lease(env: Backing) {
    let held = JOB
        .try_lock(&env.store, "b")
        .await
        .unwrap()
        .unwrap()
        .keep_alive();
    let output = held
        .run(async {
            tokio::time::sleep(THREE_TTLS).await;
            42
        })
        .await;
    assert_eq!(output, Some(42));
    assert!(held.is_held());
    assert!(held.release().await.unwrap());
}

async fn dropping_a_held_lease_releases_it(env: Backing) {
    const LONG: Lock<str> = Lock::new("long-job", Duration::from_secs(10));
    let held = LONG
        .try_lock(&env.store, "c")
        .await
        .unwrap()
        .unwrap()
        .keep_alive();
    let dropped = Instant::now();
    drop(held);
    let freed =
        tower_lease_harness::poll(Duration::from_millis(5), Duration::from_secs(2), || async {
            LONG.try_lock(&env.store, "c").await.unwrap()
        })
        .await;
    let (next, _) = freed.expect("released in the background, long before its 10 s TTL");
    assert!(dropped.elapsed() < Duration::from_secs(2));
    assert!(next.release().await.unwrap());
}

async fn readers_and_permits_are_kept_alive_too(env: Backing) {
    let reader = DOCS
        .try_read(&env.store, "d")
        .await
        .unwrap()
        .unwrap()
        .keep_alive();
    let permit = SLOTS
        .try_acquire(&env.store, "d")
        .await
        .unwrap()
        .unwrap()
        .keep_alive();
    tokio::time::sleep(THREE_TTLS).await;
    assert!(reader.is_held() && permit.is_held());
    assert!(
        DOCS.try_write(&env.store, "d").await.unwrap().is_none(),
        "the reader still holds"
    );
    assert!(
        SLOTS.try_acquire(&env.store, "d").await.unwrap().is_none(),
        "the one permit is still taken"
    );
    assert_eq!(SLOTS.in_use(&env.store, "d").await.unwrap(), 1);
    assert!(reader.release().await.unwrap());
    assert!(permit.release().await.unwrap());
    let writer = DOCS.try_write(&env.store, "d").await.unwrap();
    assert!(
        writer
            .expect("free once the reader left")
            .release()
            .await
            .unwrap()
    );
    assert_eq!(SLOTS.in_use(&env.store, "d").await.unwrap(), 0);
}

async fn a_frozen_process_never_takes_the_works_next_step(env: Backing) {
    // The work blocks a runtime of its own past the 300 ms lease, heartbeat included: the
    // process is frozen, as under SIGSTOP. When it wakes, `run` checks the lease's expiry before it
    // polls the work again.
    let store = env.store.clone();
    let stepped = Arc::new(AtomicBool::new(false));
    let frozen = std::thread::spawn({
        let stepped = stepped.clone();
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let held = JOB
                    .try_lock(&store, "e")
                    .await
                    .unwrap()
                    .unwrap()
                    .keep_alive();
                let output = held
                    .run(async {
                        std::thread::sleep(Duration::from_millis(700));
                        tokio::task::yield_now().await;
                        stepped.store(true, Ordering::SeqCst);
                    })
                    .await;
                (output.is_some(), held.is_held())
            })
        }
    });
    let (finished, held) = tokio::task::spawn_blocking(move || frozen.join().unwrap())
        .await
        .unwrap();
    assert!(!finished, "run gave an output after the lease ran out");
    assert!(!held);
    assert!(
        !stepped.load(Ordering::SeqCst),
        "the work took its next step after its lease ran out"
    );
}

async fn a_lease_the_store_lost_ends_the_work(env: Backing) {
    let held = JOB
        .try_lock(&env.store, "f")
        .await
        .unwrap()
        .unwrap()
        .keep_alive();
    let dropped = Arc::new(AtomicBool::new(false));
    let work = {
        let dropped = DropFlag(dropped.clone());
        async move {
            let _dropped = dropped;
            std::future::pending::<()>().await;
        }
    };
    let deleted = Instant::now();
    assert!(env.raw().delete(KeyRole::Lock, "job", b"f").await);
    let output = tokio::time::timeout(Duration::from_secs(2), held.run(work)).await;
    let lost_after = deleted.elapsed();
    assert_eq!(output.expect("the work ended"), None);
    assert!(dropped.load(Ordering::SeqCst), "the work was dropped");
    // Found at the next beat, a third of the TTL after the acquisition.
    assert!(lost_after < Duration::from_millis(600), "{lost_after:?}");
    assert!(!held.is_held());
    tokio::time::timeout(Duration::from_secs(1), held.lost())
        .await
        .expect("lost() has resolved");
    assert!(!held.release().await.unwrap(), "nothing left to release");
}

async fn a_store_that_is_down_loses_the_lease_by_its_expiry(mut env: Backing) {
    let token = JOB.try_lock(&env.store, "g").await.unwrap().unwrap();
    let acquired = Instant::now();
    let held = token.keep_alive();
    let lease = held.lease();
    env.server.as_mut().expect("a single server").stop();
    let lost = tokio::time::timeout(Duration::from_secs(2), held.lost()).await;
    lost.expect("lost without the store");
    let lost_after = acquired.elapsed();
    // No extension was confirmed: the lease counts from its acquisition, less the margin.
    assert!(lost_after <= Duration::from_millis(300), "{lost_after:?}");
    assert!(lost_after >= Duration::from_millis(250), "{lost_after:?}");
    assert!(!held.is_held() && !lease.is_held());
    assert_eq!(held.run(async { 1 }).await, None);
}
