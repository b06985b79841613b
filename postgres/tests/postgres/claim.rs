//! `claim`: the payments case. A handler charges inside a transaction that also claims its
//! idempotency key; its process dies after the commit, before the response is stored. The
//! retry, on another replica, runs the handler again: its claim answers `AlreadyClaimed`, and
//! it answers from its own record, the receipt of the first charge, without charging again
//! (and without the claim, it charges again: the control).

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, SystemTime};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Extension, Router};
use tower_lease::{Idempotency, IdempotencyKey, IdempotencyLayer, Store};
use tower_lease_postgres::deadpool_postgres::Pool;
use tower_lease_postgres::{ClaimError, PgStore, claim};

const LEASE: Duration = Duration::from_millis(500);
const PAYMENTS: Idempotency = Idempotency::new("payments", Duration::from_secs(3600)).lease(LEASE);
const PAYMENTS_ONCE: Idempotency = PAYMENTS.at_most_once();

/// The application's table: one row per charge, its receipt the row's number.
const CHARGES: &str = "CREATE TABLE charges (receipt bigserial, key text NOT NULL)";

#[derive(Clone)]
struct App {
    pool: Pool,
    /// Whether the handler claims its key in its transaction.
    claims: bool,
    /// Told once the charge committed; the handler then never answers, as a process that
    /// died there.
    dies_after_commit: Option<std_mpsc::Sender<()>>,
    /// How many runs found their key claimed already, and answered from the record.
    answered_from_record: Arc<AtomicUsize>,
}

async fn pay(
    State(app): State<App>,
    Extension(key): Extension<IdempotencyKey>,
) -> (StatusCode, String) {
    let mut client = app.pool.get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    let receipt: i64 = tx
        .query_one(
            "INSERT INTO charges (key) VALUES ($1) RETURNING receipt",
            &[&key.key()],
        )
        .await
        .unwrap()
        .get(0);
    if app.claims {
        match claim(&tx, &key).await {
            Ok(()) => {}
            // Charged already (a run before this one committed, then died before its
            // response was stored): no second charge, and the answer comes from the record.
            Err(ClaimError::AlreadyClaimed { .. }) => {
                tx.rollback().await.unwrap();
                app.answered_from_record.fetch_add(1, Ordering::SeqCst);
                let receipt: i64 = client
                    .query_one("SELECT receipt FROM charges WHERE key = $1", &[&key.key()])
                    .await
                    .unwrap()
                    .get(0);
                return (StatusCode::CREATED, format!("receipt {receipt}"));
            }
            Err(e) => panic!("claim: {e}"),
        }
    }
    tx.commit().await.unwrap();
    if let Some(died) = app.dies_after_commit {
        let _ = died.send(());
        std::future::pending::<()>().await;
    }
    (StatusCode::CREATED, format!("receipt {receipt}"))
}

/// A replica's app: whether it claims, under which definition.
#[derive(Clone, Copy)]
struct Setup {
    claims: bool,
    definition: Idempotency,
}

const CLAIMING: Setup = Setup {
    claims: true,
    definition: PAYMENTS,
};

fn router(
    store: PgStore,
    setup: Setup,
    dies_after_commit: Option<std_mpsc::Sender<()>>,
    answered_from_record: Arc<AtomicUsize>,
) -> Router {
    let app = App {
        pool: store.pool().clone(),
        claims: setup.claims,
        dies_after_commit,
        answered_from_record,
    };
    let store: Store = store.into();
    Router::new()
        .route("/pay", post(pay))
        .route_layer(
            IdempotencyLayer::new(store, setup.definition).max_wait(Duration::from_secs(3)),
        )
        .with_state(app)
}

