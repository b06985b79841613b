//! Checkout over a flaky network: three replicas of a shop, clients that retry a purchase on
//! every timeout or cut connection with one `Idempotency-Key` per purchase. Every purchase must
//! be charged exactly once, and every client must end up with its receipt.
//!
//! ```text
//! cargo run --example checkout                              # keys in memory
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example checkout
//! ```
//!
//! The network cuts a third of the requests at a random moment (before, during or after the
//! charge), and clients give up on an answer after 80 ms while a charge takes 10 to 120 ms.
//! The shop runs twice, without and with `IdempotencyLayer`; the example exits non-zero unless
//! the second run charged every purchase exactly once and every client saw its own receipt.
//! Under the layer the handler records its `IdempotencyKey` in the charge's own transaction
//! (a unique key), as a service must for exactly once across a replica that dies mid-request;
//! here no replica dies, so a run that key refuses counts as a failure of the layer.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Extension, Router};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rand::Rng;
use tokio::net::TcpListener;
use tower_lease::{Idempotency, IdempotencyKey, IdempotencyLayer, RedisStore, Store};

/// Purchases are replayed for a day; a charge takes well under the 2 s reservation lease.
const PURCHASES: Idempotency =
    Idempotency::new("checkout", Duration::from_secs(24 * 3600)).lease(Duration::from_secs(2));

const REPLICAS: usize = 3;
const CLIENTS: usize = 30;
const PURCHASES_EACH: usize = 3;
const GIVE_UP_AFTER: Duration = Duration::from_millis(80);

/// Stands for the payment provider all replicas call: charges by purchase, and the ledger of
/// idempotency keys kept in the same transaction as each charge.
#[derive(Default)]
struct Payments {
    charges: Mutex<HashMap<String, Vec<u64>>>,
    next: Mutex<u64>,
    /// `UNIQUE (idempotency_key)`: the key of every charge made under the layer.
    ledger: Mutex<HashMap<String, u64>>,
    /// Runs the ledger refused: the layer let a key run twice.
    second_runs: Mutex<usize>,
}

async fn buy(
    State(payments): State<Arc<Payments>>,
    key: Option<Extension<IdempotencyKey>>,
    purchase: String,
) -> (StatusCode, String) {
    let took = rand::rng().random_range(10..120);
    tokio::time::sleep(Duration::from_millis(took)).await;
    // One transaction: the key's row and the charge commit together or not at all, so a
    // second run with the key (a replica that died before its response was stored) fails
    // on the unique key instead of charging again.
    let mut ledger = payments.ledger.lock().unwrap();
    if let Some(charge) = key.as_ref().and_then(|key| ledger.get(key.key())) {
        *payments.second_runs.lock().unwrap() += 1;
        return (StatusCode::CREATED, format!("{purchase}: charge {charge}"));
    }
    let charge = {
        let mut next = payments.next.lock().unwrap();
        *next += 1;
        *next
    };
    if let Some(Extension(key)) = &key {
        ledger.insert(key.key().to_owned(), charge);
    }
    let mut charges = payments.charges.lock().unwrap();
    charges.entry(purchase.clone()).or_default().push(charge);
    (StatusCode::CREATED, format!("{purchase}: charge {charge}"))
}

async fn store() -> Result<Store, tower_lease::Error> {
    match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("keys in Redis at {url}");
            Ok(RedisStore::connect(&url).await?.into())
        }
        Err(_) => {
            println!("keys in memory (set REDIS_URL to use Redis)");
            Ok(Store::memory())
        }
    }
}

/// One attempt: cut by the network a third of the time, given up on after `GIVE_UP_AFTER`.
async fn attempt(
    client: &Client<HttpConnector, Full<Bytes>>,
    addr: SocketAddr,
    key: &str,
    purchase: &str,
) -> Option<String> {
    let req = Request::post(format!("http://{addr}/buy"))
        .header("idempotency-key", format!("\"{key}\""))
        .body(Full::from(purchase.to_owned()))
        .unwrap();
    let cut_at = {
        let mut rng = rand::rng();
        rng.random_bool(1.0 / 3.0)
            .then(|| Duration::from_millis(rng.random_range(0..150)))
    };
    let deadline = cut_at.map_or(GIVE_UP_AFTER, |cut| cut.min(GIVE_UP_AFTER));
    // Dropping the request on a timeout or cut closes its connection mid-request.
    let reply = tokio::time::timeout(deadline, async {
        let res = client.request(req).await.ok()?;
        let status = res.status();
        let body = res.into_body().collect().await.ok()?.to_bytes();
        (status == StatusCode::CREATED).then(|| String::from_utf8_lossy(&body).into_owned())
    });
    reply.await.ok().flatten()
}

