//! Bounded waits on every store: woken at once by a release in this process, found by polling
//! after a release elsewhere, given up after the wait, queued so that only the first waiter of
//! a name asks the store, and leaving nothing behind when dropped.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tower_lease::{Lock, RwLock, Store};

use tower_lease_harness::Backing;
use tower_lease_harness::hooked::hooked;

const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(5));
const DOCS: RwLock<str> = RwLock::new("docs", Duration::from_secs(5));

tower_lease_harness::store_tests!(
    Layer: [
        a_release_in_this_process_wakes_the_waiter_at_once,
        a_wait_that_runs_out_answers_none_after_the_wait,
        a_writer_waits_for_the_readers_and_a_reader_for_the_writer,
        a_dropped_waiter_takes_no_lease,
    ],
    redis: [a_release_in_another_process_is_found_by_polling]
);

async fn a_release_in_this_process_wakes_the_waiter_at_once(env: Backing) {
    // The store as the waiter sees it: the instant each attempt is answered.
    let (answered, mut attempts) = watch::channel(Instant::now());
    let store = hooked(env.store.clone(), move |answer| {
        answered.send_replace(Instant::now());
        answer
    });
    // A 5 s lease: no attempt is timed by the holder's lease end.
    let holder = JOBS.try_lock(&store, "a").await.unwrap().unwrap();
    let waiter = tokio::spawn({
        let store = store.clone();
        async move {
            (
                JOBS.try_lock_for(&store, "a", Duration::from_secs(2)).await,
                Instant::now(),
            )
        }
    });
    // By 200 ms the polls have backed off to 100 ms (5 + 10 + 20 + 40 + 80 ms, each +25 % at
    // most, is under 200 ms): the release follows an attempt at once, and a waiter that only
    // polled would try again 75 ms later at the earliest (100 ms less its jitter).
    tokio::time::sleep(Duration::from_millis(200)).await;
    attempts.mark_unchanged();
    attempts.changed().await.unwrap();
    let refused = *attempts.borrow();
    let released = Instant::now();
    assert!(holder.release().await.unwrap());
    let (token, acquired) = waiter.await.unwrap();
    assert!(token.unwrap().is_some(), "the waiter got the lock");
    let handed_off = acquired - refused;
    assert!(
        handed_off < Duration::from_millis(60),
        "handed off {handed_off:?} after the refused attempt ({:?} after the release)",
        acquired - released
    );
}

async fn a_wait_that_runs_out_answers_none_after_the_wait(env: Backing) {
    let _holder = JOBS.try_lock(&env.store, "b").await.unwrap().unwrap();
    let started = Instant::now();
    let token = JOBS
        .try_lock_for(&env.store, "b", Duration::from_millis(100))
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(token.is_none());
    assert!(took >= Duration::from_millis(100), "gave up after {took:?}");
    assert!(took < Duration::from_millis(400), "gave up after {took:?}");

    // A zero wait is one attempt.
    let started = Instant::now();
    assert!(
        JOBS.try_lock_for(&env.store, "b", Duration::ZERO)
            .await
            .unwrap()
            .is_none()
    );
    assert!(started.elapsed() < Duration::from_millis(100));
}

