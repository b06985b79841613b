//! The layers' client cost, without a network or a server: requests through an axum app on
//! `Store::memory()` via `tower::ServiceExt::oneshot`, bare and behind each layer, with the
//! allocations per request (a counting allocator) and, under callgrind, the instructions.
//!
//! ```text
//! cargo bench --all-features --bench layer_cost                 # allocations and ns per request
//! ITERS=20000 LAYER_COST=rw-hot valgrind --tool=callgrind target/release/deps/layer_cost-…
//! ```
//!
//! The variants (`LAYER_COST=a,b` runs only those):
//!
//! - `bare-get`: `GET /docs/{name}` on the bare app;
//! - `rw-hot`: the same behind `RwLockLayer`, while a read of the name holds the layer's share
//!   (its handler waits until the end), so every request joins it: no store call, as for hot
//!   names under load (`rw_http`);
//! - `bare-post`: `POST /jobs/{name}` on the bare app;
//! - `from-fn`: the same behind an `axum::middleware::from_fn` around `Lock::attempt` and
//!   `release`, what one writes without the layer;
//! - `lock-layer`: the same behind `LockLayer`.
//!
//! Each request's response body is read to its end, as a server does. With `ITERS=n` every variant runs `n` requests after as many to warm up and prints
//! only its allocations per request: run two `n` under callgrind and divide the difference in
//! instructions by the difference in requests.

use std::hint::black_box;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::StatusCode;
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_lease::{Lock, LockLayer, RwLock, RwLockLayer, Store, extract};

#[path = "support/counting.rs"]
mod counting;

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

const TTL: Duration = Duration::from_secs(30);
/// Long, so that the share outlives a run under callgrind: the requests never wait, so the
/// heartbeat, a task of the same runtime, gets no turn to extend it.
const DOCS: RwLock<str> = RwLock::new("docs", Duration::from_secs(3600));
const JOBS: Lock<str> = Lock::new("jobs", TTL);

async fn read() -> &'static str {
    "doc"
}

/// Ends the holding read of `rw-hot`.
static DONE: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// The read that holds the share: answers once [`DONE`] says so.
async fn hold() -> &'static str {
    DONE.notified().await;
    "held"
}

async fn work() -> &'static str {
    "done"
}

/// The hand-written middleware of the `http` benchmark, on the same store as the layer.
async fn lock_middleware(
    State(store): State<Store>,
    Path(name): Path<String>,
    req: Request,
    next: Next,
) -> Response {
    let token = match JOBS.attempt(&store, &name).await {
        Ok(tower_lease::Attempt::Acquired(token)) => token,
        Ok(tower_lease::Attempt::Busy { .. }) => return StatusCode::CONFLICT.into_response(),
        Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
    };
    let res = next.run(req).await;
    token.release().await.expect("the release failed");
    res
}

fn docs() -> Router {
    Router::new()
        .route("/docs/{name}", get(read))
        .route("/hold/{name}", get(hold))
}

fn jobs() -> Router {
    Router::new().route("/jobs/{name}", post(work))
}

/// One request through `app`, its body read to the end; panics unless `200`.
async fn send(app: &Router, method: &str, path: &'static str) {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .body(axum::body::Body::empty())
        .unwrap();
    let res = app.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK, "{method} {path}");
    black_box(res.into_body().collect().await.unwrap());
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(bench());
}

async fn bench() {
    let store = Store::memory();
    let rw = docs().route_layer(RwLockLayer::new(
        store.clone(),
        DOCS,
        extract::path_segment(1),
    ));
    let from_fn = jobs().route_layer(middleware::from_fn_with_state(
        store.clone(),
        lock_middleware,
    ));
    let layered = jobs().route_layer(LockLayer::new(
        store.clone(),
        JOBS,
        extract::path_segment(1),
    ));
    // The read that holds the share every `rw-hot` request joins, until the end.
    let holder = {
        let req = http::Request::get("/hold/hot")
            .body(axum::body::Body::empty())
            .unwrap();
        tokio::spawn(rw.clone().oneshot(req))
    };
    // Its turn: the memory store answers at once, and its handler then waits.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    // `with_state` turns each handler into its route with the layers applied once, as
    // `axum::serve` does; without it, axum applies them again for every request.
    let variants: [(&str, Router, &str, &'static str); 5] = [
        ("bare-get", docs().with_state(()), "GET", "/docs/hot"),
        ("rw-hot", rw.with_state(()), "GET", "/docs/hot"),
        ("bare-post", jobs().with_state(()), "POST", "/jobs/job"),
        ("from-fn", from_fn.with_state(()), "POST", "/jobs/job"),
        ("lock-layer", layered.with_state(()), "POST", "/jobs/job"),
    ];
    let only = std::env::var("LAYER_COST").ok();
    let iters = std::env::var("ITERS")
        .ok()
        .and_then(|n| n.parse::<u64>().ok());
    let runs = iters.unwrap_or(200_000);
    println!("| variant | allocations per request | ns per request |");
    println!("|---|---:|---:|");
    for (name, app, method, path) in variants {
        if only
            .as_deref()
            .is_some_and(|only| !only.split(',').any(|o| o == name))
        {
            continue;
        }
        for _ in 0..runs.min(10_000) {
            send(&app, method, path).await;
        }
        let (allocations, started) = (counting::allocations(), Instant::now());
        for _ in 0..runs {
            send(&app, method, path).await;
        }
        let elapsed = started.elapsed();
        let allocations = counting::allocations() - allocations;
        println!(
            "| {name} | {:.2} | {:.0} |",
            allocations as f64 / runs as f64,
            elapsed.as_nanos() as f64 / runs as f64,
        );
    }
    DONE.notify_one();
    let held = holder.await.unwrap().unwrap();
    assert_eq!(held.status(), StatusCode::OK, "the holding read");
}
