//! The store on a real local Redis Cluster (three masters made with `redis-cli --cluster create`):
//! every script runs on the node that owns its name's slot, multi-key scripts never cross slots,
//! scripts load where they are missing, `check` looks at every primary, and a master that dies
//! fails calls promptly until it is back.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use tower_lease::store::{KeyLayout, KeyRole};
use tower_lease::{Lock, RedisStore, RwLock, Store, Warning};

use tower_lease_harness::Endpoint;
use tower_lease_harness::cluster::RedisCluster;
use tower_lease_harness::server::config_set;

const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(5));
const FENCED: Lock<str> = Lock::new("fenced", Duration::from_secs(5)).fenced();
const DOCS: RwLock<str> = RwLock::new("docs", Duration::from_secs(5));
const FENCED_DOCS: RwLock<str> = RwLock::new("fenced-docs", Duration::from_secs(5)).fenced();

/// Names whose keys land on every node of the cluster.
fn names() -> Vec<String> {
    (0..60).map(|i| format!("name-{i}")).collect()
}

fn ports_of(
    cluster: &RedisCluster,
    role: KeyRole,
    namespace: &str,
    names: &[String],
) -> HashSet<u16> {
    let keys = KeyLayout::default();
    names
        .iter()
        .map(|n| {
            cluster
                .node_for(&keys.key(role, namespace, n.as_bytes()))
                .port()
        })
        .collect()
}

