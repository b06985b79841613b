//! `RwLock`: one writer, or any number of readers with a lease each.

use std::time::Duration;

use tokio::time::{Instant, sleep};
use tower_lease::backend::{LockRef, Mode};
use tower_lease::{Attempt, RwLock};

use crate::{Env, ROUNDING, assert_strangers_refused, poll};

const CATALOG: RwLock<str> = RwLock::new("catalog", Duration::from_secs(10));

/// Ten readers of one name hold at once, and each release answers `true`.
pub async fn readers_share(env: Env) {
    let mut readers = Vec::new();
    for _ in 0..10 {
        let reader = CATALOG.try_read(&env.store, "shop").await.unwrap();
        readers.push(reader.expect("readers must not exclude each other"));
    }
    for reader in readers {
        assert!(reader.release().await.unwrap());
    }
}

/// A writer refuses a second writer and any reader; once it released, a reader gets in at
/// once.
pub async fn writer_excludes_everyone(env: Env) {
    let writer = CATALOG
        .try_write(&env.store, "shop")
        .await
        .unwrap()
        .unwrap();
    assert!(
        CATALOG
            .try_write(&env.store, "shop")
            .await
            .unwrap()
            .is_none(),
        "two writers"
    );
    assert!(
        CATALOG
            .try_read(&env.store, "shop")
            .await
            .unwrap()
            .is_none(),
        "reader beside writer"
    );
    assert!(writer.release().await.unwrap());
    let reader = CATALOG.try_read(&env.store, "shop").await.unwrap();
    assert!(
        reader.is_some(),
        "a released writer must let readers in at once"
    );
}

/// Two readers refuse a writer; releasing one leaves the other's lease in place (it extends,
/// and still refuses the writer); once both released, the writer gets in.
pub async fn readers_block_writer_until_released(env: Env) {
    let first = CATALOG.try_read(&env.store, "shop").await.unwrap().unwrap();
    let second = CATALOG.try_read(&env.store, "shop").await.unwrap().unwrap();
    assert!(
        CATALOG
            .try_write(&env.store, "shop")
            .await
            .unwrap()
            .is_none()
    );

    // Releasing one reader leaves the other's lease in place.
    assert!(first.release().await.unwrap());
    assert!(
        second.extend().await.unwrap(),
        "the other reader's lease went with the first"
    );
    assert!(
        CATALOG
            .try_write(&env.store, "shop")
            .await
            .unwrap()
            .is_none()
    );

    assert!(second.release().await.unwrap());
    let writer = CATALOG.try_write(&env.store, "shop").await.unwrap();
    assert!(
        writer.is_some(),
        "no reader is left, the writer must get in"
    );
}

/// A reader lease nobody releases stops refusing writers no earlier than its TTL and no later
/// than 250 ms past it.
pub async fn crashed_reader_stops_blocking_after_ttl(env: Env) {
    let ttl = Duration::from_millis(300);
    let short = RwLock::<str>::new("catalog", ttl);
    let sent = Instant::now();
    drop(short.try_read(&env.store, "crash").await.unwrap().unwrap());
    let answered = Instant::now();

    // Sent at `got_in`, answered at `seen_in`: only the answer bounds the TTL from below.
    let ((writer, seen_in), got_in) =
        poll(Duration::from_millis(5), Duration::from_secs(3), || async {
            let writer = short.try_write(&env.store, "crash").await.unwrap();
            writer.map(|writer| (writer, Instant::now()))
        })
        .await
        .expect("a crashed reader must stop blocking writers");
    assert!(
        seen_in + ROUNDING >= sent + ttl,
        "writer got in {:?} after the read, before the reader's TTL",
        seen_in - sent
    );
    assert!(
        got_in <= answered + ttl + Duration::from_millis(250),
        "writer waited far too long"
    );
    assert!(writer.release().await.unwrap());
}

/// Strangers can neither release nor extend a reader or a writer lease; once a lease ran out,
/// its own token can neither extend it nor release it, and a stale writer leaves the next one
/// alone.
pub async fn reader_and_writer_tokens_are_holder_only(env: Env) {
    let short = RwLock::<str>::new("catalog", Duration::from_millis(200));
    let lock = LockRef::new(short.namespace(), b"tokens", short.ttl());

    let reader = short.try_read(&env.store, "tokens").await.unwrap().unwrap();
    assert_strangers_refused(&env.store, lock, Mode::Read).await;
    assert!(
        short
            .try_write(&env.store, "tokens")
            .await
            .unwrap()
            .is_none(),
        "stranger freed it"
    );
    sleep(Duration::from_millis(300)).await;
    assert!(
        !reader.extend().await.unwrap(),
        "a reader extended after its lease ran out"
    );
    assert!(
        !reader.release().await.unwrap(),
        "a reader released after its lease ran out"
    );

    let writer = short
        .try_write(&env.store, "tokens")
        .await
        .unwrap()
        .unwrap();
    assert_strangers_refused(&env.store, lock, Mode::Write).await;
    assert!(
        short
            .try_read(&env.store, "tokens")
            .await
            .unwrap()
            .is_none(),
        "stranger freed it"
    );
    sleep(Duration::from_millis(300)).await;
    assert!(
        !writer.extend().await.unwrap(),
        "a writer extended after its lease ran out"
    );
    let next = CATALOG.try_write(&env.store, "tokens").await.unwrap();
    assert!(next.is_some(), "a failed extend must not re-acquire");
    assert!(
        !writer.release().await.unwrap(),
        "a stale writer released the next one's lease"
    );
    assert!(
        CATALOG
            .try_read(&env.store, "tokens")
            .await
            .unwrap()
            .is_none(),
        "next writer lost"
    );
}

