//! The network between a `PgStore` and PostgreSQL, through the harness's fault proxy, and
//! statements stuck behind another session's lock: a black hole (nothing passes, connections
//! stay open), a delay past the deadline (the bytes arrive late), a partition (connections cut,
//! new ones refused). Calls answer within the store's timeout (and a margin a loaded machine
//! keeps), a call given up on holds no lease past its give-back, the server ends a statement
//! the client gave up on, a timed-out call's connection is no later call's, and the store
//! serves again within a second of the heal.

use crate::support;

use std::time::Duration;

use tokio::time::Instant;
use tower_lease::backend::{Acquisition, Backend, LeaseRef, LockRef, Mode, Secret};
use tower_lease::{Error, Lock, RwLock, Store};
use tower_lease_harness::proxy::{Fault, Proxy};
use tower_lease_postgres::PgStore;
use tower_lease_postgres::deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};

use support::{MARGIN, live_leases};

const TIMEOUT: Duration = Duration::from_millis(300);
/// Long, so a lease a call given up on took would still be held when the test looks.
const JOBS: Lock<str> = Lock::new("partition", Duration::from_secs(20)).fenced();
const DOCS: RwLock<str> = RwLock::new("partition", Duration::from_secs(20));

/// A store whose connections go through `proxy`.
async fn behind(proxy: &Proxy, connections: usize) -> PgStore {
    PgStore::builder()
        .max_connections(connections)
        .connect(&proxy.postgres_url())
        .await
        .expect("connect through the proxy")
        .timeout(TIMEOUT)
}

/// One lock cycle on `name`.
async fn cycle(store: &Store, name: &str) {
    let token = JOBS.try_lock(store, name).await.unwrap().expect("free");
    assert!(token.release().await.unwrap());
}

/// Every connection of a pool of `n` open, its statements prepared: `n` cycles at once.
async fn warm(store: &Store, n: usize) {
    futures_util::future::join_all((0..n).map(|i| async move {
        cycle(store, &format!("warm-{i}")).await;
    }))
    .await;
}

/// Lock cycles one after another from now until one succeeds, which must be within `within`;
/// then eight more, each answered within the store's timeout.
async fn serves_again(store: &Store, within: Duration) -> Duration {
    let healed = Instant::now();
    loop {
        match JOBS.try_lock(store, "after").await {
            Ok(Some(token)) => {
                assert!(token.release().await.unwrap());
                break;
            }
            Ok(None) => panic!("nobody holds `after`"),
            Err(e) => assert!(
                healed.elapsed() < within,
                "the store still fails {:?} after the heal: {e}",
                healed.elapsed()
            ),
        }
    }
    let first = healed.elapsed();
    for i in 0..8 {
        let started = Instant::now();
        let answer = JOBS.try_lock(store, &format!("after-{i}")).await;
        let took = started.elapsed();
        let token = match answer {
            Ok(Some(token)) => token,
            other => panic!("call {i} after the heal: {:?}", other.map(|t| t.is_some())),
        };
        assert!(token.release().await.unwrap());
        assert!(took < TIMEOUT, "call {i} after the heal took {took:?}");
    }
    first
}

