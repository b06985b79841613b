//! Shared reads in the metrics: every request that shares a reader lease counts as `acquired`,
//! while the store calls and the held gauge count the one lease in Redis.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::get;
use http::StatusCode;
use tower_lease::{RwLock, RwLockLayer, extract};

use super::{moved, recorded, turn};
use tower_lease_harness::http::{Http, serve};
use tower_lease_harness::{Backing, Gate, Setup};

const SHARED: RwLock<str> = RwLock::new("shared", Duration::from_secs(5));

async fn read(State(gate): State<Gate>) -> &'static str {
    gate.pass().await;
    "read"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_reads_count_every_request_and_one_lease() {
    let _turn = turn().await;
    let env = Backing::redis(Setup::Layer).await;
    let (opener, gate) = Gate::new();
    let layer = RwLockLayer::new(env.store.clone(), SHARED, extract::path_segment(1));
    let app = Router::new()
        .route("/docs/{id}", get(read))
        .route_layer(layer)
        .with_state(gate.clone());
    let addr = serve(app).await;
    let reads: Vec<_> = (0..5)
        .map(|_| tokio::spawn(async move { Http::new().get(addr, "/docs/a").await }))
        .collect();
    gate.until_inside(5).await;

    let inside = recorded();
    let acquired = "tower_lease_acquire_total{mode=read,namespace=shared,outcome=acquired}";
    assert_eq!(
        moved(&inside, "tower_lease_acquire_total"),
        BTreeMap::from([(acquired.to_owned(), 5.0)]),
        "each request counts as acquired"
    );
    let series = |name: &str| format!("{name}{{mode=read,namespace=shared}}");
    assert_eq!(
        inside[&series("tower_lease_acquire_seconds")],
        1.0,
        "one store acquisition"
    );
    assert_eq!(inside[&series("tower_lease_held")], 1.0, "one lease held");

    opener.send_replace(true);
    for read in reads {
        assert_eq!(read.await.unwrap().status, StatusCode::OK);
    }
    // The last read was answered once the share's lease was released.
    let after = recorded();
    assert_eq!(after[&series("tower_lease_held")], 0.0);
    assert_eq!(
        after[&series("tower_lease_hold_seconds")],
        1.0,
        "one lease ended"
    );
}
