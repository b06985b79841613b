//! A write intent on a cluster with sharded notifications: a writer-preferred `PUT` refused in
//! one process `SPUBLISH`es its intent on the name's shard channel, and the lingering share of
//! another process, listening there with `SSUBSCRIBE`, ends its linger at once.

use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use tower_lease::store::{KeyLayout, KeyRole};
use tower_lease::{RedisStore, RwLock, RwLockLayer, Store, extract};

use tower_lease_harness::Endpoint;
use tower_lease_harness::cluster::RedisCluster;
use tower_lease_harness::http::{Http, serve};

/// A share lingers at most a quarter of a heartbeat (a twelfth of the TTL): 1.67 s.
const DOCS: RwLock<str> =
    RwLock::new("docs", Duration::from_secs(20)).fairness(tower_lease::Fairness::WritersFirst);
/// Far longer than the writer's wait below: only the intent can end it in time.
const LINGER: Duration = Duration::from_millis(1500);
/// Long enough that two reads sent together overlap.
const READ: Duration = Duration::from_millis(200);

async fn replica(cluster: &RedisCluster, linger: Duration) -> std::net::SocketAddr {
    let store: Store = RedisStore::connect_cluster(cluster.urls())
        .await
        .unwrap()
        .into();
    // Refusing at once: the writer's first PUT is refused, and leaves its intent.
    let layer = RwLockLayer::new(store, DOCS, extract::path_segment(1))
        .linger_reads(linger)
        .max_wait(Duration::ZERO);
    let app = Router::new()
        .route(
            "/docs/{id}",
            get(|| async {
                tokio::time::sleep(READ).await;
                "read"
            })
            .put(|| async { "written" }),
        )
        .route_layer(layer);
    serve(app).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_writers_intent_ends_a_share_lingering_in_another_process() {
    let cluster = RedisCluster::start();
    let (readers, writers) = (
        replica(&cluster, LINGER).await,
        replica(&cluster, Duration::ZERO).await,
    );
    let http = Http::new();
    for name in ["a", "b", "c", "d", "e", "f"] {
        let path = format!("/docs/{name}");
        // Two reads that overlap: the share lingers after them, and the last one's answer
        // waits for it to settle.
        let reads: Vec<_> = (0..2)
            .map(|_| {
                let (http, path) = (http.clone(), path.clone());
                tokio::spawn(async move { http.get(readers, &path).await })
            })
            .collect();
        // The lingering share listens for intents on the master that owns the name.
        let mut channel = KeyLayout::default().key(KeyRole::Writer, "docs", name.as_bytes());
        channel.truncate(channel.len() - b":w".len());
        let owner = cluster.node_for(&channel);
        let mut conn = owner.client().get_connection().unwrap();
        // The share subscribes once it holds its lease, beside the answer: give it a moment.
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let (_, subscribers): (Vec<u8>, i64) = redis::cmd("PUBSUB")
                .arg("SHARDNUMSUB")
                .arg(&channel)
                .query(&mut conn)
                .unwrap();
            if subscribers == 1 || Instant::now() > deadline {
                assert_eq!(subscribers, 1, "{name}: the share's shard subscription");
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }

        let started = Instant::now();
        let refused = http.put(writers, &path).await;
        assert_eq!(refused.status, StatusCode::CONFLICT, "{name}: {refused:?}");
        for read in reads {
            assert_eq!(read.await.unwrap().text(), "read", "{name}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let written = http.put(writers, &path).await;
        let took = started.elapsed();
        assert_eq!(
            written.text(),
            "written",
            "{name}: {written:?} after {took:?}"
        );
        println!(
            "{name} (node {}): the writer in after {took:?}",
            owner.port()
        );
        assert!(took < LINGER / 2, "{name}: in after {took:?}");
    }
}