/// Asserts that `attempt`, sent at `asked` and answered at `told`, waits for a lease that ends
/// between `earliest` and `latest`.
fn assert_retry_after<T>(
    attempt: Attempt<T>,
    (asked, told): (Instant, Instant),
    (earliest, latest): (Instant, Instant),
) {
    let Attempt::Busy { retry_after } = attempt else {
        panic!("the lock is held")
    };
    let at_most = latest.saturating_duration_since(asked) + ROUNDING;
    let at_least = earliest
        .saturating_duration_since(told)
        .saturating_sub(ROUNDING);
    assert!(
        retry_after >= at_least && retry_after <= at_most,
        "retry_after {retry_after:?} not within {at_least:?}..={at_most:?}"
    );
}

/// A writer's remaining lease is the `retry_after` of refused readers and writers; readers
/// refuse a writer with the *last* reader's remaining lease (not the first's).
pub async fn retry_after_for_read_and_write(env: Env) {
    let ttl = Duration::from_millis(1000);
    let lock = RwLock::<str>::new("catalog", ttl);
    let longer = RwLock::<str>::new("catalog", ttl * 2);

    // A writer blocks readers and writers until its lease ends.
    let sent = Instant::now();
    let writer = lock.try_write(&env.store, "wait").await.unwrap().unwrap();
    let answered = Instant::now();
    sleep(Duration::from_millis(200)).await;
    for read in [true, false] {
        let asked = Instant::now();
        let attempt = if read {
            lock.attempt_read(&env.store, "wait")
                .await
                .unwrap()
                .map(drop)
        } else {
            lock.attempt_write(&env.store, "wait")
                .await
                .unwrap()
                .map(drop)
        };
        let told = Instant::now();
        assert_retry_after(attempt, (asked, told), (sent + ttl, answered + ttl));
    }
    assert!(writer.release().await.unwrap());

    // Readers block a writer until the *last* reader lease ends.
    let sent = Instant::now();
    let _short_reader = lock.try_read(&env.store, "wait").await.unwrap().unwrap();
    let _long_reader = longer.try_read(&env.store, "wait").await.unwrap().unwrap();
    let answered = Instant::now();
    sleep(Duration::from_millis(200)).await;
    let asked = Instant::now();
    let attempt = lock.attempt_write(&env.store, "wait").await.unwrap();
    let told = Instant::now();
    assert_retry_after(attempt, (asked, told), (sent + ttl * 2, answered + ttl * 2));
}

/// Fenced writers take increasing fences; a reader's fence is the last writer's (0 before any
/// writer); an unfenced lock hands out none.
pub async fn write_fences_increase_and_readers_see_the_generation(env: Env) {
    let fenced = CATALOG.fenced();
    let reader = fenced.try_read(&env.store, "gen").await.unwrap().unwrap();
    assert_eq!(reader.fence(), Some(0), "nobody has written yet");
    assert!(reader.release().await.unwrap());

    let mut last = 0;
    for _ in 0..3 {
        let writer = fenced.try_write(&env.store, "gen").await.unwrap().unwrap();
        let fence = writer.fence().expect("a fenced writer has a fence");
        assert!(fence > last, "fence {fence} after {last}");
        last = fence;
        assert!(writer.release().await.unwrap());
    }
    let reader = fenced.try_read(&env.store, "gen").await.unwrap().unwrap();
    assert_eq!(
        reader.fence(),
        Some(last),
        "a reader sees the last writer's generation"
    );
    let plain = CATALOG
        .try_write(&env.store, "plain")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(plain.fence(), None);
}

/// A reader released after its lease ran out answers `false`, while other readers' leases,
/// live or ended, are in the lock; the last live reader's release then lets a writer in.
pub async fn a_reader_released_after_its_lease_ran_out_answers_false(env: Env) {
    let short = RwLock::<str>::new("catalog", Duration::from_millis(200));
    let first = short.try_read(&env.store, "late").await.unwrap().unwrap();
    let second = short.try_read(&env.store, "late").await.unwrap().unwrap();
    let live = CATALOG.try_read(&env.store, "late").await.unwrap().unwrap();
    sleep(Duration::from_millis(300)).await;
    assert!(!first.release().await.unwrap(), "an ended reader released");
    assert!(
        CATALOG
            .try_write(&env.store, "late")
            .await
            .unwrap()
            .is_none(),
        "a writer got in beside a live reader"
    );
    assert!(live.release().await.unwrap(), "a live reader's release");
    let writer = CATALOG
        .try_write(&env.store, "late")
        .await
        .unwrap()
        .expect("the last live reader's release lets a writer in");
    assert!(!second.release().await.unwrap(), "an ended reader released");
    assert!(writer.release().await.unwrap());
}
