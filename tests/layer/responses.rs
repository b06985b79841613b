//! The layer's answers over real TCP, on Redis and in memory: held (409/423), pass-through,
//! invalid names (400), and release before the response.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use http::{Method, StatusCode};
use tower_lease::store::KeyRole;
use tower_lease::{Lock, LockLayer, extract};

use tower_lease_harness::Backing;
use tower_lease_harness::http::{Http, count, serve};

const INVOICE: Lock<str> = Lock::new("invoice", Duration::from_millis(2500));
const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(5));

tower_lease_harness::store_tests!(
    Layer: [
        busy_answers_409_or_423_with_retry_after_and_never_calls_the_handler,
        no_name_passes_through_and_invalid_names_get_400,
        the_next_request_finds_the_lock_free,
        the_next_request_finds_the_lock_free_after_a_held_body,
    ]
);

fn invoices(layer: LockLayer<extract::PathSegment>, calls: &Arc<AtomicUsize>) -> Router {
    Router::new()
        .route("/invoices/{id}/finalize", post(count))
        .route_layer(layer)
        .with_state(calls.clone())
}

async fn busy_answers_409_or_423_with_retry_after_and_never_calls_the_handler(env: Backing) {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = LockLayer::new(env.store.clone(), INVOICE, extract::path_segment(1));
    let conflict = serve(invoices(layer.clone(), &calls)).await;
    let locked = serve(invoices(layer.busy_status(StatusCode::LOCKED), &calls)).await;
    let http = Http::new();

    let taken = Instant::now();
    let holder = INVOICE
        .try_lock(&env.store, "42")
        .await
        .unwrap()
        .expect("free at first");
    for (addr, status) in [
        (conflict, StatusCode::CONFLICT),
        (locked, StatusCode::LOCKED),
    ] {
        let reply = http.post(addr, "/invoices/42/finalize").await;
        assert_eq!(reply.status, status, "{reply:?}");
        let problem = reply.problem();
        assert_eq!(problem["type"], "urn:tower-lease:lock-busy");
        assert_eq!(problem["namespace"], "invoice");

        // The holder's lease has between 2.5 s − elapsed and 2.5 s left: rounded up.
        let elapsed = taken.elapsed().as_secs_f64();
        let lowest = (2.5 - elapsed).ceil().max(1.0) as u64;
        let retry_after = reply.retry_after().expect("a Retry-After header");
        assert!(
            (lowest..=3).contains(&retry_after),
            "Retry-After {retry_after} after {elapsed} s"
        );

        if env.is_redis() {
            let token = env
                .raw()
                .get(KeyRole::Lock, "invoice", b"42")
                .await
                .expect("the holder's key");
            let hex: String = token.iter().map(|b| format!("{b:02x}")).collect();
            assert!(
                !reply.text().contains(&hex),
                "the token leaked: {}",
                reply.text()
            );
            assert!(
                !reply
                    .body
                    .windows(token.len())
                    .any(|w| w == token.as_slice())
            );
        }
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        0,
        "the handler ran while the lock was held"
    );

    // Another name is not held, and the same name is free once released.
    assert_eq!(
        http.post(conflict, "/invoices/43/finalize").await.status,
        StatusCode::OK
    );
    assert!(holder.release().await.unwrap());
    assert_eq!(
        http.post(locked, "/invoices/42/finalize").await.status,
        StatusCode::OK
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

async fn no_name_passes_through_and_invalid_names_get_400(env: Backing) {
    let calls = Arc::new(AtomicUsize::new(0));
    let by_header = LockLayer::new(env.store.clone(), JOBS, extract::header("x-job"));
    let app = Router::new()
        .route("/run", post(count))
        .route_layer(by_header)
        .with_state(calls.clone());
    let jobs = serve(app).await;
    let by_segment = LockLayer::new(env.store.clone(), INVOICE, extract::path_segment(1));
    let invoices = serve(invoices(by_segment, &calls)).await;
    let http = Http::new();
    let run = |headers: &'static [(&'static str, &'static [u8])]| {
        let http = http.clone();
        async move { http.send(jobs, Method::POST, "/run", headers).await }
    };

    let _held = JOBS.try_lock(&env.store, "report").await.unwrap().unwrap();
    assert_eq!(
        run(&[("x-job", b"report")]).await.status,
        StatusCode::CONFLICT
    );
    // No header, no name: not locked, even while "report" is held.
    let reply = run(&[]).await;
    assert_eq!((reply.status, reply.text()), (StatusCode::OK, "done"));
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Empty and over-long names are refused before the store is asked.
    let before = calls.load(Ordering::SeqCst);
    let reply = run(&[("x-job", b"")]).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{reply:?}");
    assert_eq!(reply.problem()["type"], "urn:tower-lease:invalid-lock-name");
    let long = "x".repeat(1025);
    let reply = http
        .send(jobs, Method::POST, "/run", &[("x-job", long.as_bytes())])
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{reply:?}");
    assert!(reply.problem()["detail"].as_str().unwrap().contains("1025"));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        before,
        "a refused request reached the handler"
    );
    let longest = "x".repeat(1024);
    let reply = http
        .send(jobs, Method::POST, "/run", &[("x-job", longest.as_bytes())])
        .await;
    assert_eq!(reply.status, StatusCode::OK);

    // By default a name must be text: NUL, a brace or bytes that are not UTF-8 get 400.
    for (odd, what) in [
        ("/invoices/a%00b/finalize", "control character"),
        ("/invoices/%7Ba%7D/finalize", "brace"),
        ("/invoices/%FF%FE/finalize", "UTF-8"),
    ] {
        let reply = http.post(invoices, odd).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{odd}: {reply:?}");
        let detail = reply.problem()["detail"].as_str().unwrap().to_owned();
        assert!(detail.contains(what), "{odd}: {detail}");
    }
    assert_eq!(
        calls.load(Ordering::SeqCst),
        before + 1,
        "a refused request ran"
    );

    // With `binary_names`, percent-encoded bytes reach the lock as raw bytes.
    let binary = LockLayer::new(env.store.clone(), INVOICE, extract::path_segment(1));
    let binary = serve(self::invoices(binary.binary_names(), &calls)).await;
    let odd = "/invoices/%00%7B%FF/finalize";
    assert_eq!(http.post(binary, odd).await.status, StatusCode::OK);
    let name: &[u8] = b"\0{\xff";
    let held = Lock::<[u8]>::new("invoice", Duration::from_secs(2))
        .try_lock(&env.store, name)
        .await
        .unwrap()
        .expect("the layer released it");
    assert_eq!(http.post(binary, odd).await.status, StatusCode::CONFLICT);
    held.release().await.unwrap();
}

/// 40 requests in a row on one name, alternating between two replicas behind `layer`: each
/// finds the lock free, so the layer released it before the client had the response.
async fn forty_requests_in_a_row(env: &Backing, layer: LockLayer<extract::PathSegment>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let replicas = [
        serve(invoices(layer.clone(), &calls)).await,
        serve(invoices(layer, &calls)).await,
    ];
    let http = Http::new();
    for i in 0..40 {
        let reply = http.post(replicas[i % 2], "/invoices/7/finalize").await;
        assert_eq!(reply.status, StatusCode::OK, "request {i}: {reply:?}");
        assert_eq!(reply.text(), "done");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 40);
    assert!(INVOICE.try_lock(&env.store, "7").await.unwrap().is_some());
}

async fn the_next_request_finds_the_lock_free(env: Backing) {
    let layer = LockLayer::new(env.store.clone(), INVOICE, extract::path_segment(1));
    forty_requests_in_a_row(&env, layer).await;
}

async fn the_next_request_finds_the_lock_free_after_a_held_body(env: Backing) {
    let layer =
        LockLayer::new(env.store.clone(), INVOICE, extract::path_segment(1)).hold_through_body();
    forty_requests_in_a_row(&env, layer).await;
}
