//! Sharded release notifications on a real local Redis Cluster: a release `SPUBLISH`es on its
//! name's shard channel, a waiter in another process listens with `SSUBSCRIBE` on the master
//! that owns the name's slot (on each of the masters), the subscription follows the slot when it
//! moves to another master and comes back after its connection is cut, and a release no longer
//! crosses the cluster bus to the other nodes.

use std::time::{Duration, Instant};

use tower_lease::store::{KeyLayout, KeyRole};
use tower_lease::{Lock, RedisStore, RwLock, Semaphore, Store};

use tower_lease_harness::Endpoint;
use tower_lease_harness::cluster::RedisCluster;

/// A long lease: within a test, only a notification can hand the lock over before the waiter's
/// next poll (a second apart for a waiter with notifications).
const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(10));

/// Well under the watched waiter's poll of 1 s, with room for a loaded 2-core machine.
const WOKEN_WITHIN: Duration = Duration::from_millis(300);

async fn replica(cluster: &RedisCluster) -> Store {
    RedisStore::connect_cluster(cluster.urls())
        .await
        .unwrap()
        .into()
}

fn channel(name: &str) -> Vec<u8> {
    KeyLayout::default().key(KeyRole::Lock, "jobs", name.as_bytes())
}

/// The index of the master that owns `name`'s slot.
fn owner(cluster: &RedisCluster, name: &str) -> usize {
    let port = cluster.node_for(&channel(name)).port();
    cluster
        .nodes()
        .iter()
        .position(|n| n.port() == port)
        .unwrap()
}

/// One name whose slot each master owns, in the order of the nodes.
fn one_name_per_master(cluster: &RedisCluster) -> Vec<String> {
    (0..cluster.nodes().len())
        .map(|i| {
            (0..)
                .map(|n| format!("name-{n}"))
                .find(|name| owner(cluster, name) == i)
                .unwrap()
        })
        .collect()
}

/// `PUBSUB SHARDNUMSUB channel` on node `i`: its subscribers to the shard channel.
fn shard_subscribers(cluster: &RedisCluster, i: usize, channel: &[u8]) -> i64 {
    let mut conn = cluster.nodes()[i].client().get_connection().unwrap();
    let (_, count): (Vec<u8>, i64) = redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(channel)
        .query(&mut conn)
        .unwrap();
    count
}

