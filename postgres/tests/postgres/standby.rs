//! A primary and its streaming standbys: the store on a URL naming both hosts with
//! `target_session_attrs=read-write` follows the primary through a failover (kill -9, promote)
//! and a switchover (the old primary read-only, its sessions alive), pool and listener alike,
//! with its leases and growing fences when the standby was synchronous; `check()` names the
//! replication setups that can lose acquisitions in a failover; and the loss window of an
//! asynchronous standby, measured (`--nocapture` prints it).

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tower_lease::{Lock, Store};
use tower_lease_harness::{PgServer, Replication};
use tower_lease_postgres::{PgStore, PgWarning};

const TIMEOUT: Duration = Duration::from_millis(500);
/// Long, so a lease taken before the failover is still held when the test looks after it.
const JOBS: Lock<str> = Lock::new("standby", Duration::from_secs(30)).fenced();
/// The bound on serving again after the promotion: generous for a loaded 2-core machine.
const SERVES_WITHIN: Duration = Duration::from_secs(10);

/// The URL naming both servers, the store to follow whichever takes writes.
fn both(first: &PgServer, second: &PgServer) -> String {
    format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?target_session_attrs=read-write",
        first.port(),
        second.port()
    )
}

async fn connect(url: &str) -> PgStore {
    PgStore::connect(url)
        .await
        .expect("connect")
        .timeout(TIMEOUT)
}

