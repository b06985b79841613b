//! Native compare-and-set: on a server with `DELIFEQ` (Valkey 9) or `DELEX` (Redis 8.4) an
//! unfenced `Lock` runs no script for acquire, extend and release of a held lease nobody waits for (read off `INFO
//! commandstats`); on one without (Redis 7.0) it runs its scripts as before; with `SET … IFEQ`
//! alone only its extends are native.
//!
//! The suite's server is `redis-server` or the one `TOWER_LEASE_SERVER` names; the tests that
//! need Valkey's commands say so and pass trivially without them.

use std::time::Duration;

use tower_lease::backend::{Acquisition, LeaseRef, LockRef, Mode, Secret};
use tower_lease::{Lock, RedisStore, Store};

use tower_lease_harness::RedisServer;
use tower_lease_harness::server::{Endpoint, calls, commandstats};

const TTL: Duration = Duration::from_millis(2_000);

/// Script calls of every kind the server ran.
fn scripts(stats: &str) -> u64 {
    ["evalsha", "eval", "fcall", "fcall_ro"]
        .iter()
        .map(|command| calls(stats, command))
        .sum()
}

/// Which of `DELIFEQ` and `DELEX` the server behind `conn` has, asked as the store asks.
async fn native_deletes(conn: &redis::aio::MultiplexedConnection) -> Vec<&'static str> {
    let infos: Vec<redis::Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("DELIFEQ")
        .arg("DELEX")
        .query_async(&mut conn.clone())
        .await
        .unwrap();
    ["DELIFEQ", "DELEX"]
        .into_iter()
        .zip(infos)
        .filter(|(_, info)| *info != redis::Value::Nil)
        .map(|(command, _)| command)
        .collect()
}

/// Whether the server behind `conn` has `DELIFEQ` or `DELEX`.
async fn native_release(conn: &redis::aio::MultiplexedConnection) -> bool {
    !native_deletes(conn).await.is_empty()
}

