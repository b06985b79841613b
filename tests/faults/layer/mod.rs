//! The layer over real TCP when something breaks: Redis (restarted, flushed, partitioned,
//! stopped, blackholed, slow, out of memory, its replies lost) and clients (gone mid-request,
//! mid-body, or a storm of cancelled requests).

mod clients;
mod store;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use axum::Router;
use axum::routing::post;
use tower_lease::{Lock, LockLayer, Store, extract};

use tower_lease_harness::http::{count, serve};
use tower_lease_harness::{Endpoint, RedisServer};

/// Serves `count` (it counts its runs in `runs` and works for the `x-work-ms` header) on
/// `/jobs/{id}` behind `layer`.
async fn serve_jobs(layer: LockLayer<extract::PathSegment>, runs: &Arc<AtomicUsize>) -> SocketAddr {
    let app = Router::new()
        .route("/jobs/{id}", post(count))
        .route_layer(layer)
        .with_state(runs.clone());
    serve(app).await
}

/// A `LockLayer` that locks `/jobs/{id}` on the id.
fn by_id(store: Store, lock: Lock<str>) -> LockLayer<extract::PathSegment> {
    LockLayer::new(store, lock, extract::path_segment(1))
}

async fn lock_keys(server: &RedisServer) -> Vec<String> {
    let mut conn = server.connection().await;
    redis::cmd("KEYS")
        .arg("tower-lease:*")
        .query_async(&mut conn)
        .await
        .unwrap()
}
