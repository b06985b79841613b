//! Native compare-and-set: on a server with `DELIFEQ` (Valkey 9) or `DELEX` (Redis 8.4) an
//! unfenced `Lock` runs no script for acquire, extend and release (read off `INFO
//! commandstats`); on one without (Redis 7.0) it runs its scripts as before; with `SET … IFEQ`
//! alone only its extends are native.
//!
//! The suite's server is `redis-server` or the one `TOWER_LEASE_SERVER` names; the tests that
//! need Valkey's commands say so and pass trivially without them.

use std::time::Duration;

use tower_lease::backend::{Acquisition, LeaseRef, LockRef, Secret};
use tower_lease::{Lock, Mode, RedisStore, Store};

use crate::support::RedisServer;
use crate::support::server::{Endpoint, calls, commandstats};

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
        assert_eq!(
            ran, 0,
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
    // 22 releases and a refused one, each its script first; no extend.
    assert_eq!(calls(&after, "evalsha") - calls(&before, "evalsha"), 23);
    // 22 acquisitions, 20 single extends and the batch's 3.
    assert_eq!(calls(&after, "set") - calls(&before, "set"), 45);
}
