//! `PgStore` behind PgBouncer in transaction pooling mode (Debian's `pgbouncer`, two server
//! connections shared by every client connection): without
//! [`transaction_pooler`](tower_lease_postgres::PgStoreBuilder::transaction_pooler) the calls
//! fail (their named statements live on one server connection, the next transaction gets
//! another) and the sessions' settings stay on the server connections for other clients; with
//! it, replicas contending for locks, read-write locks and semaphores, with heartbeats, see no
//! error and exclusion holds, the server connections keep their defaults, a release in one
//! store wakes a waiter in another (its listener connects directly), replicas connecting at
//! once install the schema through it, an application's transactions claim idempotency keys
//! through it, and a part of the conformance suite passes (`conformance.rs`).

use crate::support;

mod conformance;
mod contend;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tower_lease::{Idempotency, Lock, Store};
use tower_lease_harness::{PgBouncer, PgServer};
use tower_lease_postgres::{ClaimError, PgStore, claim};

use contend::{JOBS, Outcome, chain, contend};

/// Server connections behind pgbouncer, shared by every client connection.
const SERVER_CONNECTIONS: usize = 2;

/// A server with the schema installed (directly), and pgbouncer in front of it.
async fn bouncer() -> (PgServer, PgBouncer) {
    let server = support::server().await;
    support::pg_store(&server).await;
    let bouncer = PgBouncer::start(&server, SERVER_CONNECTIONS);
    (server, bouncer)
}

/// The `statement_timeout` of each server connection behind `bouncer`, read by as many
/// clients inside a transaction at once (so each is on a server connection of its own).
async fn server_statement_timeouts(bouncer: &PgBouncer) -> Vec<String> {
    let mut clients = Vec::new();
    for _ in 0..SERVER_CONNECTIONS {
        let client = support::client(&bouncer.url()).await;
        client.batch_execute("BEGIN").await.expect("begin");
        clients.push(client);
    }
    let mut timeouts = Vec::new();
    for client in &clients {
        let rows = client
            .simple_query("SHOW statement_timeout")
            .await
            .expect("show statement_timeout");
        timeouts.extend(rows.iter().find_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        }));
    }
    for client in &clients {
        client.batch_execute("COMMIT").await.expect("commit");
    }
    timeouts
}

/// Today's store (named statements, session settings, `LISTEN` through the pooler) fails
/// behind a transaction pooler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_option_calls_fail_behind_the_pooler() {
    let (_server, bouncer) = bouncer().await;
    let mut stores = Vec::new();
    let mut connect_errors = Vec::new();
    for _ in 0..3 {
        match PgStore::connect(&bouncer.url()).await {
            Ok(store) => stores.push(Store::from(store)),
            Err(e) => connect_errors.push(chain(&e)),
        }
    }
    let outcome = if stores.is_empty() {
        Outcome::default()
    } else {
        contend(&stores).await
    };
    let timeouts = server_statement_timeouts(&bouncer).await;
    eprintln!(
        "connect errors: {connect_errors:?}\nacquisitions {}, overlaps {}, lost {}, {} errors, \
         the first: {:?}\nserver connections' statement_timeout: {timeouts:?}",
        outcome.acquisitions,
        outcome.overlaps,
        outcome.lost,
        outcome.errors.len(),
        outcome.errors.iter().take(5).collect::<Vec<_>>(),
    );
    assert!(
        !connect_errors.is_empty() || !outcome.errors.is_empty(),
        "named statements went through a transaction pooler unharmed"
    );
    assert!(
        timeouts.iter().any(|timeout| timeout != "0"),
        "no session setting stayed on a server connection: {timeouts:?}"
    );
}

/// A store through `bouncer` with the option, listening on the server directly.
async fn pooled_store(bouncer: &PgBouncer, server: &PgServer) -> PgStore {
    let direct: tokio_postgres::Config = server.url().parse().expect("the server's URL");
    PgStore::builder()
        .transaction_pooler(true)
        .connect(&bouncer.url())
        .await
        .expect("connect through pgbouncer")
        .listen(direct)
}

