//! `claim`: the payments case. A handler charges inside a transaction that also claims its
//! idempotency key; its process dies after the commit, before the response is stored. The
//! retry, on another replica, does not charge again (and without the claim, it does: the
//! control).

mod support;

use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use axum::extract::State;
use axum::routing::post;
use axum::{Extension, Router};
use tower_lease::{Idempotency, IdempotencyKey, IdempotencyLayer, Store};
use tower_lease_postgres::deadpool_postgres::Pool;
use tower_lease_postgres::{ClaimError, PgStore, claim};

const LEASE: Duration = Duration::from_millis(500);
const PAYMENTS: Idempotency = Idempotency::new("payments", Duration::from_secs(3600)).lease(LEASE);

#[derive(Clone)]
struct App {
    pool: Pool,
    /// Whether the handler claims its key in its transaction.
    claims: bool,
    /// Told once the charge committed; the handler then never answers, as a process that
    /// died there.
    dies_after_commit: Option<std_mpsc::Sender<()>>,
}

async fn pay(State(app): State<App>, Extension(key): Extension<IdempotencyKey>) -> &'static str {
    let mut client = app.pool.get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    tx.execute("INSERT INTO charges (key) VALUES ($1)", &[&key.key()])
        .await
        .unwrap();
    if app.claims {
        match claim(&tx, &key).await {
            Ok(()) => {}
            // Charged already: the transaction rolls back as it drops.
            Err(ClaimError::AlreadyClaimed) => return "charged already",
            Err(e) => panic!("claim: {e}"),
        }
    }
    tx.commit().await.unwrap();
    if let Some(died) = app.dies_after_commit {
        let _ = died.send(());
        std::future::pending::<()>().await;
    }
    "charged"
}

fn router(store: PgStore, claims: bool, dies_after_commit: Option<std_mpsc::Sender<()>>) -> Router {
    let app = App {
        pool: store.pool().clone(),
        claims,
        dies_after_commit,
    };
    let store: Store = store.into();
    Router::new()
        .route("/pay", post(pay))
        .route_layer(IdempotencyLayer::new(store, PAYMENTS))
        .with_state(app)
}

/// A replica in a runtime of its own, on a thread of its own, that dies (its runtime shut
/// down: no heartbeat, no completion, no release, its connections cut) once its handler
/// committed: answers its address, and waits on `died` for the commit.
fn doomed_replica(url: String, claims: bool) -> (std::net::SocketAddr, std_mpsc::Receiver<()>) {
    let (addr_tx, addr_rx) = std_mpsc::channel();
    let (died_tx, died_rx) = std_mpsc::channel();
    let (committed_tx, committed_rx) = std_mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let addr = runtime.block_on(async {
            let store = PgStore::connect(&url).await.unwrap();
            tower_lease_harness::http::serve(router(store, claims, Some(committed_tx))).await
        });
        addr_tx.send(addr).unwrap();
        let _ = committed_rx.recv();
        runtime.shutdown_background();
        let _ = died_tx.send(());
    });
    (addr_rx.recv().unwrap(), died_rx)
}

async fn charges(url: &str, key: &str) -> i64 {
    support::client(url)
        .await
        .query_one("SELECT count(*) FROM charges WHERE key = $1", &[&key])
        .await
        .unwrap()
        .get(0)
}

async fn post_pay(
    addr: std::net::SocketAddr,
    key: String,
) -> Result<(u16, String), reqwest::Error> {
    let reply = reqwest::Client::new()
        .post(format!("http://{addr}/pay"))
        .header("idempotency-key", key)
        .body("10 EUR to Ada")
        .timeout(Duration::from_secs(5))
        .send()
        .await?;
    let status = reply.status().as_u16();
    Ok((status, reply.text().await?))
}

/// Charges once on a replica that dies after its commit, then retries on another replica
/// after the dead one's reservation ran out; answers the retry's status and body.
async fn crash_then_retry(url: &str, claims: bool, key: &str) -> (u16, String) {
    let (doomed, died) = doomed_replica(url.to_owned(), claims);
    let first = tokio::spawn(post_pay(doomed, key.to_owned()));
    tokio::task::spawn_blocking(move || died.recv_timeout(Duration::from_secs(10)))
        .await
        .unwrap()
        .expect("the first request committed and its replica died");
    assert!(
        first.await.unwrap().is_err(),
        "the dead replica answered nothing"
    );
    assert_eq!(charges(url, key).await, 1);
    let survivor = PgStore::connect(url).await.unwrap();
    let survivor = tower_lease_harness::http::serve(router(survivor, claims, None)).await;
    // The dead replica's reservation runs out by its lease.
    tokio::time::sleep(LEASE + Duration::from_millis(200)).await;
    post_pay(survivor, key.to_owned()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_crash_between_commit_and_response_does_not_charge_again() {
    let server = support::server().await;
    let url = server.url();
    // The schema first, then the application's table.
    drop(support::pg_store(&server).await);
    support::client(&url)
        .await
        .batch_execute("CREATE TABLE charges (key text NOT NULL)")
        .await
        .unwrap();

    let (status, body) = crash_then_retry(&url, true, "pay-1").await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body.contains("urn:tower-lease:idempotency-outcome-unknown"),
        "{body}"
    );
    assert_eq!(charges(&url, "pay-1").await, 1, "the retry charged again");

    // The control: without the claim, the same retry charges a second time.
    let (status, body) = crash_then_retry(&url, false, "pay-2").await;
    assert_eq!((status, body.as_str()), (200, "charged"));
    assert_eq!(charges(&url, "pay-2").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claiming_handler_that_answers_is_replayed_and_a_second_claim_is_refused() {
    let server = support::server().await;
    let url = server.url();
    let store = support::pg_store(&server).await;
    support::client(&url)
        .await
        .batch_execute("CREATE TABLE charges (key text NOT NULL)")
        .await
        .unwrap();
    let addr = tower_lease_harness::http::serve(router(store.clone(), true, None)).await;

    assert_eq!(
        post_pay(addr, "pay-3".into()).await.unwrap(),
        (200, "charged".into())
    );
    let (status, body) = post_pay(addr, "pay-3".into()).await.unwrap();
    assert_eq!((status, body.as_str()), (200, "charged"), "replayed");
    assert_eq!(charges(&url, "pay-3").await, 1);

    // A second transaction claiming the key (a run whose reservation was lost) is refused,
    // and its effect rolls back with it.
    let mut client = store.pool().get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    tx.execute("INSERT INTO charges (key) VALUES ('pay-3')", &[])
        .await
        .unwrap();
    let key = claimed_key("pay-3").await;
    assert!(matches!(
        claim(&tx, &key).await,
        Err(ClaimError::AlreadyClaimed)
    ));
    drop(tx);
    assert_eq!(charges(&url, "pay-3").await, 1);
}

/// The `IdempotencyKey` a request with `key` runs under, as the layer hands it to handlers.
async fn claimed_key(key: &str) -> IdempotencyKey {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let app = Router::new()
        .route(
            "/key",
            post(move |Extension(key): Extension<IdempotencyKey>| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send(key);
                    "ok"
                }
            }),
        )
        .route_layer(IdempotencyLayer::new(Store::memory(), PAYMENTS));
    let addr = tower_lease_harness::http::serve(app).await;
    reqwest::Client::new()
        .post(format!("http://{addr}/key"))
        .header("idempotency-key", key)
        .send()
        .await
        .unwrap();
    rx.recv().await.unwrap()
}