/// A replica in a runtime of its own, on a thread of its own, that dies (its runtime shut
/// down: no heartbeat, no completion, no release, its connections cut) once its handler
/// committed: answers its address, and waits on `died` for the commit.
fn doomed_replica(url: String, setup: Setup) -> (std::net::SocketAddr, std_mpsc::Receiver<()>) {
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
            let app = router(store, setup, Some(committed_tx), Arc::default());
            tower_lease_harness::http::serve(app).await
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

/// The receipt of `key`'s first charge, as the first request would have answered it.
async fn first_receipt(url: &str, key: &str) -> String {
    let receipt: i64 = support::client(url)
        .await
        .query_one("SELECT min(receipt) FROM charges WHERE key = $1", &[&key])
        .await
        .unwrap()
        .get(0);
    format!("receipt {receipt}")
}

async fn post_pay(
    addr: std::net::SocketAddr,
    key: String,
) -> Result<(u16, String), reqwest::Error> {
    post_body(addr, key, "10 EUR to Ada").await
}

async fn post_body(
    addr: std::net::SocketAddr,
    key: String,
    body: &'static str,
) -> Result<(u16, String), reqwest::Error> {
    let reply = reqwest::Client::new()
        .post(format!("http://{addr}/pay"))
        .header("idempotency-key", key)
        .body(body)
        .timeout(Duration::from_secs(5))
        .send()
        .await?;
    let status = reply.status().as_u16();
    Ok((status, reply.text().await?))
}

/// A fresh server with the schema and the application's table.
async fn setup_server() -> (tower_lease_harness::PgServer, String) {
    let server = support::server().await;
    let url = server.url();
    // The schema first, then the application's table.
    drop(support::pg_store(&server).await);
    support::client(&url)
        .await
        .batch_execute(CHARGES)
        .await
        .unwrap();
    (server, url)
}

/// Charges once on a replica that dies after its commit, and serves another replica once the
/// dead one's reservation ran out: answers the survivor's address and how many of its runs
/// answered from the record.
async fn crash(url: &str, setup: Setup, key: &str) -> (std::net::SocketAddr, Arc<AtomicUsize>) {
    let (doomed, died) = doomed_replica(url.to_owned(), setup);
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
    let answered_from_record = Arc::new(AtomicUsize::new(0));
    let app = router(survivor, setup, None, answered_from_record.clone());
    let survivor = tower_lease_harness::http::serve(app).await;
    // The dead replica's reservation runs out by its lease.
    tokio::time::sleep(LEASE + Duration::from_millis(200)).await;
    (survivor, answered_from_record)
}

/// [`crash`], then one retry on the survivor: answers its status and body.
async fn crash_then_retry(url: &str, setup: Setup, key: &str) -> (u16, String) {
    let (survivor, _) = crash(url, setup, key).await;
    post_pay(survivor, key.to_owned()).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_crash_between_commit_and_response_gets_the_first_receipt() {
    let (_server, url) = setup_server().await;

    let (status, body) = crash_then_retry(&url, CLAIMING, "pay-1").await;
    let receipt = first_receipt(&url, "pay-1").await;
    assert_eq!((status, body.as_str()), (201, receipt.as_str()));
    assert_eq!(charges(&url, "pay-1").await, 1, "the retry charged again");

    // The control: without the claim, the same retry charges a second time.
    let unclaimed = Setup {
        claims: false,
        ..CLAIMING
    };
    let (status, _) = crash_then_retry(&url, unclaimed, "pay-2").await;
    assert_eq!(status, 201);
    assert_eq!(charges(&url, "pay-2").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_at_most_once_a_claimed_key_is_answered_and_an_unclaimed_one_stays_unknown() {
    let (_server, url) = setup_server().await;

    // Claimed: the effect is known to have committed, and the handler answers from its record.
    let once = Setup {
        claims: true,
        definition: PAYMENTS_ONCE,
    };
    let (status, body) = crash_then_retry(&url, once, "pay-4").await;
    let receipt = first_receipt(&url, "pay-4").await;
    assert_eq!((status, body.as_str()), (201, receipt.as_str()));
    assert_eq!(charges(&url, "pay-4").await, 1);

    // Not claimed: nobody knows whether it took effect, and it never runs again.
    let unclaimed = Setup {
        claims: false,
        ..once
    };
    let (status, body) = crash_then_retry(&url, unclaimed, "pay-5").await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body.contains("urn:tower-lease:idempotency-outcome-unknown"),
        "{body}"
    );
    assert_eq!(charges(&url, "pay-5").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_retries_after_a_crash_run_the_handler_once_and_all_get_the_receipt() {
    let (_server, url) = setup_server().await;
    let (survivor, answered_from_record) = crash(&url, CLAIMING, "pay-6").await;
    let retries: Vec<_> = (0..4)
        .map(|_| tokio::spawn(post_pay(survivor, "pay-6".to_owned())))
        .collect();
    let receipt = first_receipt(&url, "pay-6").await;
    for retry in retries {
        let (status, body) = retry.await.unwrap().unwrap();
        assert_eq!((status, body.as_str()), (201, receipt.as_str()));
    }
    assert_eq!(answered_from_record.load(Ordering::SeqCst), 1, "one run");
    assert_eq!(charges(&url, "pay-6").await, 1);

    // Another body under the claimed key is another request: 422, not a run.
    let (status, body) = post_body(survivor, "pay-6".into(), "10 EUR to Bob")
        .await
        .unwrap();
    assert_eq!(status, 422, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claiming_handler_that_answers_is_replayed_and_a_second_claim_is_refused() {
    let (server, url) = setup_server().await;
    let store = support::pg_store(&server).await;
    let app = router(store.clone(), CLAIMING, None, Arc::default());
    let addr = tower_lease_harness::http::serve(app).await;

    let before = SystemTime::now();
    let (status, first) = post_pay(addr, "pay-3".into()).await.unwrap();
    assert_eq!(status, 201);
    let (status, body) = post_pay(addr, "pay-3".into()).await.unwrap();
    assert_eq!((status, body), (201, first), "replayed");
    let after = SystemTime::now();
    assert_eq!(charges(&url, "pay-3").await, 1);

    // A second transaction claiming the key (a run whose reservation was lost) is refused,
    // and its effect rolls back with it.
    let mut client = store.pool().get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    tx.execute("INSERT INTO charges (key) VALUES ('pay-3')", &[])
        .await
        .unwrap();
    let key = support::claimed_key(PAYMENTS, "pay-3").await;
    let Err(ClaimError::AlreadyClaimed { claimed_at }) = claim(&tx, &key).await else {
        panic!("a second claim of a claimed key was not refused");
    };
    // When the first request claimed it, on the server's clock (this machine's).
    let slack = Duration::from_secs(1);
    assert!(
        claimed_at + slack >= before,
        "{claimed_at:?} before {before:?}"
    );
    assert!(
        claimed_at <= after + slack,
        "{claimed_at:?} after {after:?}"
    );
    drop(tx);
    assert_eq!(charges(&url, "pay-3").await, 1);
}