/// Runs the shop (under the layer when `store` is given); answers the payments and every
/// client's receipts by purchase.
async fn shop(store: Option<Store>, run: &str) -> (Arc<Payments>, HashMap<String, String>) {
    let payments = Arc::new(Payments::default());
    let mut replicas = Vec::new();
    for _ in 0..REPLICAS {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        replicas.push(listener.local_addr().unwrap());
        let app = Router::new().route("/buy", post(buy));
        let app = match &store {
            Some(store) => app.route_layer(
                IdempotencyLayer::new(store.clone(), PURCHASES).max_wait(Duration::from_secs(1)),
            ),
            None => app,
        };
        let app = app.with_state(payments.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    }
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (client, replicas, run) = (client.clone(), replicas.clone(), run.to_owned());
            tokio::spawn(async move {
                let mut receipts = Vec::new();
                for p in 0..PURCHASES_EACH {
                    let purchase = format!("purchase-{c}-{p}");
                    // One key per purchase, the same for every retry of it.
                    let key = format!("{run}-{purchase}");
                    let mut tries = 0;
                    let receipt = loop {
                        tries += 1;
                        let addr = replicas[rand::rng().random_range(0..REPLICAS)];
                        if let Some(receipt) = attempt(&client, addr, &key, &purchase).await {
                            break receipt;
                        }
                        assert!(tries < 200, "{purchase}: no receipt after {tries} tries");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    };
                    receipts.push((purchase, receipt));
                }
                receipts
            })
        })
        .collect();
    let mut receipts = HashMap::new();
    for client in clients {
        receipts.extend(client.await.unwrap());
    }
    // Cut requests may still be charging: let them land before counting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    (payments, receipts)
}

/// How many purchases were charged other than once, and how many receipts name a charge that
/// is not the purchase's only one.
fn audit(payments: &Payments, receipts: &HashMap<String, String>) -> (usize, usize) {
    let charges = payments.charges.lock().unwrap();
    let twice = receipts
        .keys()
        .filter(|purchase| charges.get(*purchase).map_or(0, Vec::len) != 1)
        .count();
    let wrong = receipts
        .iter()
        .filter(
            |(purchase, receipt)| match charges.get(*purchase).map(Vec::as_slice) {
                Some([charge]) => **receipt != format!("{purchase}: charge {charge}"),
                _ => true,
            },
        )
        .count();
    (twice, wrong)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = store().await?;
    // Keys of their own per run, so a Redis shared with earlier runs replays nothing stale.
    let run = format!("run-{}", std::process::id());
    let purchases = CLIENTS * PURCHASES_EACH;

    let (payments, receipts) = shop(None, &run).await;
    let (twice, _) = audit(&payments, &receipts);
    println!("without the layer: {twice} of {purchases} purchases charged more than once");

    let (payments, receipts) = shop(Some(store), &run).await;
    let (twice, wrong) = audit(&payments, &receipts);
    let charged: usize = payments
        .charges
        .lock()
        .unwrap()
        .values()
        .map(Vec::len)
        .sum();
    let second_runs = *payments.second_runs.lock().unwrap();
    println!(
        "with IdempotencyLayer: {charged} charges for {purchases} purchases, {} receipts, \
         {twice} charged other than once, {wrong} receipts wrong, {second_runs} second runs",
        receipts.len()
    );
    let failed = twice != 0 || wrong != 0 || second_runs != 0;
    if failed || receipts.len() != purchases || charged != purchases {
        eprintln!("FAILED: expected every purchase charged exactly once, and its receipt seen");
        std::process::exit(1);
    }
    println!("every purchase charged exactly once across {REPLICAS} replicas");
    Ok(())
}
