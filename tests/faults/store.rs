//! The store when Redis or the network misbehaves, against real `redis-server` processes and the
//! fault proxy of the test harness: a restart, `SCRIPT FLUSH` under load, a blackholed
//! connection, and replies lost after Redis acted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tower_lease::backend::{LeaseRef, LockRef, Mode, Secret};
use tower_lease::store::{KeyLayout, KeyRole};
use tower_lease::{Error, Lock, RedisStore, RwLock, Store};

use tower_lease_harness::proxy::{Fault, Proxy};
use tower_lease_harness::{Endpoint, RedisServer, poll};

const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(10));
const DOCS: RwLock<str> = RwLock::new("docs", Duration::from_secs(10));

/// How many times the server ran `command` (`INFO commandstats`).
async fn command_calls(conn: &mut redis::aio::MultiplexedConnection, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    let field = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&field)?.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// Polls `f` every 10 ms until it answers `Some`, for at most `limit`.
async fn within<T, Fut>(limit: Duration, f: impl FnMut() -> Fut) -> Option<T>
where
    Fut: Future<Output = Option<T>>,
{
    poll(Duration::from_millis(10), limit, f)
        .await
        .map(|(value, _)| value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_loses_leases_and_the_store_recovers_by_itself() {
    let server = RedisServer::start();
    let store = Store::from(RedisStore::new(server.connection_manager().await));
    let lock = JOBS.try_lock(&store, "restart").await.unwrap().unwrap();
    let read = DOCS.try_read(&store, "restart").await.unwrap().unwrap();

    let server = tokio::task::spawn_blocking(move || {
        let mut server = server;
        server.restart();
        server
    })
    .await
    .unwrap();
    let restarted = Instant::now();

    // The holders learn the loss: extend answers false (after at most a few errors while the
    // connection manager reconnects), and never true, which would mean it re-created the key.
    let errors = AtomicUsize::new(0);
    let lost = within(Duration::from_secs(5), || async {
        match lock.extend().await {
            Ok(still_held) => Some(still_held),
            Err(_) => {
                errors.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    })
    .await;
    let errors = errors.into_inner();
    assert_eq!(
        lost,
        Some(false),
        "the exclusive holder must learn its lease is gone"
    );
    let detected = restarted.elapsed();
    assert!(
        !read.extend().await.unwrap(),
        "the reader must learn its lease is gone"
    );

    // The same store, never rebuilt, takes leases again (scripts reloaded on NOSCRIPT).
    let again = JOBS
        .try_lock(&store, "restart")
        .await
        .unwrap()
        .expect("free after the restart");
    assert!(again.release().await.unwrap());
    assert!(!lock.release().await.unwrap());
    eprintln!("restart: loss detected {detected:?} after the restart, {errors} errors before");
    assert!(detected < Duration::from_secs(3), "{detected:?}");
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_under_load_never_reaches_a_caller() {
    let server = RedisServer::start();
    let store = Store::from(RedisStore::new(server.connection().await));
    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicUsize::new(0));

    let mut workers = Vec::new();
    for worker in 0..16 {
        let (store, stop, ops) = (store.clone(), stop.clone(), ops.clone());
        workers.push(tokio::spawn(async move {
            let name = format!("flush-{}", worker % 4);
            let mut failures = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let result: Result<(), Error> = async {
                    if let Some(token) = JOBS.try_lock(&store, &name).await? {
                        token.extend().await?;
                        token.release().await?;
                    }
                    if let Some(token) = DOCS.try_read(&store, &name).await? {
                        token.extend().await?;
                        token.release().await?;
                    }
                    if let Some(token) = DOCS.try_write(&store, &name).await? {
                        token.release().await?;
                    }
                    Ok(())
                }
                .await;
                ops.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = result {
                    failures.push(e.to_string());
                }
            }
            failures
        }));
    }

    let flushes = server.flush_scripts_for(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let mut failures = Vec::new();
    for worker in workers {
        failures.extend(worker.await.unwrap());
    }
    let ops = ops.load(Ordering::Relaxed);
    eprintln!(
        "script flush: {flushes} flushes during {ops} rounds, {} failures",
        failures.len()
    );
    assert!(
        flushes > 100 && ops > 500,
        "too little load to mean anything: {flushes} / {ops}"
    );
    assert!(
        failures.is_empty(),
        "{} calls failed, first: {:?}",
        failures.len(),
        failures.first()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_turns_every_call_into_a_prompt_timeout() {
    let server = RedisServer::start();
    let proxy = Proxy::to(&server).await;
    let timeout = Duration::from_millis(250);
    let store: Store = RedisStore::new(proxy.connection_manager().await)
        .timeout(timeout)
        .into();
    let held = JOBS.try_lock(&store, "blackhole").await.unwrap().unwrap();

    proxy.set(Fault::Blackhole);
    let mut slowest = Duration::ZERO;
    let first = JOBS.try_lock(&store, "first").await;
    assert!(
        matches!(first, Err(Error::Timeout(d)) if d == timeout),
        "{first:?}"
    );
    for _ in 0..3 {
        let started = Instant::now();
        let acquire = JOBS.try_lock(&store, "other").await;
        let extend = held.extend().await;
        let read = DOCS.try_read(&store, "other").await;
        let elapsed = started.elapsed();
        slowest = slowest.max(elapsed);
        // Our timeout, or redis-rs's own response timeout (500 ms) for a command sent earlier
        // breaking the connection: an error either way, never an answer and never a hang.
        for outcome in [acquire.map(|_| ()), extend.map(|_| ()), read.map(|_| ())] {
            assert!(outcome.is_err(), "{outcome:?}");
        }
        // Three calls, each bounded by the timeout plus scheduling slack.
        assert!(
            elapsed < 3 * timeout + Duration::from_millis(600),
            "{elapsed:?}"
        );
    }

    // A partition ends with broken connections; the connection manager reconnects by itself.
    proxy.sever();
    proxy.set(Fault::Pass);
    let recovered = Instant::now();
    let extended = within(Duration::from_secs(5), || async {
        held.extend().await.ok()
    })
    .await;
    assert_eq!(
        extended,
        Some(true),
        "the lease outlived the 0.75 s outage (TTL 10 s)"
    );
    eprintln!(
        "blackhole: 3 calls took at most {slowest:?} with a {timeout:?} timeout; \
         recovered {:?} after the partition ended",
        recovered.elapsed()
    );
    assert!(held.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_timeout_bounds_a_blackholed_call() {
    let server = RedisServer::start();
    let proxy = Proxy::to(&server).await;
    let store = Store::from(RedisStore::new(proxy.connection_manager().await));
    JOBS.try_lock(&store, "warm")
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
    proxy.set(Fault::Blackhole);
    let started = Instant::now();
    let outcome = JOBS.try_lock(&store, "default").await;
    let elapsed = started.elapsed();
    // redis-rs's own response timeout (500 ms) or the store's timeout (1 s), whichever first.
    assert!(outcome.is_err(), "{outcome:?}");
    assert!(elapsed < Duration::from_millis(1500), "{elapsed:?}");
    eprintln!("blackhole with defaults: {outcome:?} after {elapsed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_fail_fast() {
    let server = RedisServer::start();
    let proxy = Proxy::to(&server).await;
    let store: Store = RedisStore::new(proxy.connection_manager().await)
        .timeout(Duration::from_millis(500))
        .into();
    proxy.set(Fault::Reset);
    proxy.sever();
    for _ in 0..5 {
        let started = Instant::now();
        let outcome = JOBS.try_lock(&store, "reset").await;
        assert!(outcome.is_err(), "{outcome:?}");
        assert!(
            started.elapsed() < Duration::from_millis(900),
            "{:?}",
            started.elapsed()
        );
    }
    proxy.set(Fault::Pass);
    let back = within(Duration::from_secs(5), || async {
        JOBS.try_lock(&store, "reset").await.ok().flatten()
    })
    .await;
    assert!(
        back.expect("the store works again")
            .release()
            .await
            .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquire_replies_leave_no_key_once_their_calls_timed_out() {
    const SHORT: Lock<str> = Lock::new("short", Duration::from_millis(600));
    const SHORT_DOCS: RwLock<str> = RwLock::new("short-docs", Duration::from_millis(600));
    let server = RedisServer::start();
    let proxy = Proxy::to(&server).await;
    let store: Store = RedisStore::new(proxy.connection_manager().await)
        .timeout(Duration::from_millis(150))
        .into();
    // Cache the scripts, so that the first command of each call acts (a NOSCRIPT answer would
    // be dropped too, and nothing would reach Redis).
    let warm = SHORT.try_lock(&store, "warm").await.unwrap().unwrap();
    assert!(warm.release().await.unwrap());
    let warm = SHORT_DOCS.try_read(&store, "warm").await.unwrap().unwrap();
    assert!(warm.release().await.unwrap());
    // A token releases a reader it knows live without a script; a timed-out acquisition's
    // reader is given back by the checked release's script, cached here through the backend.
    let (lock, secret) = (
        LockRef::new("short-docs", b"warm", Duration::from_millis(600)),
        Secret::random(),
    );
    let backend = store.backend();
    backend
        .acquire(LeaseRef::new(lock, Mode::Read, &secret))
        .await
        .unwrap();
    assert!(
        backend
            .release(LeaseRef::new(lock, Mode::Read, &secret))
            .await
            .unwrap()
    );
    let mut direct = server.connection().await;
    let layout = KeyLayout::default();

    let sets_before = command_calls(&mut direct, "set").await;
    proxy.set(Fault::DropReplies);
    let first_sent = Instant::now();
    let mut calls = tokio::task::JoinSet::new();
    let mut keys = Vec::new();
    for i in 0..20 {
        let name = format!("ambiguous-{i}");
        keys.push(layout.key(KeyRole::Lock, "short", name.as_bytes()));
        keys.push(layout.key(KeyRole::Readers, "short-docs", name.as_bytes()));
        let store = store.clone();
        calls.spawn(async move {
            let exclusive = SHORT.try_lock(&store, &name).await.map(|t| t.is_some());
            let read = SHORT_DOCS
                .try_read(&store, &name)
                .await
                .map(|t| t.is_some());
            (exclusive, read)
        });
    }
    // Every caller hears a timeout: none of them may go on as if it held the lease.
    while let Some(outcome) = calls.join_next().await {
        let (exclusive, read) = outcome.unwrap();
        assert!(exclusive.is_err(), "{exclusive:?}");
        assert!(read.is_err(), "{read:?}");
    }
    let last_sent = Instant::now();

    // Redis acted: every exclusive acquisition's `SET NX` ran, although no caller heard of it.
    let set_calls = command_calls(&mut direct, "set").await - sets_before;
    assert!(
        set_calls >= 20,
        "{set_calls} SET calls: the acquisitions did not reach Redis; the scenario tested nothing"
    );

    // Every key is gone, given back with its secret as soon as its call timed out: long before
    // the TTL of the last command sent.
    // Every key is gone within its TTL of the last command sent (plus polling slack).
    let gone = within(Duration::from_secs(3), || async {
        let mut conn = direct.clone();
        let mut exists = 0;
        for key in &keys {
            exists += redis::cmd("EXISTS")
                .arg(key)
                .query_async::<i64>(&mut conn)
                .await
                .unwrap();
        }
        (exists == 0).then(Instant::now)
    })
    .await
    .expect("orphaned keys outlived their TTL");
    let after_last = gone.duration_since(last_sent);
    eprintln!(
        "dropped replies: {set_calls} acquisitions ran on Redis, every key ({}) gone {:?} after \
         the first and {after_last:?} after the last acquisition was sent",
        keys.len(),
        gone.duration_since(first_sent)
    );
    assert!(
        after_last < Duration::from_millis(300),
        "{after_last:?}: not given back, left to the 600 ms TTL"
    );

    proxy.sever();
    proxy.set(Fault::Pass);
    let name = "ambiguous-0";
    let token = within(Duration::from_secs(3), || async {
        SHORT.try_lock(&store, name).await.ok().flatten()
    })
    .await
    .expect("free once the orphan expired");
    assert!(token.release().await.unwrap());
}

/// A name refused once is asked again with its `PTTL` in the same round trip as the `SET`, and
/// its `retry_after` stays exact; once this store acquires it, a refusal takes two again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_refused_lately_is_asked_in_one_round_trip() {
    let server = RedisServer::start();
    let proxy = Proxy::to(&server).await;
    let store: Store = RedisStore::new(proxy.connection_manager().await)
        .timeout(Duration::from_secs(5))
        .into();
    let elsewhere = Store::from(RedisStore::new(server.connection_manager().await));
    let held = JOBS.try_lock(&elsewhere, "hot").await.unwrap().unwrap();
    let held_at = Instant::now();
    // Each way takes the delay: a round trip takes twice it, two take four times.
    let delay = Duration::from_millis(100);
    proxy.set(Fault::Delay(delay));
    let two_round_trips = 4 * delay;

    let refused = || async {
        let started = Instant::now();
        let attempt = JOBS.attempt(&store, "hot").await.unwrap();
        let answered = Instant::now();
        let retry_after = attempt.retry_after().expect("the name is held elsewhere");
        // The holder's lease ends about `held_at + ttl`, and the server measured it between
        // `started` and `answered` (with room for its whole-millisecond rounding).
        let ends = held_at + JOBS.ttl();
        let slack = Duration::from_millis(20);
        assert!(
            retry_after <= ends.duration_since(started) + slack
                && retry_after + slack >= ends.duration_since(answered),
            "retry_after {retry_after:?}, asked {:?} before the lease ends",
            ends.duration_since(started)
        );
        answered - started
    };
    let first = refused().await;
    assert!(first >= two_round_trips, "first refusal took {first:?}");
    for _ in 0..2 {
        let again = refused().await;
        assert!(
            again < two_round_trips,
            "a refusal of a contended name took {again:?}: two round trips"
        );
    }

    assert!(held.release().await.unwrap());
    let started = Instant::now();
    let mine = JOBS
        .try_lock(&store, "hot")
        .await
        .unwrap()
        .expect("released");
    let took = started.elapsed();
    assert!(took < two_round_trips, "the acquisition took {took:?}");
    mine.release().await.unwrap();

    // Acquired here: the name is news again, and its next refusal asks twice.
    let _held = JOBS.try_lock(&elsewhere, "hot").await.unwrap().unwrap();
    let held_at = Instant::now();
    let started = Instant::now();
    let retry_after = JOBS
        .attempt(&store, "hot")
        .await
        .unwrap()
        .retry_after()
        .unwrap();
    let took = started.elapsed();
    assert!(took >= two_round_trips, "the refusal took {took:?}");
    assert!(retry_after + held_at.elapsed() + Duration::from_millis(5) >= JOBS.ttl());
}
