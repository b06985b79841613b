//! A product catalog per shop: exports (`GET`) share a read lease, repricing (`PUT`) takes the
//! write lease, so nobody exports a half-repriced catalog. Each request waits up to 2 s for its
//! turn (the layer's default); the handlers here are slow on purpose (3 s exports, 10 s
//! reprices), so a request that meets the other side shows its wait run out, then the `409`.
//!
//! ```text
//! cargo run --example catalog                 # leases in memory, on 127.0.0.1:3000
//! ADDR=127.0.0.1:8080 REDIS_URL=redis://127.0.0.1:6379/ cargo run --example catalog
//! ```

use std::time::Duration;

use axum::extract::Path;
use axum::routing::get;
use axum::{Extension, Router};
use tower_lease::{Lease, RedisStore, RwLock, RwLockLayer, Store, extract};

/// Repricing takes seconds; the heartbeat keeps the lease while it runs.
const CATALOG: RwLock<str> = RwLock::new("catalog", Duration::from_secs(5));

async fn export(Path(shop): Path<String>) -> String {
    tokio::time::sleep(Duration::from_secs(3)).await;
    format!("catalog of {shop}: 3 products\n")
}

async fn reprice(Path(shop): Path<String>, Extension(lease): Extension<Lease>) -> String {
    // Cooperative: stop early if the lease goes away (the layer would cancel us anyway).
    tokio::select! {
        () = lease.lost() => format!("repricing {shop} stopped: lease lost\n"),
        () = tokio::time::sleep(Duration::from_secs(10)) => format!("{shop} repriced\n"),
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "tower_lease=debug".into()),
        )
        .init();

    let store = match std::env::var("REDIS_URL") {
        Ok(url) => RedisStore::connect(&url).await?.into(),
        Err(_) => Store::memory(),
    };
    let app = Router::new()
        .route("/catalog/{shop}", get(export).put(reprice))
        .route_layer(RwLockLayer::new(store, CATALOG, extract::path_segment(1)));

    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("catalog on http://{addr}; try, in other terminals:");
    println!("  curl -i http://{addr}/catalog/acme            # export, 3 s, shared");
    println!("  curl -i http://{addr}/catalog/acme            # a second export runs alongside");
    println!("  curl -i -X PUT http://{addr}/catalog/acme     # reprice: waits for the exports");
    println!(
        "                                                 # (409 after 2 s), then 10 s holding"
    );
    println!("  curl -i http://{addr}/catalog/acme            # waits 2 s, then 409 + Retry-After");
    axum::serve(listener, app).await?;
    Ok(())
}