/// With the option, three replicas through the pooler contend for a lock, a read-write lock
/// and a semaphore, holding past their heartbeats: no error, no overlap, no lost lease, and
/// the server connections keep their defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_option_replicas_contend_without_error() {
    let (server, bouncer) = bouncer().await;
    let mut stores = Vec::new();
    for _ in 0..3 {
        let store = pooled_store(&bouncer, &server).await;
        // Listening, read committed, synchronous commit: nothing to warn of.
        let warnings = store.check().await.expect("check through the pooler");
        assert!(warnings.is_empty(), "{warnings:?}");
        stores.push(Store::from(store));
    }
    let outcome = contend(&stores).await;
    eprintln!(
        "acquisitions {}, overlaps {}, lost {}, errors {:?}",
        outcome.acquisitions, outcome.overlaps, outcome.lost, outcome.errors
    );
    assert!(outcome.errors.is_empty(), "errors: {:?}", outcome.errors);
    assert_eq!(outcome.overlaps, 0, "two holders inside at once");
    assert_eq!(outcome.lost, 0, "a heartbeat lost a held lease");
    // Eight tasks for 4 s with holds of 20 ms to 250 ms: far more than this, even loaded.
    assert!(
        outcome.acquisitions >= 40,
        "only {} acquisitions",
        outcome.acquisitions
    );
    assert_eq!(
        server_statement_timeouts(&bouncer).await,
        vec!["0"; SERVER_CONNECTIONS],
        "a store's setting stayed on a server connection"
    );
}

/// A release through the pooler in one store wakes a waiter in another, whose listener
/// connects to the server directly: it looks a few times, not every 100 ms of a poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_through_the_pooler_wakes_a_waiter_listening_directly() {
    const WAITED: Lock<str> = Lock::new("bouncer-wait", Duration::from_secs(5));
    let (server, bouncer) = bouncer().await;
    let holder: Store = pooled_store(&bouncer, &server).await.into();
    let looks = Arc::new(AtomicUsize::new(0));
    let waiter = Store::from_backend(support::Counting {
        store: pooled_store(&bouncer, &server).await,
        acquisitions: looks.clone(),
    });
    // Both listeners are up before the first release.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for name in ["a", "b"] {
        let held = WAITED.try_lock(&holder, name).await.unwrap().expect("free");
        let before = looks.load(Ordering::SeqCst);
        let waiting = {
            let (waiter, name) = (waiter.clone(), name.to_owned());
            tokio::spawn(async move {
                let token = WAITED
                    .try_lock_for(&waiter, &name, Duration::from_secs(10))
                    .await
                    .unwrap();
                (Instant::now(), token.expect("acquired once released"))
            })
        };
        // Polling (5 ms backing off to 100 ms) would look about twenty times meanwhile.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let released = Instant::now();
        assert!(held.release().await.unwrap());
        let (got, token) = waiting.await.unwrap();
        assert!(token.release().await.unwrap());
        let (looked, after) = (looks.load(Ordering::SeqCst) - before, got - released);
        // The first attempt, a look once watching, the woken one; a fallback look a second.
        assert!(looked <= 5, "the waiter polled: {looked} attempts");
        assert!(
            after < Duration::from_millis(500),
            "woken {after:?} after the release"
        );
    }
}