/// Server arguments that take `deletes` away (a server refuses to rename what it lacks).
fn without(deletes: &[&'static str]) -> Vec<&'static str> {
    deletes
        .iter()
        .flat_map(|&command| ["--rename-command", command, ""])
        .collect()
}

/// `cycles` lock, extend, release cycles on `store`, each checked, and one `extend_many` of two
/// held leases and a stranger's.
async fn cycles(store: &Store, cycles: usize) {
    let lock: Lock<str> = Lock::new("native", TTL);
    for i in 0..cycles {
        let name = format!("n{}", i % 4);
        let token = lock
            .try_lock(store, name.as_str())
            .await
            .unwrap()
            .expect("a free name");
        assert!(token.extend().await.unwrap(), "cycle {i}: extended");
        assert!(token.release().await.unwrap(), "cycle {i}: released");
    }
    let backend = store.backend();
    let (a, b, stranger) = (Secret::random(), Secret::random(), Secret::random());
    let names = [b"a".to_vec(), b"b".to_vec()];
    let lease =
        |name, secret| LeaseRef::new(LockRef::new("native", name, TTL), Mode::Exclusive, secret);
    for (name, secret) in names.iter().zip([&a, &b]) {
        let acquired = backend.acquire(lease(name, secret)).await.unwrap();
        assert!(matches!(acquired, Acquisition::Acquired { .. }));
    }
    let batch = [
        lease(&names[0], &a),
        lease(&names[1], &b),
        lease(&names[0], &stranger),
    ];
    let held: Vec<bool> = backend
        .extend_many(&batch)
        .await
        .into_iter()
        .map(|answer| answer.unwrap().is_held())
        .collect();
    assert_eq!(held, [true, true, false]);
    assert!(!backend.release(lease(&names[1], &stranger)).await.unwrap());
    for (name, secret) in names.iter().zip([&a, &b]) {
        assert!(backend.release(lease(name, secret)).await.unwrap());
    }
}

#[tokio::test]
async fn an_unfenced_lock_runs_no_script_where_the_server_has_native_compare_and_set() {
    let server = RedisServer::start();
    let raw = server.connection().await;
    let native = native_release(&raw).await;
    let store: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let before = commandstats(&raw).await;
    cycles(&store, 20).await;
    let after = commandstats(&raw).await;
    let ran = scripts(&after) - scripts(&before);
    let deletes = calls(&after, "delifeq") + calls(&after, "delex");
    if native {
        // Only for the stranger's extend and release: a key that no longer holds the bare
        // secret goes to its script, which tells a lease gone from one a waiter marked. Each
        // script's first call on the server is an `EVALSHA` answered `NOSCRIPT`, then `EVAL`.
        assert_eq!(
            ran, 4,
            "scripts ran on a server with native compare-and-set"
        );
        // 20 cycles and the batch's: 22 releases, one more refused.
        assert_eq!(deletes, 23, "every release a native delete");
    } else {
        // 20 extends, 20 releases, the batch's 3 extends and 3 releases: each an `EVALSHA`
        // first, as before.
        let evalsha = calls(&after, "evalsha") - calls(&before, "evalsha");
        assert_eq!(
            evalsha, 46,
            "on a server without native compare-and-set, the scripts"
        );
        assert_eq!(deletes, 0);
    }
}

#[tokio::test]
async fn with_set_ifeq_alone_extends_are_native_and_releases_scripted() {
    let probe = RedisServer::start();
    let deletes = native_deletes(&probe.connection().await).await;
    if deletes.is_empty() {
        return; // needs Valkey 9 or Redis 8.4, whose `SET … IFEQ` stays when their delete goes
    }
    drop(probe);
    // As Valkey 8.x: `SET … IFEQ`, no `DELIFEQ`.
    let server = RedisServer::start_with(&without(&deletes));
    let raw = server.connection().await;
    let store: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let before = commandstats(&raw).await;
    cycles(&store, 20).await;
    let after = commandstats(&raw).await;
    // 22 releases and a refused one, each its script first; and the stranger's extend in the
    // batch, whose `SET … IFEQ` found the key changed (its script tells gone from marked).
    assert_eq!(calls(&after, "evalsha") - calls(&before, "evalsha"), 24);
    // 22 acquisitions, 20 single extends and the batch's 3.
    assert_eq!(calls(&after, "set") - calls(&before, "set"), 45);
}

/// Whether the server behind `conn` has `SET … IFEQ`: a missing key is left alone where it
/// does, and the option is a syntax error where it does not.
async fn set_ifeq(conn: &redis::aio::MultiplexedConnection) -> bool {
    let reply: redis::RedisResult<redis::Value> = redis::cmd("SET")
        .arg("native:probe")
        .arg("")
        .arg("IFEQ")
        .arg("")
        .query_async(&mut conn.clone())
        .await;
    matches!(reply, Ok(redis::Value::Nil))
}

#[tokio::test]
async fn a_completed_request_is_stored_without_a_script_where_the_server_has_set_ifeq() {
    use tower_lease::backend::{Begin, Completion};

    let server = RedisServer::start();
    let raw = server.connection().await;
    let native = set_ifeq(&raw).await;
    let store: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let backend = store.backend();
    let (fingerprint, retention) = ([7; 16], Duration::from_secs(60));
    let before = commandstats(&raw).await;
    for i in 0..10 {
        let (secret, name) = (Secret::random(), format!("order-{i}"));
        let lease = LeaseRef::new(
            LockRef::new("native", name.as_bytes(), TTL),
            Mode::Reservation,
            &secret,
        );
        let begin = backend
            .idempotency_begin(lease, &fingerprint)
            .await
            .unwrap();
        assert!(matches!(begin, Begin::Reserved { .. }), "{begin:?}");
        let completion = Completion::new(&fingerprint, b"201 charged", retention);
        assert!(
            backend
                .idempotency_complete(lease, completion)
                .await
                .unwrap()
        );
        // A retry of the completion whose answer was lost finds its own record.
        assert!(
            backend
                .idempotency_complete(lease, completion)
                .await
                .unwrap()
        );
        let stranger = Secret::random();
        let retry = LeaseRef::new(lease.lock, Mode::Reservation, &stranger);
        match backend
            .idempotency_begin(retry, &fingerprint)
            .await
            .unwrap()
        {
            Begin::Completed { response, .. } => assert_eq!(&response[..], b"201 charged"),
            other => panic!("a retry got {other:?}"),
        }
    }
    let after = commandstats(&raw).await;
    // Each script call is an `EVALSHA` first (the first one also an `EVAL` after `NOSCRIPT`).
    let ran = calls(&after, "evalsha") - calls(&before, "evalsha");
    assert_eq!(calls(&after, "fcall"), 0);
    if native {
        // Only the completions' retries, which find the record instead of the secret.
        assert_eq!(ran, 10, "the first completions ran scripts");
    } else {
        assert_eq!(ran, 20, "on a server without SET IFEQ, the script");
    }
}

#[tokio::test]
async fn a_live_reader_or_permit_is_released_without_asking_the_servers_clock() {
    let server = RedisServer::start();
    let raw = server.connection().await;
    let store: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    let (readers, permits) = (
        tower_lease::RwLock::<str>::new("native", TTL),
        tower_lease::Semaphore::<str>::new("native", 2, TTL),
    );
    let before = commandstats(&raw).await;
    for i in 0..10 {
        let name = format!("n{i}");
        let reader = readers.try_read(&store, name.as_str()).await.unwrap();
        assert!(
            reader.unwrap().release().await.unwrap(),
            "cycle {i}: reader"
        );
        let permit = permits.try_acquire(&store, name.as_str()).await.unwrap();
        assert!(
            permit.unwrap().release().await.unwrap(),
            "cycle {i}: permit"
        );
    }
    let after = commandstats(&raw).await;
    // One `TIME` in each acquisition's script, none in the releases.
    assert_eq!(calls(&after, "time") - calls(&before, "time"), 20);
    assert_eq!(calls(&after, "zrem") - calls(&before, "zrem"), 20);
}