/// Waits up to `within` until node `i` has `want` subscribers to the shard channel.
async fn until_shard_subscribers(
    cluster: &RedisCluster,
    i: usize,
    channel: &[u8],
    want: i64,
    within: Duration,
) {
    let deadline = Instant::now() + within;
    loop {
        let found = shard_subscribers(cluster, i, channel);
        if found == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {i}: {found} shard subscribers to {}, want {want}",
            String::from_utf8_lossy(channel)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts a waiter on `name` in `store`, with a wait of 8 s; answers when it got the lock.
fn wait_for(store: &Store, name: &str) -> tokio::task::JoinHandle<Instant> {
    let (store, name) = (store.clone(), name.to_owned());
    tokio::spawn(async move {
        let token = JOBS
            .try_lock_for(&store, &name, Duration::from_secs(8))
            .await
            .unwrap()
            .expect("the waiter got the lock");
        let acquired = Instant::now();
        assert!(token.release().await.unwrap());
        acquired
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_any_master_is_woken_through_its_names_shard() {
    let cluster = RedisCluster::start();
    let (holder_replica, waiter_replica) = (replica(&cluster).await, replica(&cluster).await);
    for (i, name) in one_name_per_master(&cluster).iter().enumerate() {
        let holder = JOBS.try_lock(&holder_replica, name).await.unwrap().unwrap();
        let waiter = wait_for(&waiter_replica, name);
        // The waiter listens on the master that owns the name, and nowhere else.
        until_shard_subscribers(&cluster, i, &channel(name), 1, Duration::from_secs(2)).await;
        for other in (0..3).filter(|&other| other != i) {
            assert_eq!(shard_subscribers(&cluster, other, &channel(name)), 0);
        }
        // Past the waiter's first attempts: the next one is a second away.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        assert!(holder.release().await.unwrap());
        let woken = waiter.await.unwrap() - released;
        println!("master {i}: {name} handed over {woken:?} after the release");
        assert!(woken < WOKEN_WITHIN, "{name} on master {i}: {woken:?}");
        // The waiter left: its subscription with it.
        until_shard_subscribers(&cluster, i, &channel(name), 0, Duration::from_secs(2)).await;
    }
}

/// `SPUBLISH`es node `i` ran, from `INFO commandstats`.
fn spublishes(cluster: &RedisCluster, i: usize) -> u64 {
    let mut conn = cluster.nodes()[i].client().get_connection().unwrap();
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn)
        .unwrap();
    tower_lease_harness::server::calls(&stats, "spublish")
}

/// A permit's and a reader's live release (plain commands, not a script) on each master: the
/// pipeline goes to the node that owns the name, and a waiter in another process is woken
/// through the name's shard channel (`SPUBLISH` on that node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_permit_or_read_release_wakes_its_waiter_through_the_shard() {
    let permits: Semaphore<str> = Semaphore::new("jobs", 1, Duration::from_secs(10));
    let rw: RwLock<str> = RwLock::new("jobs", Duration::from_secs(10));
    let cluster = RedisCluster::start();
    let (holder_replica, waiter_replica) = (replica(&cluster).await, replica(&cluster).await);
    let wait = Duration::from_secs(8);
    for (i, name) in one_name_per_master(&cluster).iter().enumerate() {
        let before = spublishes(&cluster, i);
        let permit = permits
            .try_acquire(&holder_replica, name)
            .await
            .unwrap()
            .unwrap();
        let (store, owned) = (waiter_replica.clone(), name.clone());
        let waiter = tokio::spawn(async move {
            let permit = permits.try_acquire_for(&store, &owned, wait).await.unwrap();
            let acquired = Instant::now();
            assert!(
                permit
                    .expect("the waiter got a permit")
                    .release()
                    .await
                    .unwrap()
            );
            acquired
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        assert!(permit.release().await.unwrap());
        let woken = waiter.await.unwrap().saturating_duration_since(released);
        assert!(
            woken < WOKEN_WITHIN,
            "a permit of {name} on master {i}: {woken:?}"
        );

        let read = rw.try_read(&holder_replica, name).await.unwrap().unwrap();
        let (store, owned) = (waiter_replica.clone(), name.clone());
        let waiter = tokio::spawn(async move {
            let write = rw.try_write_for(&store, &owned, wait).await.unwrap();
            let acquired = Instant::now();
            assert!(
                write
                    .expect("the writer got the lock")
                    .release()
                    .await
                    .unwrap()
            );
            acquired
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let released = Instant::now();
        assert!(read.release().await.unwrap());
        let woken = waiter.await.unwrap().saturating_duration_since(released);
        assert!(
            woken < WOKEN_WITHIN,
            "a reader of {name} on master {i}: {woken:?}"
        );
        let published = spublishes(&cluster, i) - before;
        assert!(
            published >= 2,
            "master {i}: {published} SPUBLISH for two marked releases"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_subscription_follows_its_slot_to_another_master() {
    let cluster = RedisCluster::start();
    let (holder_replica, waiter_replica) = (replica(&cluster).await, replica(&cluster).await);
    let name = &one_name_per_master(&cluster)[0];
    let channel = channel(name);
    let holder = JOBS.try_lock(&holder_replica, name).await.unwrap().unwrap();
    let waiter = wait_for(&waiter_replica, name);
    until_shard_subscribers(&cluster, 0, &channel, 1, Duration::from_secs(2)).await;

    let moved = Instant::now();
    cluster.move_slot(cluster.slot_of(&channel), 0, 1);
    // The old owner dropped the subscription with the slot; the new owner has it.
    until_shard_subscribers(&cluster, 1, &channel, 1, Duration::from_secs(3)).await;
    println!(
        "subscribed on the new owner {:?} after the move",
        moved.elapsed()
    );
    assert_eq!(shard_subscribers(&cluster, 0, &channel), 0);
    // Past the attempt the move woke: the waiter's next poll is a second away.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert!(holder.release().await.unwrap());
    let woken = waiter.await.unwrap() - released;
    println!("handed over {woken:?} after the release, on the slot's new owner");
    assert!(woken < WOKEN_WITHIN, "{woken:?}");
}

/// `cluster_stats_messages_<field>` of node `i`'s `CLUSTER INFO`.
fn bus_messages(cluster: &RedisCluster, i: usize, field: &str) -> u64 {
    let mut conn = cluster.nodes()[i].client().get_connection().unwrap();
    let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut conn).unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("cluster_stats_messages_{field}:")))
        .map_or(0, |n| n.trim().parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_reaches_no_node_but_the_names_own() {
    const RELEASES: u64 = 40;
    let cluster = RedisCluster::start();
    let store = replica(&cluster).await;
    let name = &one_name_per_master(&cluster)[0];
    // Neither owns the slot nor replicates it (the local cluster has no replicas).
    let bystanders = [1, 2];
    let received = |i| {
        bus_messages(&cluster, i, "publish_received")
            + bus_messages(&cluster, i, "publishshard_received")
    };
    let before: Vec<u64> = bystanders.iter().map(|&i| received(i)).collect();
    for _ in 0..RELEASES {
        let token = JOBS.try_lock(&store, name).await.unwrap().unwrap();
        assert!(token.release().await.unwrap());
    }
    for (&i, before) in bystanders.iter().zip(before) {
        let grew = received(i) - before;
        println!("node {i}: {grew} publish messages received over {RELEASES} releases");
        assert_eq!(
            grew, 0,
            "node {i} heard the releases of a slot it does not serve"
        );
    }
}

/// `CLIENT KILL TYPE pubsub` on node `i`: ends the subscriber connections there, and only them.
fn kill_subscribers(cluster: &RedisCluster, i: usize) -> i64 {
    let mut conn = cluster.nodes()[i].client().get_connection().unwrap();
    redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut conn)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_subscriber_connection_subscribes_again_and_misses_no_release() {
    let cluster = RedisCluster::start();
    let (holder_replica, waiter_replica) = (replica(&cluster).await, replica(&cluster).await);
    let name = &one_name_per_master(&cluster)[1];
    let channel = channel(name);

    // Cut, then released once the subscription is back.
    let holder = JOBS.try_lock(&holder_replica, name).await.unwrap().unwrap();
    let waiter = wait_for(&waiter_replica, name);
    until_shard_subscribers(&cluster, 1, &channel, 1, Duration::from_secs(2)).await;
    let cut = Instant::now();
    assert_eq!(kill_subscribers(&cluster, 1), 1, "the waiter's subscriber");
    until_shard_subscribers(&cluster, 1, &channel, 1, Duration::from_secs(3)).await;
    println!("subscribed again {:?} after the cut", cut.elapsed());
    // Past the attempts the cut and the resubscription woke: the next poll is a second away.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    assert!(holder.release().await.unwrap());
    let woken = waiter.await.unwrap() - released;
    println!("handed over {woken:?} after the release, on the new connection");
    assert!(woken < WOKEN_WITHIN, "{woken:?}");

    // Released while the subscription is gone: the wake-ups of the cut and of the
    // resubscription find it, not the next poll.
    let holder = JOBS.try_lock(&holder_replica, name).await.unwrap().unwrap();
    let waiter = wait_for(&waiter_replica, name);
    until_shard_subscribers(&cluster, 1, &channel, 1, Duration::from_secs(2)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(kill_subscribers(&cluster, 1), 1, "the waiter's subscriber");
    let released = Instant::now();
    assert!(holder.release().await.unwrap());
    let woken = waiter.await.unwrap() - released;
    println!("handed over {woken:?} after a release during the cut");
    assert!(woken < WOKEN_WITHIN, "{woken:?}");
}