async fn a_writer_waits_for_the_readers_and_a_reader_for_the_writer(env: Backing) {
    let reader = DOCS.try_read(&env.store, "d").await.unwrap().unwrap();
    let store = env.store.clone();
    let writer = tokio::spawn(async move {
        DOCS.try_write_for(&store, "d", Duration::from_secs(2))
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(reader.release().await.unwrap());
    let writer = writer.await.unwrap().unwrap().expect("the writer got in");

    let store = env.store.clone();
    let reader =
        tokio::spawn(async move { DOCS.try_read_for(&store, "d", Duration::from_secs(2)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(writer.release().await.unwrap());
    assert!(
        reader.await.unwrap().unwrap().is_some(),
        "the reader got in"
    );
}

async fn a_dropped_waiter_takes_no_lease(env: Backing) {
    let holder = JOBS.try_lock(&env.store, "e").await.unwrap().unwrap();
    let wait = JOBS.try_lock_for(&env.store, "e", Duration::from_secs(2));
    assert!(
        tokio::time::timeout(Duration::from_millis(150), wait)
            .await
            .is_err()
    );
    assert!(holder.release().await.unwrap());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let again = JOBS.try_lock(&env.store, "e").await.unwrap();
    assert!(
        again
            .expect("nobody took it after the waiter left")
            .release()
            .await
            .unwrap()
    );
}

async fn a_release_in_another_process_is_found_by_polling(env: Backing) {
    // A second store handle over the same Redis has waiters of its own, as another process.
    let elsewhere = env.raw().store_with_prefix("tower-lease");
    let holder = JOBS.try_lock(&elsewhere, "c").await.unwrap().unwrap();
    let store = env.store.clone();
    let waiter = tokio::spawn(async move {
        (
            JOBS.try_lock_for(&store, "c", Duration::from_secs(2)).await,
            Instant::now(),
        )
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert!(holder.release().await.unwrap());
    let (token, acquired) = waiter.await.unwrap();
    assert!(token.unwrap().is_some());
    let found = acquired - released;
    // The next poll: at most 100 ms apart (+25 % jitter), plus a round trip under load.
    assert!(found < Duration::from_millis(250), "found after {found:?}");
}

/// Twenty waiters in one process while a lock is held for 300 ms: only the first asks the store
/// (its polls back off), then each is served in turn, first come, first served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_first_waiter_of_a_name_asks_the_store_and_all_are_served_in_order() {
    let acquires = Arc::new(AtomicUsize::new(0));
    let store = hooked(Store::memory(), {
        let acquires = acquires.clone();
        move |answer| {
            acquires.fetch_add(1, Ordering::SeqCst);
            answer
        }
    });
    let holder = JOBS.try_lock(&store, "q").await.unwrap().unwrap();
    let served = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..20 {
        let (store, served) = (store.clone(), served.clone());
        let (seated, seat_taken) = tokio::sync::oneshot::channel();
        waiters.push(tokio::spawn(async move {
            let mut wait = std::pin::pin!(JOBS.try_lock_for(&store, "q", Duration::from_secs(10)));
            // Its first poll takes its seat in the queue.
            let first = std::future::poll_fn(|cx| Poll::Ready(wait.as_mut().poll(cx))).await;
            let _ = seated.send(());
            let token = match first {
                Poll::Ready(token) => token,
                Poll::Pending => wait.await,
            }
            .unwrap();
            served.lock().unwrap().push(i);
            assert!(
                token
                    .expect("served within the wait")
                    .release()
                    .await
                    .unwrap()
            );
        }));
        // Queued in a known order: each seated before the next comes (a spawned task may
        // first run after a later one on a loaded machine).
        seat_taken.await.unwrap();
    }
    let before = acquires.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let while_held = acquires.load(Ordering::SeqCst) - before;
    // One waiter polling with backoff (5, 10, 20, 40, 80, 100 ms…) asks about 6 times in
    // 300 ms; twenty polling waiters would ask about 120 times.
    assert!(
        while_held <= 12,
        "{while_held} acquisitions while the lock was held"
    );
    assert!(holder.release().await.unwrap());
    for waiter in waiters {
        waiter.await.unwrap();
    }
    let served = served.lock().unwrap().clone();
    assert_eq!(
        served,
        (0..20).collect::<Vec<_>>(),
        "first come, first served"
    );
}

/// Two replicas, each with the connection `RedisStore::connect` makes (and so release
/// notifications): a release in one wakes the other's waiter at once, and a waited acquisition
/// costs the waiter seven commands (the refused `SET`; then `acquire.lua`, which tries the
/// `SET NX` again and, refused, marks the holder's key with a `SET` and answers its `PTTL`;
/// once subscribed, the script again, since a release may have come before the subscription,
/// its `SET NX` and `PTTL` finding the mark in place; then the script's `SET` that wins), where
/// polling would have asked every few milliseconds. (Scripts' commands count in `INFO
/// commandstats`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_notifications_a_release_elsewhere_wakes_the_waiter_at_once() {
    use tower_lease::RedisStore;
    use tower_lease_harness::server::{calls, commandstats};
    use tower_lease_harness::{Endpoint, RedisServer};

    let server = RedisServer::start();
    let holder_replica: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let waiter_replica: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let raw = server.connection().await;
    let holder = JOBS.try_lock(&holder_replica, "n").await.unwrap().unwrap();
    let before = commandstats(&raw).await;
    let waiter = tokio::spawn(async move {
        let token = JOBS
            .try_lock_for(&waiter_replica, "n", Duration::from_secs(3))
            .await;
        (token, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    let released = Instant::now();
    assert!(holder.release().await.unwrap());
    let (token, acquired) = waiter.await.unwrap();
    let after = commandstats(&raw).await;
    let handed_off = acquired - released;
    assert!(
        handed_off < Duration::from_millis(60),
        "handed off after {handed_off:?}"
    );
    let sets = calls(&after, "set") - calls(&before, "set");
    let pttls = calls(&after, "pttl") - calls(&before, "pttl");
    assert_eq!(
        (sets, pttls),
        (5, 2),
        "the waiter's commands while waiting 700 ms"
    );
    assert!(token.unwrap().unwrap().release().await.unwrap());
}

/// The same for a semaphore: a permit released in one replica wakes a waiter for it in the other
/// at once, through the semaphore's channel; the waiter's attempts are the one refused at first,
/// the one once subscribed, and the one that wins (by `evalsha` calls of the permit script: 3;
/// the live release is a plain `ZREM`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_notifications_a_permit_released_elsewhere_wakes_the_waiter_at_once() {
    use tower_lease::{RedisStore, Semaphore};
    use tower_lease_harness::server::{calls, commandstats};
    use tower_lease_harness::{Endpoint, RedisServer};

    const POOL: Semaphore<str> = Semaphore::new("pool", 1, Duration::from_secs(10));
    let server = RedisServer::start();
    let holder_replica: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let waiter_replica: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let raw = server.connection().await;
    let holder = POOL
        .try_acquire(&holder_replica, "n")
        .await
        .unwrap()
        .unwrap();
    let before = commandstats(&raw).await;
    let waiter = tokio::spawn(async move {
        let permit = POOL
            .try_acquire_for(&waiter_replica, "n", Duration::from_secs(3))
            .await;
        (permit, Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    let released = Instant::now();
    assert!(holder.release().await.unwrap());
    let (permit, acquired) = waiter.await.unwrap();
    let after = commandstats(&raw).await;
    let handed_off = acquired - released;
    assert!(
        handed_off < Duration::from_millis(60),
        "handed off after {handed_off:?}"
    );
    let scripts = calls(&after, "evalsha") - calls(&before, "evalsha");
    let zrems = calls(&after, "zrem") - calls(&before, "zrem");
    assert_eq!(
        (scripts, zrems),
        (3, 1),
        "three attempts and one release in 700 ms of waiting"
    );
    assert!(permit.unwrap().unwrap().release().await.unwrap());
}

/// A release racing a waiter's start, 60 times, at random offsets: with release notifications
/// (whose safety poll is 1 s) a missed wake-up would show as a hand-off of about a second. The
/// waiter subscribes before its first attempt, so none is missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_racing_the_waiters_subscription_is_never_missed() {
    use tower_lease::RedisStore;
    use tower_lease_harness::{Endpoint, RedisServer};

    let server = RedisServer::start();
    let holder_replica: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let waiter_replica: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    for round in 0..60 {
        let name = format!("race-{round}");
        let holder = JOBS
            .try_lock(&holder_replica, &name)
            .await
            .unwrap()
            .unwrap();
        let waiter = tokio::spawn({
            let (store, name) = (waiter_replica.clone(), name.clone());
            async move {
                let token = JOBS
                    .try_lock_for(&store, &name, Duration::from_secs(5))
                    .await;
                (token, Instant::now())
            }
        });
        // From before the waiter has subscribed to after its first attempt.
        tokio::time::sleep(Duration::from_micros(rand::random_range(0..3_000))).await;
        let released = Instant::now();
        assert!(holder.release().await.unwrap());
        let (token, acquired) = waiter.await.unwrap();
        let handed_off = acquired.saturating_duration_since(released);
        assert!(
            handed_off < Duration::from_millis(300),
            "round {round}: handed off after {handed_off:?}"
        );
        assert!(token.unwrap().unwrap().release().await.unwrap());
    }
}
