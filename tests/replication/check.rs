//! `Store::check()` on a primary with two replicas: it warns when `wait_for_replicas(n, ..)`
//! cannot be met now, when `n` leaves no replica to spare (a crash is then an outage), and when
//! a store has no release notifications.

use std::time::{Duration, Instant};

use tower_lease::{RedisStore, Store, Warning};

use crate::support::Endpoint;
use crate::support::sentinel::Topology;

async fn warnings(store: Store) -> Vec<String> {
    let warnings: Vec<Warning> = store.check().await.unwrap();
    warnings.iter().map(ToString::to_string).collect()
}

async fn sentinel(topology: &Topology, n: u32) -> Store {
    let wait = Duration::from_millis(300);
    topology
        .through_sentinels()
        .await
        .wait_for_replicas(n, wait)
        .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_warns_about_replicas_it_cannot_count_on_and_missing_notifications() {
    let mut topology = Topology::two_replicas(Duration::from_secs(1)).await;
    assert_eq!(
        warnings(sentinel(&topology, 1).await).await,
        Vec::<String>::new(),
        "one of two replicas"
    );

    let two = warnings(sentinel(&topology, 2).await).await;
    assert!(
        matches!(&two[..], [w] if w.contains("wait_for_replicas(2") && w.contains("2 replicas")),
        "n equal to the replica count: {two:?}"
    );

    let plain: Store = RedisStore::new(topology.primary.connection().await).into();
    let plain = warnings(plain).await;
    assert!(
        matches!(&plain[..], [w] if w.contains("no release notifications")),
        "a store without notifications: {plain:?}"
    );

    topology.others[0].stop();
    let mut primary = topology.primary.connection().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut primary)
            .await
            .unwrap();
        if info.contains("connected_slaves:1") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the primary still counts the stopped replica"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let one_left = warnings(sentinel(&topology, 2).await).await;
    assert!(
        one_left.iter().any(|w| w.contains("only 1 replica")),
        "fewer replicas connected than n: {one_left:?}"
    );
}