/// Six replicas connecting at once through the pooler to a database without the schema: each
/// connects (the installation's lock and DDL are one transaction, its reads unnamed), the
/// schema is installed once, and each store serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_install_the_schema_through_the_pooler() {
    let server = support::server().await;
    let bouncer = PgBouncer::start(&server, SERVER_CONNECTIONS);
    let url = bouncer.url();
    let connecting: Vec<_> = (0..6)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                PgStore::builder()
                    .transaction_pooler(true)
                    .connect(&url)
                    .await
                    .map_err(|e| chain(&e))
            })
        })
        .collect();
    let mut stores = Vec::new();
    for store in connecting {
        stores.push(Store::from(store.await.unwrap().expect("connect")));
    }
    let versions: i64 = support::client(&server.url())
        .await
        .query_one("SELECT count(*) FROM tower_lease.schema_version", &[])
        .await
        .expect("the installed versions")
        .get(0);
    assert_eq!(versions, 1, "installed more than once");
    for (n, store) in stores.iter().enumerate() {
        let token = JOBS.try_lock(store, &n.to_string()).await.unwrap();
        assert!(token.expect("free").release().await.unwrap());
    }
}

/// What a call costs sent unnamed (with the option) beside a prepared statement (without),
/// both straight to the server: acquire and release a lock, one at a time, interleaved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --run-ignored only --no-capture"]
async fn cost_of_unnamed_statements() {
    let server = support::server().await;
    let named: Store = support::pg_store(&server).await.into();
    let unnamed: Store = PgStore::builder()
        .transaction_pooler(true)
        .connect(&server.url())
        .await
        .expect("connect")
        .into();
    let mut spent = [Duration::ZERO; 2];
    const ROUNDS: usize = 10;
    const CALLS: usize = 200;
    for round in 0..ROUNDS {
        for (at, store) in [&named, &unnamed].into_iter().enumerate() {
            let started = Instant::now();
            for call in 0..CALLS {
                let name = format!("{round}-{call}");
                let token = JOBS.try_lock(store, &name).await.unwrap().expect("free");
                assert!(token.release().await.unwrap());
            }
            spent[at] += started.elapsed();
        }
    }
    let per_pair = |spent: Duration| spent / (ROUNDS * CALLS) as u32;
    eprintln!(
        "acquire + release: prepared {:?}, unnamed in a transaction {:?}",
        per_pair(spent[0]),
        per_pair(spent[1])
    );
}

/// `claim` inside an application's transactions through the pooler: more clients than server
/// connections, so transactions of different clients take turns on each server connection.
/// Each key's first claim commits, every later one answers `AlreadyClaimed` with the first
/// one's time, and no call fails for a statement prepared on another server connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_in_transactions_through_the_pooler() {
    const CLIENTS: usize = 3 * SERVER_CONNECTIONS;
    const KEYS: usize = 8;
    let (_server, bouncer) = bouncer().await;
    let payments = Idempotency::new("bouncer-payments", Duration::from_secs(3600));
    let mut keys = Vec::new();
    for at in 0..KEYS {
        keys.push(support::claimed_key(payments, &format!("pay-{at}")).await);
    }
    let keys = Arc::new(keys);
    let mut tasks = tokio::task::JoinSet::new();
    for at in 0..CLIENTS {
        let keys = Arc::clone(&keys);
        let url = bouncer.url();
        tasks.spawn(async move {
            let mut client = support::client(&url).await;
            let mut claimed = Vec::new();
            // Every client claims every key, starting from a different one.
            for turn in 0..KEYS {
                let key = &keys[(at + turn) % KEYS];
                let tx = client
                    .transaction()
                    .await
                    .expect("begin through the pooler");
                match claim(&tx, key).await {
                    Ok(()) => {
                        tx.commit().await.expect("commit through the pooler");
                        claimed.push(key.key().to_owned());
                    }
                    Err(ClaimError::AlreadyClaimed { .. }) => {
                        tx.rollback().await.expect("rollback through the pooler");
                    }
                    Err(e) => panic!("claim through the pooler: {e}"),
                }
            }
            claimed
        });
    }
    let mut claimed: Vec<String> = tasks.join_all().await.into_iter().flatten().collect();
    claimed.sort();
    let expected: Vec<String> = keys.iter().map(|key| key.key().to_owned()).collect();
    let mut expected = expected;
    expected.sort();
    assert_eq!(claimed, expected, "each key claimed exactly once");
}