/// Waits (at most `within`) until no acquisition of the store waits for a lock on the server.
/// (The releases that give back what a call given up on may have taken wait for the lock
/// too, each for its own bound, and are tried again while it is held.)
async fn none_waiting(url: &str, within: Duration) {
    let client = support::client(url).await;
    let deadline = Instant::now() + within;
    loop {
        let waiting: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND state = 'active' AND query LIKE '%\\_acquire(%' \
                 AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{waiting} statements of calls given up on still wait for a lock on the server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The backend that waits for a lock on the server at `url`, once one does (within 5 s). (Read
/// on a session of its own: within a transaction, `pg_stat_activity` is read once.)
async fn waiting_pid(url: &str) -> i32 {
    let client = support::client(url).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let row = client
            .query_opt(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND pid <> pg_backend_pid() LIMIT 1",
                &[],
            )
            .await
            .unwrap();
        if let Some(row) = row {
            return row.get(0);
        }
        assert!(Instant::now() < deadline, "no call waits for the lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A session of its own that holds the row of the `Lock` name `stuck` and the advisory lock
/// of the `RwLock` name `stuck` until it is dropped (or rolls back).
async fn hold_stuck(url: &str) -> tokio_postgres::Client {
    let raw = support::client(url).await;
    raw.batch_execute(&support::versioned(
        "BEGIN; \
         SELECT 1 FROM tower_lease.locks \
         WHERE namespace = 'partition' AND name = 'stuck'::bytea FOR UPDATE; \
         SELECT pg_advisory_xact_lock(tower_lease.lock_class(), \
             tower_lease.name_key('rw', 'partition', 'stuck'::bytea))",
    ))
    .await
    .expect("hold the locks of `stuck`");
    raw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_hole_times_calls_out_and_the_store_serves_within_a_second_of_the_heal() {
    let server = support::server().await;
    let proxy = Proxy::to_postgres(&server).await;
    let pg = behind(&proxy, 4).await;
    let store: Store = pg.clone().into();
    warm(&store, 4).await;
    // A lease held from before, whose extends are plain calls (no connection kept for them).
    let secret = Secret::random();
    let lock = LockRef::new("partition", b"held", Duration::from_secs(20));
    let held = LeaseRef::new(lock, Mode::Exclusive, &secret);
    assert!(matches!(
        pg.acquire(held).await.unwrap(),
        Acquisition::Acquired { .. }
    ));

    proxy.set(Fault::Blackhole);
    let started = Instant::now();
    let (taken, extended) = tokio::join!(
        futures_util::future::join_all(
            (0..2).map(|i| JOBS.try_lock(&store, if i == 0 { "hole-0" } else { "hole-1" }))
        ),
        futures_util::future::join_all((0..2).map(|_| pg.extend(held))),
    );
    let took = started.elapsed();
    for attempt in taken {
        assert!(
            matches!(attempt, Err(Error::Timeout(_))),
            "{:?}",
            attempt.map(|t| t.is_some())
        );
    }
    for extend in extended {
        assert!(matches!(extend, Err(Error::Timeout(_))), "{extend:?}");
    }
    assert!(took < TIMEOUT + MARGIN, "{took:?}");
    // The give-backs of the acquisitions go on their connections, and time out as well.
    tokio::time::sleep(TIMEOUT * 2).await;

    proxy.set(Fault::Pass);
    let first = serves_again(&store, Duration::from_secs(1)).await;
    eprintln!("first call served {first:?} after the heal");
    assert!(matches!(
        pg.extend(held).await,
        Ok(tower_lease::backend::Extended::Held)
    ));
    assert!(pg.release(held).await.unwrap());
    // Nothing of the calls in the black hole reached the server.
    let other: Store = support::pg_store(&server).await.into();
    cycle(&other, "hole-0").await;
    cycle(&other, "hole-1").await;
    assert_eq!(live_leases(&server.url()).await, 0, "a lease left held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_given_up_on_in_a_delay_holds_no_lease_past_its_give_back() {
    let server = support::server().await;
    let url = server.url();
    let proxy = Proxy::to_postgres(&server).await;
    let store: Store = behind(&proxy, 4).await.into();
    cycle(&store, "late").await;
    let watch = support::client(&url).await;
    // The server's clock, which fences follow: (µs now, fence of `late`, whether it is held).
    let look = || async {
        let row = watch
            .query_one(
                &support::versioned(
                    "SELECT tower_lease.micros(clock_timestamp()), fence, \
                     expires > clock_timestamp() FROM tower_lease.locks \
                     WHERE namespace = 'partition' AND name = 'late'::bytea",
                ),
                &[],
            )
            .await
            .unwrap();
        (
            row.get::<_, i64>(0),
            row.get::<_, i64>(1),
            row.get::<_, bool>(2),
        )
    };

    // The network holds every byte for 1.2 s: the acquisition reaches the server long after
    // the call gave up on it, and takes the lease for its 20 s TTL.
    let delay = TIMEOUT * 4;
    let (sent_at, _, _) = look().await;
    proxy.set(Fault::Delay(delay));
    let started = Instant::now();
    let late = JOBS.try_lock(&store, "late").await;
    assert!(
        matches!(late, Err(Error::Timeout(_))),
        "{:?}",
        late.map(|t| t.is_some())
    );
    assert!(
        started.elapsed() < TIMEOUT + MARGIN,
        "{:?}",
        started.elapsed()
    );
    proxy.set(Fault::Pass);

    // It lands (its fence, the server's µs then, is at least the delay after the call), and
    // its give-back, sent behind it on its connection, frees the name right after.
    let landed_after = i64::try_from(delay.as_micros() * 9 / 10).unwrap();
    let deadline = started + delay + Duration::from_secs(2);
    loop {
        let (_, fence, held) = look().await;
        if fence >= sent_at + landed_after && !held {
            eprintln!(
                "landed {} ms after the call, free {:?} after it",
                (fence - sent_at) / 1000,
                started.elapsed()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{:?} after the call: {}",
            started.elapsed(),
            if fence >= sent_at + landed_after {
                "the acquisition given up on still holds the lease"
            } else {
                "the acquisition never landed: the test shows nothing"
            }
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let other: Store = support::pg_store(&server).await.into();
    cycle(&other, "late").await;
    cycle(&store, "late").await;
}

/// A call stuck behind another session's lock (a `Lock`'s row, an `RwLock`'s advisory lock):
/// it times out, the server ends its statement within a margin (the other session still
/// holding), and the name is free once the other session lets go.
async fn a_stuck_statement_ends_on_the_server(pg: PgStore, url: &str) {
    let store: Store = pg.into();
    cycle(&store, "stuck").await;
    let raw = hold_stuck(url).await;

    let started = Instant::now();
    let stuck = JOBS.try_lock(&store, "stuck").await;
    assert!(
        matches!(stuck, Err(Error::Timeout(_))),
        "{:?}",
        stuck.map(|t| t.is_some())
    );
    assert!(
        started.elapsed() < TIMEOUT + MARGIN,
        "{:?}",
        started.elapsed()
    );
    none_waiting(url, MARGIN).await;

    let started = Instant::now();
    let stuck = DOCS.try_write(&store, "stuck").await;
    assert!(
        matches!(stuck, Err(Error::Timeout(_))),
        "{:?}",
        stuck.map(|t| t.is_some())
    );
    assert!(
        started.elapsed() < TIMEOUT + MARGIN,
        "{:?}",
        started.elapsed()
    );
    none_waiting(url, MARGIN).await;

    raw.batch_execute("ROLLBACK").await.unwrap();
    // Neither took its lease after the other session let go.
    let other: Store = support::pg_store_timeout(url, TIMEOUT).await;
    cycle(&other, "stuck").await;
    let token = DOCS
        .try_write(&other, "stuck")
        .await
        .unwrap()
        .expect("free");
    assert!(token.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_statement_ends_on_the_server_on_the_stores_pool() {
    let server = support::server().await;
    let pg = PgStore::connect(&server.url())
        .await
        .unwrap()
        .timeout(TIMEOUT);
    a_stuck_statement_ends_on_the_server(pg, &server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_statement_ends_on_the_server_on_your_pool() {
    let server = support::server().await;
    let manager = Manager::from_config(
        server.url().parse().unwrap(),
        tokio_postgres::NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager).max_size(4).build().unwrap();
    let pg = PgStore::from_pool(pool).await.unwrap().timeout(TIMEOUT);
    a_stuck_statement_ends_on_the_server(pg, &server.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_calls_connection_is_not_the_next_calls() {
    let server = support::server().await;
    let url = server.url();
    // One connection: the next call would queue behind a stuck statement on it.
    let pg = PgStore::builder()
        .max_connections(1)
        .connect(&url)
        .await
        .unwrap()
        .timeout(TIMEOUT);
    let store: Store = pg.clone().into();
    let secret = Secret::random();
    let lock = LockRef::new("partition", b"stuck", Duration::from_secs(20));
    let lease = LeaseRef::new(lock, Mode::Exclusive, &secret);
    assert!(matches!(
        pg.acquire(lease).await.unwrap(),
        Acquisition::Acquired { .. }
    ));
    let raw = hold_stuck(&url).await;

    // An extend (a plain call: nothing keeps its connection for a later one) stuck behind the
    // row's lock.
    let extending = tokio::spawn({
        let (pg, secret) = (pg.clone(), secret.clone());
        async move {
            let lock = LockRef::new("partition", b"stuck", Duration::from_secs(20));
            let started = Instant::now();
            let extended = pg
                .extend(LeaseRef::new(lock, Mode::Exclusive, &secret))
                .await;
            (extended, started.elapsed())
        }
    });
    let stuck_pid = waiting_pid(&url).await;
    let (extended, took) = extending.await.unwrap();
    assert!(matches!(extended, Err(Error::Timeout(_))), "{extended:?}");
    assert!(took < TIMEOUT + MARGIN, "{took:?}");

    // The next call answers at once, on another connection.
    let started = Instant::now();
    let next = JOBS.try_lock(&store, "next").await;
    let took = started.elapsed();
    let token = match next {
        Ok(Some(token)) => token,
        other => panic!("the next call: {:?}", other.map(|t| t.is_some())),
    };
    assert!(took < TIMEOUT, "the next call took {took:?}");
    assert!(token.release().await.unwrap());
    // Nothing of the stuck call runs on: its connection is closed (the client's deadline
    // came first) or idle (the server's bound did, and answered).
    let watch = support::client(&url).await;
    let deadline = Instant::now() + MARGIN;
    loop {
        let busy: i64 = watch
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state <> 'idle'",
                &[&stuck_pid],
            )
            .await
            .unwrap()
            .get(0);
        if busy == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the timed-out call's statement (backend {stuck_pid}) still runs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    raw.batch_execute("ROLLBACK").await.unwrap();
    assert!(pg.release(lease).await.unwrap());
    assert_eq!(live_leases(&url).await, 0, "a lease left held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_the_server_cancels_answers_timeout() {
    let server = support::server().await;
    let url = server.url();
    // A deadline far off: the answer comes from the server's cancel, not from the client.
    let store: Store = support::pg_store_timeout(&url, Duration::from_secs(5)).await;
    cycle(&store, "stuck").await;
    let raw = hold_stuck(&url).await;
    let started = Instant::now();
    let attempt = tokio::spawn({
        let store = store.clone();
        async move { JOBS.try_lock(&store, "stuck").await.map(|t| t.is_some()) }
    });
    let pid = waiting_pid(&url).await;
    raw.query_one("SELECT pg_cancel_backend($1)", &[&pid])
        .await
        .unwrap();
    let attempt = attempt.await.unwrap();
    assert!(matches!(attempt, Err(Error::Timeout(_))), "{attempt:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    raw.batch_execute("ROLLBACK").await.unwrap();
    cycle(&store, "stuck").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_fails_calls_within_the_deadline_and_the_store_serves_within_a_second_of_the_heal()
 {
    let server = support::server().await;
    let proxy = Proxy::to_postgres(&server).await;
    let store: Store = behind(&proxy, 4).await.into();
    warm(&store, 4).await;

    // Every open connection cut, every new one refused.
    proxy.set(Fault::Reset);
    proxy.sever();
    for i in 0..3 {
        let started = Instant::now();
        let attempt = JOBS.try_lock(&store, &format!("cut-{i}")).await;
        assert!(attempt.is_err(), "{:?}", attempt.map(|t| t.is_some()));
        assert!(
            started.elapsed() < TIMEOUT + MARGIN,
            "{:?}",
            started.elapsed()
        );
    }

    proxy.set(Fault::Pass);
    let first = serves_again(&store, Duration::from_secs(1)).await;
    eprintln!("first call served {first:?} after the heal");
    for i in 0..3 {
        cycle(&store, &format!("cut-{i}")).await;
    }
    assert_eq!(live_leases(&server.url()).await, 0, "a lease left held");
}
