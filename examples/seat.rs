//! The last concert seat: three replicas of a ticket service, one store, 100 clients pressing
//! "reserve" at the same moment. Exactly one of them gets the seat.
//!
//! ```text
//! cargo run --example seat                              # leases in memory
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example seat
//! ```
//!
//! The handler checks the seat, charges the card (a 50 ms await), then marks it sold: a
//! check-then-act race that sells the seat many times over without the lock. It runs the crowd
//! twice, without and with `LockLayer`, and exits non-zero unless the locked run sold exactly
//! one seat.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::routing::post;
use axum::{Extension, Router};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::net::TcpListener;
use tokio::sync::Barrier;
use tower_lease::{Lease, Lock, LockLayer, RedisStore, Store, extract};

/// One lock per seat; a reservation takes well under a second, the TTL is a safety net.
const SEATS: Lock<str> = Lock::new("seat", Duration::from_secs(10));

const REPLICAS: usize = 3;
const CLIENTS: usize = 100;

/// Stands for the database all replicas share.
#[derive(Default)]
struct Database {
    sold_to: Mutex<Option<usize>>,
    sales: AtomicUsize,
}

async fn reserve(
    State(db): State<Arc<Database>>,
    Path(seat): Path<String>,
    lease: Option<Extension<Lease>>,
    client: String,
) -> (StatusCode, String) {
    if db.sold_to.lock().unwrap().is_some() {
        return (StatusCode::CONFLICT, format!("seat {seat} is sold out"));
    }
    // Charging the card takes a while; everyone who checked before now thinks the seat is free.
    tokio::time::sleep(Duration::from_millis(50)).await;
    *db.sold_to.lock().unwrap() = client.parse().ok();
    db.sales.fetch_add(1, Ordering::SeqCst);
    let fence = lease.and_then(|Extension(lease)| lease.fence());
    (
        StatusCode::OK,
        format!("seat {seat} is yours (fence {fence:?})"),
    )
}

fn replica(db: Arc<Database>, store: Option<Store>) -> Router {
    let app = Router::new().route("/seats/{seat}/reserve", post(reserve));
    let app = match store {
        Some(store) => app.route_layer(LockLayer::new(store, SEATS, extract::path_segment(1))),
        None => app,
    };
    app.with_state(db)
}

async fn store() -> Result<Store, tower_lease::Error> {
    match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("leases in Redis at {url}");
            Ok(RedisStore::connect(&url).await?.into())
        }
        Err(_) => {
            println!("leases in memory (set REDIS_URL to use Redis)");
            Ok(Store::memory())
        }
    }
}

/// Starts the replicas, sends the crowd, answers (200s, 409s, others, seats sold).
async fn crowd(store: Option<Store>, seat: &str) -> (usize, usize, usize, usize) {
    let db = Arc::new(Database::default());
    let mut replicas = Vec::new();
    for _ in 0..REPLICAS {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        replicas.push(listener.local_addr().unwrap());
        let app = replica(db.clone(), store.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    }

    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let start = Arc::new(Barrier::new(CLIENTS));
    let presses: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (client, start) = (client.clone(), start.clone());
            let addr: SocketAddr = replicas[i % REPLICAS];
            let uri = format!("http://{addr}/seats/{seat}/reserve");
            tokio::spawn(async move {
                let req = Request::post(uri).body(Full::from(i.to_string())).unwrap();
                start.wait().await;
                client.request(req).await.map(|res| res.status())
            })
        })
        .collect();

    let (mut ok, mut conflict, mut other) = (0, 0, 0);
    for press in presses {
        match press.await.unwrap() {
            Ok(StatusCode::OK) => ok += 1,
            Ok(StatusCode::CONFLICT) => conflict += 1,
            _ => other += 1,
        }
    }
    (ok, conflict, other, db.sales.load(Ordering::SeqCst))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = store().await?;
    // A fresh seat per run, so a Redis shared with earlier runs holds no stale lease.
    let seat = format!("A12-{}", std::process::id());

    let (ok, conflict, other, sold) = crowd(None, &seat).await;
    println!(
        "without the lock: {ok} × 200, {conflict} × 409, {other} × other; seat sold {sold} times"
    );
    let (ok, conflict, other, sold) = crowd(Some(store), &seat).await;
    println!(
        "with LockLayer:   {ok} × 200, {conflict} × 409, {other} × other; seat sold {sold} times"
    );

    if sold != 1 || ok != 1 || other != 0 {
        eprintln!("FAILED: expected the seat sold exactly once, to exactly one client");
        std::process::exit(1);
    }
    println!("exactly one seat sold across {REPLICAS} replicas");
    Ok(())
}
