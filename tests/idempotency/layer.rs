//! `IdempotencyLayer` as a black box over real TCP (axum on 127.0.0.1:0), on Redis, the
//! cluster and in memory: every row of the HTTP contract.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use http::{Method, StatusCode};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tower_lease::{Idempotency, IdempotencyLayer, Store, extract};

use tower_lease_harness::http::{Chunks, Http, Reply, serve};
use tower_lease_harness::{Backing, Gate};

const PAYMENTS: Idempotency = Idempotency::new("payments", Duration::from_secs(60));

tower_lease_harness::store_tests!(
    Layer: [
        a_retry_gets_the_stored_response_and_the_handler_runs_once,
        a_retry_while_the_first_runs_gets_409_with_retry_after,
        under_wait_a_retry_gets_the_first_response,
        the_same_key_for_another_request_gets_422,
        missing_and_invalid_keys_get_400,
        a_5xx_is_not_stored_and_the_retry_runs,
        a_response_over_max_response_reaches_its_client_and_retries_get_410,
        a_streamed_response_within_the_limit_is_stored_whole,
        a_body_over_max_body_gets_413_and_reserves_nothing,
        scopes_keep_equal_keys_apart,
        two_replicas_share_keys,
        a_client_cut_mid_request_completes_and_its_retry_on_another_replica_replays,
        a_hundred_concurrent_retries_run_the_handler_once,
        a_crashed_replicas_reservation_ends_with_its_lease,
        a_key_runs_again_once_its_retention_ended,
    ],
    redis: [waiting_retries_on_another_replica_are_woken_by_the_completion]
);

/// What the handlers share: how many times each ran, and a gate the slow one waits at.
#[derive(Clone)]
struct App {
    runs: Arc<AtomicUsize>,
    gate: Gate,
}

async fn pay(State(app): State<App>, body: Bytes) -> Response {
    let n = app.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let headers = [
        ("x-receipt", format!("r{n}")),
        ("set-cookie", "session=first".to_owned()),
    ];
    let text = format!("receipt {n} for {} bytes", body.len());
    (StatusCode::CREATED, headers, text).into_response()
}

async fn slow(State(app): State<App>) -> Response {
    app.gate.pass().await;
    let n = app.runs.fetch_add(1, Ordering::SeqCst) + 1;
    (StatusCode::CREATED, format!("slow receipt {n}")).into_response()
}

async fn fail(State(app): State<App>) -> Response {
    let n = app.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let status = if n == 1 {
        StatusCode::INTERNAL_SERVER_ERROR
    } else {
        StatusCode::OK
    };
    (status, format!("attempt {n}")).into_response()
}

async fn big(State(app): State<App>) -> Response {
    let n = app.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let _ = n;
    Body::new(Chunks::new(8, 1024)).into_response()
}

async fn streamed(State(app): State<App>) -> Response {
    app.runs.fetch_add(1, Ordering::SeqCst);
    Body::new(Chunks::new(4, 100)).into_response()
}

/// One replica: the routes under `layer`, sharing `app`.
async fn replica(layer: IdempotencyLayer, app: &App) -> SocketAddr {
    let router = Router::new()
        .route("/pay", post(pay))
        .route("/slow", post(slow))
        .route("/fail", post(fail))
        .route("/big", post(big))
        .route("/streamed", post(streamed))
        .route_layer(layer)
        .with_state(app.clone());
    serve(router).await
}

fn app() -> (tokio::sync::watch::Sender<bool>, App) {
    let (opener, gate) = Gate::new();
    let runs = Arc::default();
    (opener, App { runs, gate })
}

fn layer(store: &Store) -> IdempotencyLayer {
    IdempotencyLayer::new(store.clone(), PAYMENTS)
}

async fn post_key(http: &Http, addr: SocketAddr, path: &str, key: &str) -> Reply {
    let headers: [(&str, &[u8]); 1] = [("idempotency-key", key.as_bytes())];
    http.send(addr, Method::POST, path, &headers).await
}

fn replayed(reply: &Reply) -> bool {
    reply
        .headers
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true")
}

fn problem_type(reply: &Reply) -> String {
    reply.problem()["type"].as_str().unwrap().to_owned()
}