/// Tries to take `name` until it answers, within [`SERVES_WITHIN`]; how long it took.
async fn serves_again(store: &Store, name: &str) -> (Duration, i64) {
    let started = Instant::now();
    loop {
        match JOBS.try_lock(store, name).await {
            Ok(Some(token)) => {
                let fence = token.fence().expect("fenced") as i64;
                assert!(token.release().await.unwrap());
                return (started.elapsed(), fence);
            }
            Ok(None) => panic!("{name} is held"),
            Err(e) => assert!(
                started.elapsed() < SERVES_WITHIN,
                "not served within {SERVES_WITHIN:?} of the promotion: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Fences of a lock cycle on each of `names`.
async fn cycle(store: &Store, names: &[&str]) -> Vec<i64> {
    let mut fences = Vec::new();
    for name in names {
        let token = JOBS.try_lock(store, name).await.unwrap().expect("free");
        fences.push(token.fence().expect("fenced") as i64);
        assert!(token.release().await.unwrap());
    }
    fences
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_standby_takes_over_with_the_leases_and_growing_fences() {
    let mut primary = PgServer::start();
    let standby = PgServer::standby_of(&primary, "sync1", Replication::Synchronous);
    let url = both(&primary, &standby);
    let store: Store = connect(&url).await.into();
    let names = ["a", "b", "c"];
    let before = cycle(&store, &names).await;
    let held = JOBS.try_lock(&store, "held").await.unwrap().expect("free");

    primary.stop();
    standby.promote();
    let (took, _) = serves_again(&store, "after").await;
    eprintln!("served again {took:?} after the promotion");
    // Committed before the kill, on the standby too: still held after the failover.
    let other: Store = connect(&url).await.into();
    assert!(JOBS.try_lock(&other, "held").await.unwrap().is_none());
    let after = cycle(&store, &names).await;
    for ((name, before), after) in names.iter().zip(&before).zip(&after) {
        assert!(
            after > before,
            "{name}: fence {after} after, {before} before"
        );
    }
    assert!(held.release().await.unwrap());
    assert!(JOBS.try_lock(&other, "held").await.unwrap().is_some());
}

/// A switchover whose old primary keeps its sessions: it turns read-only
/// (`default_transaction_read_only`, as a demoted primary behind a proxy answers), the standby
/// is promoted. The pooled connections to the old primary answer "cannot execute … in a
/// read-only transaction" (25006): they are dropped, not reused, and the listener moves too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_old_primary_s_connections_are_dropped_pool_and_listener() {
    let primary = PgServer::start();
    let standby = PgServer::standby_of(&primary, "sync1", Replication::Synchronous);
    let url = both(&primary, &standby);
    let store: Store = connect(&url).await.into();
    let looks = Arc::new(AtomicUsize::new(0));
    let waiter = Store::from_backend(support::Counting {
        store: connect(&url).await,
        acquisitions: looks.clone(),
    });
    // Several pooled connections, all to the primary.
    let names: Vec<String> = (0..8).map(|i| format!("warm-{i}")).collect();
    futures_util::future::join_all(names.iter().map(|name| {
        let store = store.clone();
        async move { cycle(&store, &[name]).await }
    }))
    .await;
    let (_, after) =
        support::wait_for_release(&JOBS, &store, &waiter, &looks, "heard-before").await;
    assert!(after < Duration::from_millis(300), "woken {after:?} after");

    primary.psql(&[
        "ALTER SYSTEM SET default_transaction_read_only = on",
        "SELECT pg_reload_conf()",
    ]);
    standby.promote();
    let (took, _) = serves_again(&store, "after").await;
    eprintln!("served again {took:?} after the promotion");
    // Every pooled connection to the old primary is gone, not only the first found.
    for name in &names {
        let token = JOBS
            .try_lock(&store, name)
            .await
            .expect("on the new primary");
        assert!(token.expect("free").release().await.unwrap());
    }
    // The listener moved to the new primary within its heartbeat: releases there wake the
    // waiter at once, not at its fallback poll a second later.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for name in ["heard-1", "heard-2"] {
        let (looks, after) = support::wait_for_release(&JOBS, &store, &waiter, &looks, name).await;
        assert!(
            after < Duration::from_millis(300),
            "{name}: woken {after:?} after the release ({looks} looks)"
        );
    }
}

/// What `check()` says, as text: what a DBA reads.
async fn warnings(store: &PgStore) -> Vec<String> {
    let found = store.check().await.unwrap();
    found.iter().map(ToString::to_string).collect()
}

fn any(found: &[String], needle: &str) -> bool {
    found.iter().any(|w| w.contains(needle))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_an_asynchronous_standby_and_empty_synchronous_standby_names() {
    let primary = PgServer::start();
    let store = connect(&primary.url()).await;
    assert_eq!(warnings(&store).await, Vec::<String>::new());
    let _standby = PgServer::standby_of(&primary, "async1", Replication::Asynchronous);
    let named = store.check().await.unwrap();
    assert!(
        named.contains(&PgWarning::AsynchronousStandbys {
            names: vec!["async1".to_owned()]
        }) && named.contains(&PgWarning::NoSynchronousStandbyNames { standbys: 1 }),
        "{named:?}"
    );
    let found = warnings(&store).await;
    assert!(
        any(&found, "async1"),
        "the async standby unnamed: {found:?}"
    );
    assert!(
        any(&found, "synchronous_standby_names is empty"),
        "empty synchronous_standby_names unnamed: {found:?}"
    );

    // A user without pg_monitor sees the standbys but not their state: said so.
    primary.psql(&[
        "CREATE ROLE app LOGIN",
        "GRANT CREATE ON DATABASE postgres TO app",
        "GRANT USAGE ON SCHEMA tower_lease TO app",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA tower_lease TO app",
    ]);
    let app_url = format!("postgres://app@127.0.0.1:{}/postgres", primary.port());
    let app = PgStore::builder()
        .install_schema(false)
        .connect(&app_url)
        .await
        .unwrap();
    let found = warnings(&app).await;
    assert!(
        any(&found, "pg_monitor"),
        "hidden standbys unnamed: {found:?}"
    );
    primary.psql(&["GRANT pg_monitor TO app"]);
    let found = warnings(&app).await;
    assert!(
        any(&found, "async1"),
        "the async standby unnamed: {found:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_a_potential_standby_and_commits_that_wait_for_none() {
    let primary = PgServer::start();
    let store = connect(&primary.url()).await;
    let _first = PgServer::standby_of(&primary, "s1", Replication::Synchronous);
    // Synchronous, with synchronous_commit = on: nothing to say.
    assert_eq!(warnings(&store).await, Vec::<String>::new());

    let _second = PgServer::standby_of(&primary, "s2", Replication::Asynchronous);
    primary.psql(&[
        "ALTER SYSTEM SET synchronous_standby_names = 'FIRST 1 (s1, s2)'",
        "SELECT pg_reload_conf()",
    ]);
    primary.await_standby("s2", "potential");
    let found = warnings(&store).await;
    assert!(
        any(&found, "s2"),
        "the potential standby unnamed: {found:?}"
    );
    assert!(!any(&found, "s1"), "the sync standby named: {found:?}");

    for commit in ["local", "off"] {
        primary.psql(&[
            &format!("ALTER SYSTEM SET synchronous_commit = {commit}"),
            "SELECT pg_reload_conf()",
        ]);
        // The pool's sessions take the reload at their next statement.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let found = warnings(&store).await;
        assert!(
            any(&found, &format!("synchronous_commit is {commit}")),
            "{commit} unnamed: {found:?}"
        );
        for warning in &found {
            assert!(!warning.contains("(or local)"), "advises local: {warning}");
        }
        assert!(
            any(&found, "remote_apply"),
            "no advice of on/remote_apply: {found:?}"
        );
    }
}

/// `ANY 1 (s1, s2)`: a commit waits for one of the two only, so a failover must promote the
/// one that has it; `check()` says so, and says nothing once the quorum is both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_quorum_standbys_of_which_a_failover_must_choose() {
    let primary = PgServer::start();
    let store = connect(&primary.url()).await;
    let _first = PgServer::standby_of(&primary, "q1", Replication::Synchronous);
    let _second = PgServer::standby_of(&primary, "q2", Replication::Asynchronous);
    primary.psql(&[
        "ALTER SYSTEM SET synchronous_standby_names = 'ANY 1 (q1, q2)'",
        "SELECT pg_reload_conf()",
    ]);
    primary.await_standby("q1", "quorum");
    primary.await_standby("q2", "quorum");
    let named = store.check().await.unwrap();
    assert!(
        named.contains(&PgWarning::QuorumStandbys {
            names: vec!["q1".to_owned(), "q2".to_owned()],
            waited_for: 1,
        }),
        "the quorum standbys unnamed: {named:?}"
    );
    let found = warnings(&store).await;
    assert!(
        any(&found, "\"q1\", \"q2\"") && any(&found, "most"),
        "no advice to promote the most advanced: {found:?}"
    );

    // Both waited for: either one has every commit.
    primary.psql(&[
        "ALTER SYSTEM SET synchronous_standby_names = 'ANY 2 (q1, q2)'",
        "SELECT pg_reload_conf()",
    ]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let found = warnings(&store).await;
        if found.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "warned with both waited for: {found:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a failover lost.
#[derive(Debug)]
struct Lost {
    /// Acquisitions answered before the kill that the promoted standby lacks.
    lost: usize,
    /// Acquisitions answered before the kill.
    answered: usize,
    /// How long before the kill the first lost one was answered.
    window: Option<Duration>,
}

/// Eight tasks take locks for a second on the primary, whose standby streams through a
/// proxy that delays it by `lag` (a network's, or a busy standby's); the primary is killed
/// (kill -9, and the proxy's connections cut, as when its host dies with the stream's last
/// bytes unsent), the standby promoted: what the new primary lacks of what was answered.
async fn loss_window(replication: Replication, lag: Duration) -> Lost {
    let mut primary = PgServer::start();
    let proxy = tower_lease_harness::proxy::Proxy::to_postgres(&primary).await;
    proxy.set(tower_lease_harness::proxy::Fault::Delay(lag));
    let standby = PgServer::standby_through(&primary, proxy.addr().port(), "s1", replication);
    let store: Store = connect(&primary.url()).await.into();
    let answered = Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..8)
        .map(|worker| {
            let (store, answered, stop) = (store.clone(), answered.clone(), stop.clone());
            tokio::spawn(async move {
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    let name = format!("w{worker}-{i}");
                    if let Ok(Some(token)) = JOBS.try_lock(&store, &name).await {
                        let fence = token.fence().expect("fenced") as i64;
                        answered.lock().unwrap().push((name, Instant::now(), fence));
                        // Held: a second holder after the failover would be a lost lease.
                        std::mem::forget(token);
                    }
                    i += 1;
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The stream cut first, as when the primary's host dies with it: what the proxy delayed
    // never arrives (killed first, the primary's socket would close in order, and the proxy
    // would hand the standby the rest of the stream).
    let killed = Instant::now();
    proxy.set(tower_lease_harness::proxy::Fault::Blackhole);
    proxy.sever();
    primary.stop();
    stop.store(true, Ordering::SeqCst);
    for worker in workers {
        worker.await.unwrap();
    }
    standby.promote();
    let answered: Vec<_> = answered
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, at, _)| *at <= killed)
        .cloned()
        .collect();
    let client = support::client(&standby.url()).await;
    let kept: std::collections::HashSet<Vec<u8>> = client
        .query(
            "SELECT name FROM tower_lease.locks WHERE namespace = 'standby' \
             AND expires > clock_timestamp()",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let lost: Vec<_> = answered
        .iter()
        .filter(|(name, _, _)| !kept.contains(name.as_bytes()))
        .collect();
    // A lost lease is free on the new primary: a second holder. Its fence still grows (it
    // follows the server's clock), while the two servers' clocks agree.
    let promoted: Store = connect(&standby.url()).await.into();
    for (name, _, fence) in lost.iter().take(3) {
        let token = JOBS
            .try_lock(&promoted, name)
            .await
            .unwrap()
            .expect("a lost lease is free");
        assert!(
            token.fence().unwrap() as i64 > *fence,
            "{name}: a fence repeated"
        );
    }
    let window = lost.iter().map(|(_, at, _)| killed - *at).max();
    Lost {
        lost: lost.len(),
        answered: answered.len(),
        window,
    }
}

/// The standby's lag in the loss-window tests.
const LAG: Duration = Duration::from_millis(50);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_synchronous_standby_loses_no_answered_acquisition() {
    let found = loss_window(Replication::Synchronous, LAG).await;
    eprintln!("synchronous standby {LAG:?} behind: {found:?}");
    assert!(found.answered > 0);
    assert_eq!((found.lost, found.window), (0, None), "{found:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loss_window_of_an_asynchronous_standby() {
    let found = loss_window(Replication::Asynchronous, Duration::ZERO).await;
    eprintln!("asynchronous standby on loopback: {found:?}");
    let found = loss_window(Replication::Asynchronous, LAG).await;
    eprintln!("asynchronous standby {LAG:?} behind: {found:?}");
    // Answered, then lost: the new primary lets a second holder take each of them.
    assert!(found.lost > 0, "{found:?}");
}
