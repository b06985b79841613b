//! A section of K seats sold across three replicas to 100 buyers at once: each seat is a permit
//! of a `Semaphore`, held while its buyer checks out, so exactly K buyers get one. Checkout calls
//! a payment partner that takes at most 2 calls at once per section, across every replica:
//! `SemaphoreLayer` keeps to that, queueing the rest with `.max_wait(..)`.
//!
//! ```text
//! cargo run --example pool                                   # in memory
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example pool  # on Redis
//! ```

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use tokio::net::TcpListener;
use tower_lease::{Permit, RedisStore, Semaphore, SemaphoreLayer, Store, extract};

/// Seats per section; a hold lasts 10 minutes unless its buyer pays or gives it up.
const SEATS: Semaphore<str> = Semaphore::new("seats", 12, Duration::from_secs(600));
/// Payment calls at once per section, across every replica.
const PAYMENTS: Semaphore<str> = Semaphore::new("payments", 2, Duration::from_secs(10));

/// One replica's state: the holds it handed out, and a witness of payments in progress.
#[derive(Clone)]
struct Replica {
    store: Store,
    holds: Arc<Mutex<HashMap<u64, Permit<Semaphore<str>>>>>,
    next_hold: Arc<AtomicU64>,
    paying: Arc<AtomicUsize>,
    most_paying: Arc<AtomicUsize>,
}

/// `POST /sections/{section}/hold`: `201` with a hold id, or `409` when the section is sold out.
async fn hold(
    State(replica): State<Replica>,
    Path(section): Path<String>,
) -> Result<(StatusCode, String), (StatusCode, String)> {
    let failed = |e: tower_lease::Error| (StatusCode::SERVICE_UNAVAILABLE, e.to_string());
    match SEATS
        .try_acquire(&replica.store, &section)
        .await
        .map_err(failed)?
    {
        Some(permit) => {
            let id = replica.next_hold.fetch_add(1, Ordering::Relaxed);
            replica.holds.lock().unwrap().insert(id, permit);
            Ok((StatusCode::CREATED, id.to_string()))
        }
        None => Err((StatusCode::CONFLICT, "sold out".to_owned())),
    }
}

/// `POST /sections/{section}/pay`: a slow call to the payment partner, under `SemaphoreLayer`.
async fn pay(State(replica): State<Replica>) -> &'static str {
    let now = replica.paying.fetch_add(1, Ordering::SeqCst) + 1;
    replica.most_paying.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(20)).await;
    replica.paying.fetch_sub(1, Ordering::SeqCst);
    "paid"
}

/// A replica's store: on Redis a connection of its own, as a separate process has; in memory
/// the one store all replicas of this process share (`memory`).
async fn store(memory: &Store) -> Result<Store, Box<dyn std::error::Error>> {
    Ok(match std::env::var("REDIS_URL") {
        Ok(url) => RedisStore::connect(&url).await?.into(),
        Err(_) => memory.clone(),
    })
}

async fn start_replica(
    store: Store,
    witness: (&Arc<AtomicUsize>, &Arc<AtomicUsize>),
) -> Result<(SocketAddr, Replica), Box<dyn std::error::Error>> {
    let replica = Replica {
        store: store.clone(),
        holds: Arc::default(),
        next_hold: Arc::default(),
        paying: witness.0.clone(),
        most_paying: witness.1.clone(),
    };
    let payments = SemaphoreLayer::new(store, PAYMENTS, extract::path_segment(1))
        .max_wait(Duration::from_secs(5));
    let app = Router::new()
        .route("/sections/{section}/hold", post(hold))
        .merge(
            Router::new()
                .route("/sections/{section}/pay", post(pay))
                .route_layer(payments),
        )
        .with_state(replica.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((addr, replica))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The witness of payments in progress is shared by the replicas of this demo, so it counts
    // calls across all three.
    let (paying, most_paying) = (Arc::default(), Arc::default());
    let (memory, mut replicas) = (Store::memory(), Vec::new());
    for _ in 0..3 {
        replicas.push(start_replica(store(&memory).await?, (&paying, &most_paying)).await?);
    }
    let section = format!("section-{}", std::process::id());
    let client = http_client::Client::default();

    let mut buyers = tokio::task::JoinSet::new();
    for buyer in 0..100 {
        let addr = replicas[buyer % replicas.len()].0;
        let (client, section) = (client.clone(), section.clone());
        buyers.spawn(async move {
            let held = client
                .post(addr, &format!("/sections/{section}/hold"))
                .await;
            if held == StatusCode::CREATED {
                let paid = client.post(addr, &format!("/sections/{section}/pay")).await;
                assert_eq!(paid, StatusCode::OK, "payment refused");
            }
            held
        });
    }
    let (mut sold, mut sold_out) = (0, 0);
    while let Some(held) = buyers.join_next().await {
        match held? {
            StatusCode::CREATED => sold += 1,
            StatusCode::CONFLICT => sold_out += 1,
            other => return Err(format!("a buyer got {other}").into()),
        }
    }
    let in_use = SEATS.in_use(&replicas[0].1.store, &section).await?;
    let most = most_paying.load(Ordering::SeqCst);
    println!(
        "100 buyers, 3 replicas, {} seats: {sold} sold, {sold_out} sold out, {in_use} holds live",
        SEATS.permits()
    );
    println!(
        "payments at once: at most {most} (limit {})",
        PAYMENTS.permits()
    );
    // Give the seats back, so a store on Redis is left as it was.
    for (_, replica) in &replicas {
        let holds: Vec<_> = replica.holds.lock().unwrap().drain().collect();
        for (_, permit) in holds {
            permit.release().await?;
        }
    }
    if sold != SEATS.permits() as usize || in_use != SEATS.permits() || most > 2 {
        return Err("the pool was not kept".into());
    }
    Ok(())
}

/// Just enough of an HTTP/1 client for the demo.
mod http_client {
    use std::net::SocketAddr;

    use axum::http::{Request, StatusCode};
    use http_body_util::Empty;
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::TokioExecutor;

    type Inner = hyper_util::client::legacy::Client<HttpConnector, Empty<bytes::Bytes>>;

    #[derive(Clone)]
    pub(crate) struct Client(Inner);

    impl Default for Client {
        fn default() -> Self {
            Self(hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http())
        }
    }

    impl Client {
        pub(crate) async fn post(&self, addr: SocketAddr, path: &str) -> StatusCode {
            let req = Request::post(format!("http://{addr}{path}"))
                .body(Empty::new())
                .expect("a valid request");
            match self.0.request(req).await {
                Ok(res) => res.status(),
                Err(_) => StatusCode::BAD_GATEWAY,
            }
        }
    }
}