async fn a_retry_gets_the_stored_response_and_the_handler_runs_once(env: Backing) {
    let (_opener, app) = app();
    let addr = replica(layer(&env.store), &app).await;
    let http = Http::new();
    let first = post_key(&http, addr, "/pay", "\"order-1\"").await;
    assert_eq!(first.status, StatusCode::CREATED, "{first:?}");
    assert_eq!(first.text(), "receipt 1 for 0 bytes");
    assert!(
        first.headers.contains_key("set-cookie"),
        "the first client gets its cookie"
    );
    assert!(!replayed(&first));
    // The quoted and the bare spelling name one key.
    for key in ["\"order-1\"", "order-1"] {
        let retry = post_key(&http, addr, "/pay", key).await;
        assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
        assert_eq!(retry.text(), "receipt 1 for 0 bytes");
        assert_eq!(retry.headers["x-receipt"], "r1");
        assert!(replayed(&retry), "{retry:?}");
        assert!(!retry.headers.contains_key("set-cookie"), "{retry:?}");
    }
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    // A request without a key runs as usual.
    let plain = http.post(addr, "/pay").await;
    assert_eq!(plain.text(), "receipt 2 for 0 bytes");
    assert!(!replayed(&plain));
}

async fn a_retry_while_the_first_runs_gets_409_with_retry_after(env: Backing) {
    let (opener, app) = app();
    let addr = replica(layer(&env.store), &app).await;
    let http = Http::new();
    let first = tokio::spawn({
        let http = http.clone();
        async move { post_key(&http, addr, "/slow", "k").await }
    });
    app.gate.until_inside(1).await;
    let retry = post_key(&http, addr, "/slow", "k").await;
    assert_eq!(retry.status, StatusCode::CONFLICT, "{retry:?}");
    assert_eq!(
        problem_type(&retry),
        "urn:tower-lease:idempotency-in-flight"
    );
    let retry_after = retry.retry_after().expect("Retry-After");
    assert!((1..=10).contains(&retry_after), "{retry_after}");
    opener.send_replace(true);
    let first = first.await.unwrap();
    assert_eq!(first.text(), "slow receipt 1");
    let later = post_key(&http, addr, "/slow", "k").await;
    assert_eq!(later.text(), "slow receipt 1");
    assert!(replayed(&later));
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

async fn under_wait_a_retry_gets_the_first_response(env: Backing) {
    let (opener, app) = app();
    let addr = replica(layer(&env.store).max_wait(Duration::from_secs(5)), &app).await;
    let http = Http::new();
    let first = tokio::spawn({
        let http = http.clone();
        async move { post_key(&http, addr, "/slow", "k").await }
    });
    app.gate.until_inside(1).await;
    let retry = tokio::spawn({
        let http = http.clone();
        async move { post_key(&http, addr, "/slow", "k").await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!retry.is_finished(), "the retry waits for the first");
    opener.send_replace(true);
    let (first, retry) = (first.await.unwrap(), retry.await.unwrap());
    assert_eq!(first.text(), "slow receipt 1");
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert_eq!(retry.text(), "slow receipt 1");
    assert!(replayed(&retry));
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

async fn waiting_retries_on_another_replica_are_woken_by_the_completion(env: Backing) {
    const RETRIES: usize = 10;
    let (opener, app) = app();
    // Both made as an application makes them: on a cluster of Redis 7 a store from
    // `connect_cluster` publishes on sharded channels, which only such a store hears.
    let publisher = env.notified().await.expect("a store with notifications");
    let one = replica(layer(&publisher), &app).await;
    let other = env.notified().await.expect("a store with notifications");
    let wait = Duration::from_secs(10);
    let two = replica(IdempotencyLayer::new(other, PAYMENTS).max_wait(wait), &app).await;
    let http = Http::new();
    let first = tokio::spawn({
        let http = http.clone();
        async move { post_key(&http, one, "/slow", "woken").await }
    });
    app.gate.until_inside(1).await;
    let retries: Vec<_> = (0..RETRIES)
        .map(|_| {
            let http = http.clone();
            tokio::spawn(async move { post_key(&http, two, "/slow", "woken").await })
        })
        .collect();
    // Every retry has looked and waits; from here on each look is counted (one `PTTL` each).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let looks_before = env.raw().command_calls("pttl").await;
    // Less than the second after which a watching retry looks anyway (a message may be lost).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let looks_waiting = env.raw().command_calls("pttl").await - looks_before;
    // Past the retries' first look of safety (a second after the last), far from the next.
    tokio::time::sleep(Duration::from_millis(500)).await;
    opener.send_replace(true);
    assert_eq!(first.await.unwrap().text(), "slow receipt 1");
    let opened = Instant::now();
    for retry in retries {
        let retry = retry.await.unwrap();
        assert_eq!(retry.text(), "slow receipt 1", "{retry:?}");
        assert!(replayed(&retry));
    }
    let answered = opened.elapsed();
    let looks = env.raw().command_calls("pttl").await - looks_before;
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    // Polling would look every 100 ms: some 50 looks while waiting. Woken by the completion,
    // the retries look once each when it comes, and none while they wait.
    assert_eq!(looks_waiting, 0, "{looks_waiting} looks while waiting");
    assert!(
        looks <= 2 * RETRIES as u64,
        "{looks} looks for {RETRIES} retries"
    );
    // One message wakes one retry, which wakes the others of its process: all in far less
    // than the second they would otherwise wait for their next look.
    assert!(
        answered < Duration::from_millis(400),
        "answered {answered:?} after the first"
    );
}

async fn the_same_key_for_another_request_gets_422(env: Backing) {
    let (_opener, app) = app();
    let addr = replica(layer(&env.store), &app).await;
    let http = Http::new();
    let key: [(&str, &[u8]); 1] = [("idempotency-key", b"k")];
    let body = |b: &'static str| Bytes::from_static(b.as_bytes());
    let first = http
        .send_body(addr, Method::POST, "/pay", &key, body("a=1"))
        .await;
    assert_eq!(first.status, StatusCode::CREATED);
    for (method, path, sent) in [
        (Method::POST, "/pay", "a=2"),
        (Method::POST, "/pay?again", "a=1"),
        (Method::PUT, "/pay", "a=1"),
    ] {
        let reply = http.send_body(addr, method, path, &key, body(sent)).await;
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{reply:?}");
        assert_eq!(
            problem_type(&reply),
            "urn:tower-lease:idempotency-key-reused"
        );
    }
    let same = http
        .send_body(addr, Method::POST, "/pay", &key, body("a=1"))
        .await;
    assert_eq!(same.text(), "receipt 1 for 3 bytes");
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

async fn missing_and_invalid_keys_get_400(env: Backing) {
    let (_opener, app) = app();
    let addr = replica(layer(&env.store).require_key(), &app).await;
    let http = Http::new();
    let missing = http.post(addr, "/pay").await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST, "{missing:?}");
    assert_eq!(
        problem_type(&missing),
        "urn:tower-lease:idempotency-key-missing"
    );
    let long = "k".repeat(256);
    let long_quoted = format!("\"{long}\"");
    for bad in [
        "",
        "\"\"",
        "\"open",
        "two words",
        "\"a\\n\"",
        &long,
        &long_quoted,
    ] {
        let reply = post_key(&http, addr, "/pay", bad).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad:?}: {reply:?}");
        assert_eq!(
            problem_type(&reply),
            "urn:tower-lease:idempotency-key-invalid"
        );
    }
    let two: [(&str, &[u8]); 2] = [("idempotency-key", b"a"), ("idempotency-key", b"b")];
    let reply = http.send(addr, Method::POST, "/pay", &two).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{reply:?}");
    assert_eq!(app.runs.load(Ordering::SeqCst), 0);
    let longest = post_key(&http, addr, "/pay", &"k".repeat(255)).await;
    assert_eq!(longest.status, StatusCode::CREATED, "{longest:?}");
}

async fn a_5xx_is_not_stored_and_the_retry_runs(env: Backing) {
    let (_opener, app) = app();
    let addr = replica(layer(&env.store), &app).await;
    let http = Http::new();
    let first = post_key(&http, addr, "/fail", "k").await;
    assert_eq!(first.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(first.text(), "attempt 1");
    let retry = post_key(&http, addr, "/fail", "k").await;
    assert_eq!(retry.status, StatusCode::OK, "{retry:?}");
    assert_eq!(retry.text(), "attempt 2");
    assert!(!replayed(&retry));
    let again = post_key(&http, addr, "/fail", "k").await;
    assert_eq!(again.text(), "attempt 2");
    assert!(replayed(&again));
    assert_eq!(app.runs.load(Ordering::SeqCst), 2);
}

async fn a_response_over_max_response_reaches_its_client_and_retries_get_410(env: Backing) {
    let (_opener, app) = app();
    let addr = replica(layer(&env.store).max_response(4096), &app).await;
    let http = Http::new();
    let first = post_key(&http, addr, "/big", "k").await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(
        first.body.len(),
        8 * 1024,
        "the first client gets all of it"
    );
    for _ in 0..2 {
        let retry = post_key(&http, addr, "/big", "k").await;
        assert_eq!(retry.status, StatusCode::GONE, "{retry:?}");
        assert_eq!(
            problem_type(&retry),
            "urn:tower-lease:idempotency-not-stored"
        );
        assert!(replayed(&retry));
        let detail = retry.problem()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains("200"), "{detail}");
    }
    assert_eq!(app.runs.load(Ordering::SeqCst), 1, "never a second run");
}

async fn a_streamed_response_within_the_limit_is_stored_whole(env: Backing) {
    let (_opener, app) = app();
    let addr = replica(layer(&env.store).max_response(4096), &app).await;
    let http = Http::new();
    let first = post_key(&http, addr, "/streamed", "k").await;
    assert_eq!(first.body.len(), 400);
    let retry = post_key(&http, addr, "/streamed", "k").await;
    assert_eq!(retry.status, StatusCode::OK, "{retry:?}");
    assert_eq!(retry.body, first.body);
    assert!(replayed(&retry));
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

async fn a_body_over_max_body_gets_413_and_reserves_nothing(env: Backing) {
    let (_opener, app) = app();
    let addr = replica(layer(&env.store).max_body(16), &app).await;
    let http = Http::new();
    let key: [(&str, &[u8]); 1] = [("idempotency-key", b"k")];
    let body = Bytes::from_static(b"0123456789abcdefXYZ");
    let reply = http.send_body(addr, Method::POST, "/pay", &key, body).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE, "{reply:?}");
    // The key is free: a request within the limit runs.
    let small = Bytes::from_static(b"ok");
    let reply = http
        .send_body(addr, Method::POST, "/pay", &key, small)
        .await;
    assert_eq!(reply.text(), "receipt 1 for 2 bytes");
}

async fn scopes_keep_equal_keys_apart(env: Backing) {
    let (_opener, app) = app();
    let scoped = layer(&env.store).scope(extract::header("x-tenant"));
    let router = Router::new()
        .route("/pay", post(pay))
        .route_layer(scoped)
        .with_state(app.clone());
    let addr = serve(router).await;
    let http = Http::new();
    let send = |tenant: &'static str| {
        let http = http.clone();
        async move {
            let headers: [(&str, &[u8]); 2] =
                [("idempotency-key", b"k"), ("x-tenant", tenant.as_bytes())];
            http.send(addr, Method::POST, "/pay", &headers).await
        }
    };
    assert_eq!(send("a:b").await.text(), "receipt 1 for 0 bytes");
    assert_eq!(send("a").await.text(), "receipt 2 for 0 bytes");
    assert_eq!(send("a:b").await.text(), "receipt 1 for 0 bytes");
    assert_eq!(send("a").await.text(), "receipt 2 for 0 bytes");
    assert_eq!(app.runs.load(Ordering::SeqCst), 2);
}

async fn two_replicas_share_keys(env: Backing) {
    let (_opener, app) = app();
    let one = replica(layer(&env.store), &app).await;
    let two = replica(layer(&env.store), &app).await;
    let http = Http::new();
    let first = post_key(&http, one, "/pay", "\"shared\"").await;
    let retry = post_key(&http, two, "/pay", "shared").await;
    assert_eq!(retry.text(), first.text());
    assert!(replayed(&retry));
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

async fn a_client_cut_mid_request_completes_and_its_retry_on_another_replica_replays(env: Backing) {
    let (opener, app) = app();
    let one = replica(layer(&env.store), &app).await;
    let two = replica(layer(&env.store).max_wait(Duration::from_secs(5)), &app).await;
    let mut stream = TcpStream::connect(one).await.unwrap();
    let request =
        "POST /slow HTTP/1.1\r\nhost: x\r\nidempotency-key: cut\r\ncontent-length: 0\r\n\r\n";
    stream.write_all(request.as_bytes()).await.unwrap();
    app.gate.until_inside(1).await;
    drop(stream);
    // The handler is not cancelled with the connection: it finishes once the gate opens.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(app.gate.inside(), 1, "the cut request was cancelled");
    opener.send_replace(true);
    let retry = post_key(&Http::new(), two, "/slow", "cut").await;
    assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
    assert_eq!(retry.text(), "slow receipt 1");
    assert!(replayed(&retry), "{retry:?}");
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

async fn a_hundred_concurrent_retries_run_the_handler_once(env: Backing) {
    let (opener, app) = app();
    let addrs = [
        replica(layer(&env.store).max_wait(Duration::from_secs(10)), &app).await,
        replica(layer(&env.store).max_wait(Duration::from_secs(10)), &app).await,
    ];
    let http = Http::new();
    let retries: Vec<_> = (0..100)
        .map(|i| {
            let http = http.clone();
            tokio::spawn(async move { post_key(&http, addrs[i % 2], "/slow", "once").await })
        })
        .collect();
    app.gate.until_inside(1).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    opener.send_replace(true);
    for retry in retries {
        let retry = retry.await.unwrap();
        assert_eq!(retry.status, StatusCode::CREATED, "{retry:?}");
        assert_eq!(retry.text(), "slow receipt 1");
    }
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

async fn a_crashed_replicas_reservation_ends_with_its_lease(env: Backing) {
    use tower_lease::backend::{Begin, LeaseRef, LockRef, Mode, Secret};
    const SHORT: Idempotency = PAYMENTS.lease(Duration::from_millis(500));
    // A replica reserved the key and died: nobody extends or ends its reservation.
    let secret = Secret::random();
    let lock = LockRef::new("payments", b":crashed", Duration::from_millis(500));
    let lease = LeaseRef::new(lock, Mode::Reservation, &secret);
    let begun = env
        .store
        .backend()
        .idempotency_begin(lease, &[0; 16])
        .await
        .unwrap();
    assert_eq!(begun, Begin::Reserved { fence: None });
    let reserved = Instant::now();
    let (_opener, app) = app();
    let addr = replica(IdempotencyLayer::new(env.store.clone(), SHORT), &app).await;
    let http = Http::new();
    let refused = post_key(&http, addr, "/pay", "crashed").await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{refused:?}");
    let (ran, _) =
        tower_lease_harness::poll(Duration::from_millis(50), Duration::from_secs(3), || {
            let http = http.clone();
            async move {
                let reply = post_key(&http, addr, "/pay", "crashed").await;
                (reply.status == StatusCode::CREATED).then_some(reply)
            }
        })
        .await
        .expect("the retry was told 409 for good");
    assert!(
        reserved.elapsed() >= Duration::from_millis(400),
        "ran before the lease ended"
    );
    assert_eq!(ran.text(), "receipt 1 for 0 bytes");
}

async fn a_key_runs_again_once_its_retention_ended(env: Backing) {
    const BRIEF: Idempotency = Idempotency::new("brief", Duration::from_millis(300));
    let (_opener, app) = app();
    let one = replica(IdempotencyLayer::new(env.store.clone(), BRIEF), &app).await;
    let two = replica(IdempotencyLayer::new(env.store.clone(), BRIEF), &app).await;
    let http = Http::new();
    assert_eq!(
        post_key(&http, one, "/pay", "k").await.text(),
        "receipt 1 for 0 bytes"
    );
    // Replayed by the replica that stored it and by one that reads it from the store.
    for addr in [one, two, one, two] {
        let retry = post_key(&http, addr, "/pay", "k").await;
        assert_eq!(retry.text(), "receipt 1 for 0 bytes");
        assert!(replayed(&retry));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Neither replica keeps a copy past the record's retention.
    let again = post_key(&http, one, "/pay", "k").await;
    assert_eq!(again.text(), "receipt 2 for 0 bytes");
    assert!(!replayed(&again));
    let replayed_again = post_key(&http, two, "/pay", "k").await;
    assert_eq!(replayed_again.text(), "receipt 2 for 0 bytes");
}
