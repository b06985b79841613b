//! `RwLockLayer` over real TCP, on Redis and in memory: reads overlap, writes exclude both, and
//! under the README's layering a method the route does not serve gets its `405` unlocked.

use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use http::{Method, StatusCode};
use tower_lease::{RwLock, RwLockLayer, extract};

use tower_lease_harness::http::{Http, serve};
use tower_lease_harness::{Backing, Gate};

/// Readers first: a refused write leaves no intent, so reads keep coming in while it is refused
/// (the phase-fair default's order is `reads::catalog`'s and the test kit's `fairness`).
const CATALOG: RwLock<str> =
    RwLock::new("catalog", Duration::from_secs(2)).fairness(tower_lease::Fairness::ReadersFirst);

tower_lease_harness::store_tests!(
    Layer: [
        reads_overlap_and_writes_exclude_both,
        methods_a_route_does_not_serve_take_no_lock,
    ]
);

async fn export(State(gate): State<Gate>) -> &'static str {
    gate.pass().await;
    "read"
}

async fn reprice(State(gate): State<Gate>) -> &'static str {
    gate.pass().await;
    "written"
}

async fn search() -> &'static str {
    "found"
}

async fn reads_overlap_and_writes_exclude_both(env: Backing) {
    let (opener, gate) = Gate::new();
    let app = Router::new()
        .route("/catalog/{shop}", get(export).head(export).put(reprice))
        .route_layer(RwLockLayer::new(
            env.store.clone(),
            CATALOG,
            extract::path_segment(1),
        ))
        .with_state(gate.clone());
    let addr = serve(app).await;
    // Another replica where a POST that only searches takes a read lease.
    let searching = RwLockLayer::new(env.store.clone(), CATALOG, extract::path_segment(1))
        .read_when(|req: &http::Request<axum::body::Body>| {
            req.method() == Method::GET || req.uri().path().ends_with("/search")
        });
    let other = Router::new()
        .route("/catalog/{shop}/search", post(search))
        .route("/catalog/{shop}/reindex", post(search))
        .route_layer(searching);
    let other = serve(other).await;
    let http = Http::new();

    // Two GETs inside the handler at the same time: they share the read lease.
    let reads: Vec<_> = (0..2)
        .map(|_| {
            let http = http.clone();
            tokio::spawn(async move { http.get(addr, "/catalog/s1").await })
        })
        .collect();
    gate.until_inside(2).await;

    // While they read: a write is refused, more reads (and a read by `read_when`) get in.
    let reply = http.put(addr, "/catalog/s1").await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
    assert!(reply.retry_after().is_some());
    assert_eq!(reply.problem()["namespace"], "catalog");
    assert_eq!(
        http.post(other, "/catalog/s1/search").await.status,
        StatusCode::OK
    );
    assert_eq!(
        http.post(other, "/catalog/s1/reindex").await.status,
        StatusCode::CONFLICT
    );
    opener.send_replace(true);
    for read in reads {
        let reply = read.await.unwrap();
        assert_eq!((reply.status, reply.text()), (StatusCode::OK, "read"));
    }

    // A write inside the handler: reads and other writes are refused.
    opener.send_replace(false);
    let write = {
        let http = http.clone();
        tokio::spawn(async move { http.put(addr, "/catalog/s1").await })
    };
    gate.until_inside(1).await;
    for method in [Method::GET, Method::HEAD, Method::PUT] {
        let reply = http.send(addr, method.clone(), "/catalog/s1", &[]).await;
        assert_eq!(
            reply.status,
            StatusCode::CONFLICT,
            "{method} during a write"
        );
    }
    assert_eq!(
        http.post(other, "/catalog/s1/search").await.status,
        StatusCode::CONFLICT
    );
    // Another shop is another lock: a write to it gets in while this one is inside.
    let other_shop = {
        let http = http.clone();
        tokio::spawn(async move { http.put(addr, "/catalog/s2").await })
    };
    gate.until_inside(2).await;
    opener.send_replace(true);
    assert_eq!(other_shop.await.unwrap().text(), "written");
    let reply = write.await.unwrap();
    assert_eq!((reply.status, reply.text()), (StatusCode::OK, "written"));

    // Everything released: a direct write lease is free.
    assert!(CATALOG.try_write(&env.store, "s1").await.unwrap().is_some());
}

/// The layering the README gives for axum: the layer on the route's `MethodRouter`, which
/// wraps the methods it serves and not its `405` fallback. (On the `Router`, the same layer
/// took a write lease for `POST` and answered `409` behind a reader.)
async fn methods_a_route_does_not_serve_take_no_lock(env: Backing) {
    // Refusing at once, so that a request that asked for the lock shows as a `409`.
    let layer = RwLockLayer::new(env.store.clone(), CATALOG, extract::path_segment(1))
        .max_wait(Duration::ZERO);
    let app = Router::new().route(
        "/catalog/{shop}",
        get(|| async { "catalog" })
            .put(|| async { "repriced" })
            .route_layer(layer),
    );
    let addr = serve(app).await;
    let http = Http::new();
    let path = "/catalog/shop-1";

    let reader = CATALOG.try_read(&env.store, "shop-1").await.unwrap();
    let reader = reader.expect("a free name");
    assert_eq!(http.get(addr, path).await.status, StatusCode::OK);
    assert_eq!(http.put(addr, path).await.status, StatusCode::CONFLICT);
    let post = http.post(addr, path).await;
    assert_eq!(post.status, StatusCode::METHOD_NOT_ALLOWED, "{post:?}");
    assert!(reader.release().await.unwrap());

    let writer = CATALOG.try_write(&env.store, "shop-1").await.unwrap();
    let writer = writer.expect("a free name");
    assert_eq!(http.get(addr, path).await.status, StatusCode::CONFLICT);
    for method in [Method::POST, Method::DELETE, Method::PATCH] {
        let reply = http.send(addr, method.clone(), path, &[]).await;
        assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED, "{method}");
        assert_eq!(reply.retry_after(), None, "{method}: no lock was asked");
    }
    assert!(writer.release().await.unwrap());
}