fn script_flush_everywhere(cluster: &RedisCluster) {
    for node in cluster.nodes() {
        let mut conn = node.client().get_connection().unwrap();
        let () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_works_on_names_spread_over_all_nodes() {
    let cluster = RedisCluster::start();
    let names = names();
    assert_eq!(
        ports_of(&cluster, KeyRole::Lock, "jobs", &names).len(),
        3,
        "names cover all nodes"
    );
    let store = Store::from(RedisStore::new(cluster.connection().await));

    for name in &names {
        let token = JOBS.try_lock(&store, name).await.unwrap().expect("free");
        let held = JOBS.attempt(&store, name).await.unwrap();
        let retry_after = held.retry_after().expect("held by the token above");
        assert!(retry_after > Duration::from_secs(4) && retry_after <= Duration::from_secs(5));
        assert!(token.extend().await.unwrap());
        assert!(token.release().await.unwrap());
        assert!(
            JOBS.try_lock(&store, name)
                .await
                .unwrap()
                .expect("free again")
                .release()
                .await
                .unwrap()
        );

        let first = FENCED.try_lock(&store, name).await.unwrap().unwrap();
        let one = first.fence().unwrap();
        assert!(first.release().await.unwrap());
        let second = FENCED.try_lock(&store, name).await.unwrap().unwrap();
        let two = second.fence().unwrap();
        assert!(
            two > one,
            "the fence counter shares the slot: {two} after {one}"
        );
        assert!(second.release().await.unwrap());

        let a = DOCS
            .try_read(&store, name)
            .await
            .unwrap()
            .expect("no writer");
        let b = DOCS
            .try_read(&store, name)
            .await
            .unwrap()
            .expect("readers share");
        assert!(
            DOCS.try_write(&store, name).await.unwrap().is_none(),
            "readers block the writer"
        );
        assert!(a.extend().await.unwrap());
        assert!(a.release().await.unwrap());
        assert!(b.release().await.unwrap());
        let w = DOCS
            .try_write(&store, name)
            .await
            .unwrap()
            .expect("no readers left");
        assert!(
            DOCS.try_read(&store, name).await.unwrap().is_none(),
            "the writer blocks readers"
        );
        assert!(w.extend().await.unwrap());
        assert!(w.release().await.unwrap());

        let w = FENCED_DOCS.try_write(&store, name).await.unwrap().unwrap();
        let generation = w.fence();
        assert!(w.release().await.unwrap());
        let r = FENCED_DOCS.try_read(&store, name).await.unwrap().unwrap();
        assert_eq!(
            r.fence(),
            generation,
            "a reader sees the last writer's generation"
        );
        assert!(r.release().await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_load_on_the_node_that_owns_the_slot_after_a_flush() {
    let cluster = RedisCluster::start();
    let names = names();
    let store = Store::from(RedisStore::new(cluster.connection().await));
    // Warm: every script is cached on every node it ran on.
    for name in &names {
        JOBS.try_lock(&store, name)
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
        DOCS.try_read(&store, name)
            .await
            .unwrap()
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    // Flushed on every node, each `EVALSHA` answers NOSCRIPT and the store falls back to `EVAL`,
    // routed like `EVALSHA` by its keys to the slot's node, which caches the script again.
    script_flush_everywhere(&cluster);
    let mut held = Vec::new();
    for name in &names {
        held.push(JOBS.try_lock(&store, name).await.unwrap().expect("free"));
    }
    // The fallback really ran, on every node: `EVAL` of the script on the slot's node.
    for node in cluster.nodes() {
        let mut conn = node.client().get_connection().unwrap();
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut conn)
            .unwrap();
        assert!(
            stats.contains("cmdstat_eval:calls="),
            "node {}: {stats}",
            node.port()
        );
    }
    script_flush_everywhere(&cluster);
    for token in held {
        assert!(token.extend().await.unwrap());
        assert!(token.release().await.unwrap());
    }
    script_flush_everywhere(&cluster);
    for name in &names {
        let w = DOCS.try_write(&store, name).await.unwrap().expect("free");
        assert!(w.release().await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_exclude_across_connections_and_keys_land_on_the_owning_node() {
    let cluster = RedisCluster::start();
    let a = Store::from(RedisStore::new(cluster.connection().await));
    let b = Store::from(RedisStore::new(cluster.connection().await));
    let names = names();
    let keys = KeyLayout::default();
    let mut tokens = Vec::new();
    for name in &names {
        tokens.push(JOBS.try_lock(&a, name).await.unwrap().unwrap());
        assert!(
            JOBS.try_lock(&b, name).await.unwrap().is_none(),
            "{name} is held through a"
        );
        let key = keys.key(KeyRole::Lock, "jobs", name.as_bytes());
        let mut node = cluster.node_for(&key).client().get_connection().unwrap();
        let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut node).unwrap();
        assert!(
            pttl > 4000 && pttl <= 5000,
            "{name}: the key is on its slot's node, PTTL {pttl}"
        );
    }
    for token in tokens {
        assert!(token.release().await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_looks_at_every_primary() {
    let cluster = RedisCluster::start();
    let store = Store::from(RedisStore::new(cluster.connection().await));
    // A store from a bare connection lacks notifications, and says so.
    assert_eq!(store.check().await.unwrap(), [Warning::NoNotifications]);

    let node = &cluster.nodes()[1];
    let mut conn = node.connection().await;
    config_set(&mut conn, "maxmemory", "100mb").await;
    config_set(&mut conn, "maxmemory-policy", "volatile-lru").await;
    let warnings = store.check().await.unwrap();
    let [
        Warning::EvictingPolicy {
            node: Some(addr),
            policy,
            ..
        },
        Warning::NoNotifications,
    ] = &warnings[..]
    else {
        panic!("one warning for the one misconfigured node, got {warnings:?}");
    };
    assert_eq!(policy, "volatile-lru");
    assert!(
        addr.ends_with(&format!(":{}", node.port())),
        "{addr} names node {}",
        node.port()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_down_fails_calls_promptly_and_the_store_recovers_when_it_returns() {
    let mut cluster = RedisCluster::start();
    let timeout = Duration::from_millis(500);
    let store: Store = tower_lease::RedisStore::new(cluster.connection().await)
        .timeout(timeout)
        .into();
    let names = names();
    let keys = KeyLayout::default();
    let victim = cluster.nodes()[1].port();
    let on_victim: Vec<&String> = names
        .iter()
        .filter(|n| {
            let key = keys.key(KeyRole::Lock, "jobs", n.as_bytes());
            cluster.node_for(&key).port() == victim
        })
        .collect();
    let mut held = Vec::new();
    for name in &on_victim {
        held.push(JOBS.try_lock(&store, name).await.unwrap().expect("free"));
    }

    cluster.stop_node(1);
    // While the master is gone (and after the others mark the cluster down), every call fails
    // within about the timeout: never a hang, never a false "acquired".
    let mut slowest = Duration::ZERO;
    for name in names.iter().take(12) {
        let started = Instant::now();
        let outcome = JOBS.try_lock(&store, name).await;
        slowest = slowest.max(started.elapsed());
        if let Ok(Some(token)) = outcome {
            // Names on the live masters may still work until the cluster is marked down.
            assert!(!on_victim.contains(&name), "acquired on a dead node");
            let _ = token.release().await;
        }
    }
    assert!(
        slowest < timeout + Duration::from_millis(500),
        "a call took {slowest:?}"
    );

    let restarted = Instant::now();
    cluster.restart_node(1);
    // The node comes back empty (no persistence) with its slots: the leases it held are gone,
    // and the same store works again once redis-rs has reconnected.
    let mut lost = 0;
    for token in held {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match token.extend().await {
                Ok(still) => {
                    assert!(!still, "a lease survived a restart without persistence");
                    lost += 1;
                    break;
                }
                Err(e) => assert!(Instant::now() < deadline, "never recovered: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for name in &names {
        let token = JOBS
            .try_lock(&store, name)
            .await
            .unwrap()
            .expect("free after the restart");
        assert!(token.release().await.unwrap());
    }
    eprintln!(
        "cluster: master down: every call answered within {slowest:?} (timeout {timeout:?}); \
         {lost} leases on it reported lost, store working again {:?} after the restart",
        restarted.elapsed()
    );
}

/// A master restarting (and rejoining with its slots) costs no call: the first call on each of
/// its names after it is back succeeds, through a store made by `connect_cluster`, the cluster
/// connection's reconnection and the store's retry of a call whose connection was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_call_after_a_master_restarts_succeeds() {
    let mut cluster = RedisCluster::start();
    let store: Store = tower_lease::RedisStore::connect_cluster(cluster.urls())
        .await
        .unwrap()
        .into();
    let names = names();
    let keys = KeyLayout::default();
    let victim = cluster.nodes()[1].port();
    let on_victim: Vec<&String> = names
        .iter()
        .filter(|n| {
            let key = keys.key(KeyRole::Lock, "jobs", n.as_bytes());
            cluster.node_for(&key).port() == victim
        })
        .collect();
    // Connections to every node, in use before the restart.
    for name in &names {
        let token = JOBS.try_lock(&store, name).await.unwrap().unwrap();
        assert!(token.release().await.unwrap());
    }
    cluster.restart_node(1);
    for name in &on_victim {
        let token = JOBS.try_lock(&store, name).await;
        let token = token.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(token.expect("free").release().await.unwrap());
        let read = FENCED_DOCS.try_read(&store, name).await;
        let read = read.unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(read.expect("free").release().await.unwrap());
    }
}
