//! The layer's options for what a first production user needs, over real TCP: a required name,
//! names from several path segments, locks of any name type, and a bounded wait for the release.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::post;
use http::{Request, StatusCode};
use tower_lease::{Lock, LockLayer, RedisStore, Store, extract};

use tower_lease_harness::http::{Http, count, serve};
use tower_lease_harness::proxy::{Fault, Proxy};
use tower_lease_harness::{Backing, Endpoint, RedisServer};

const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(5));
const SEATS: Lock<str> = Lock::new("seat", Duration::from_secs(5));
const INVOICES: Lock<u64> = Lock::new("invoice", Duration::from_secs(5));

tower_lease_harness::store_tests!(
    Layer: [
        require_name_answers_400_to_a_request_without_one,
        path_segments_lock_on_two_segments_and_refuse_an_empty_one,
        a_layer_takes_a_lock_of_any_name_type,
        on_rejection_takes_an_axum_applications_own_error_type,
    ]
);

/// Every path runs `count` behind `$layer`.
macro_rules! everywhere {
    ($layer:expr, $calls:expr) => {
        Router::new()
            .fallback(count)
            .layer($layer)
            .with_state($calls.clone())
    };
}

async fn require_name_answers_400_to_a_request_without_one(env: Backing) {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = LockLayer::new(env.store.clone(), JOBS, extract::header("x-job"));
    let optional = serve(everywhere!(layer.clone(), calls)).await;
    let required = serve(everywhere!(layer.require_name(), calls)).await;
    let http = Http::new();

    // By default a request without a name runs unlocked.
    assert_eq!(http.post(optional, "/run").await.status, StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    let reply = http.post(required, "/run").await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{reply:?}");
    assert_eq!(reply.problem()["type"], "urn:tower-lease:missing-lock-name");
    assert_eq!(calls.load(Ordering::SeqCst), 1, "the handler did not run");

    let named = http
        .send(
            required,
            http::Method::POST,
            "/run",
            &[("x-job", b"report")],
        )
        .await;
    assert_eq!(named.status, StatusCode::OK, "{named:?}");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

async fn path_segments_lock_on_two_segments_and_refuse_an_empty_one(env: Backing) {
    let calls = Arc::new(AtomicUsize::new(0));
    let layer = LockLayer::new(env.store.clone(), SEATS, extract::path_segments([1, 3]));
    let addr = serve(everywhere!(layer, calls)).await;
    let http = Http::new();

    let holder = SEATS
        .try_lock(&env.store, "gala/12")
        .await
        .unwrap()
        .unwrap();
    let reply = http.post(addr, "/events/gala/seats/12/buy").await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
    let reply = http.post(addr, "/events/gala/seats/13/buy").await;
    assert_eq!(reply.status, StatusCode::OK, "another seat: {reply:?}");
    let reply = http.post(addr, "/events/gala2/seats/12/buy").await;
    assert_eq!(reply.status, StatusCode::OK, "another event: {reply:?}");

    for empty in ["/events//seats/12/buy", "/events/gala/seats//buy"] {
        let reply = http.post(addr, empty).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{empty}: {reply:?}");
        assert_eq!(reply.problem()["type"], "urn:tower-lease:invalid-lock-name");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(holder.release().await.unwrap());
}

async fn a_layer_takes_a_lock_of_any_name_type(env: Backing) {
    let calls = Arc::new(AtomicUsize::new(0));
    let invoice_id = |req: &Request<axum::body::Body>| -> Option<u64> {
        req.uri().path().strip_prefix("/invoices/")?.parse().ok()
    };
    let layer = LockLayer::new(env.store.clone(), INVOICES, invoice_id);
    let addr = serve(everywhere!(layer, calls)).await;
    let http = Http::new();

    // The layer and a direct caller of the typed lock meet on the same names.
    let holder = INVOICES.try_lock(&env.store, &42).await.unwrap().unwrap();
    let reply = http.post(addr, "/invoices/42").await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
    assert_eq!(http.post(addr, "/invoices/43").await.status, StatusCode::OK);
    assert!(holder.release().await.unwrap());
    assert_eq!(http.post(addr, "/invoices/42").await.status, StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// The store stops answering while the handler runs, so the release after it hangs until the
/// store's timeout (2 s here). With a `max_release_wait` of 200 ms the response comes at once
/// anyway; with one longer than the timeout it waits the timeout out, which shows the bound
/// is what makes the difference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_wait_bounds_how_long_a_hung_release_delays_the_response() {
    const TIMEOUT: Duration = Duration::from_secs(2);
    let server = RedisServer::start();
    let proxy = Arc::new(Proxy::to(&server).await);
    // redis-rs's own response timeout must not cut the store's timeout short here.
    let config = ::redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(TIMEOUT * 2))
        .set_max_delay(Duration::from_millis(50));
    let conn = ::redis::aio::ConnectionManager::new_with_config(proxy.client(), config)
        .await
        .unwrap();
    let store: Store = RedisStore::new(conn).timeout(TIMEOUT).into();
    let handler = {
        let proxy = proxy.clone();
        move || async move {
            proxy.set(Fault::Blackhole);
            "done"
        }
    };
    let app = |wait: Duration| {
        let layer = LockLayer::new(store.clone(), JOBS, extract::path_segment(1));
        Router::new()
            .route("/jobs/{id}", post(handler.clone()))
            .route_layer(layer.max_release_wait(wait))
    };
    let bounded = serve(app(Duration::from_millis(200))).await;
    let unbounded = serve(app(Duration::from_secs(10))).await;
    let http = Http::new();

    let begun = Instant::now();
    let reply = http.post(bounded, "/jobs/1").await;
    let bounded_took = begun.elapsed();
    assert_eq!((reply.status, reply.text()), (StatusCode::OK, "done"));
    assert!(
        bounded_took < Duration::from_millis(1200),
        "a hung release held the response for {bounded_took:?}"
    );

    // The proxy keeps dropping everything; reset the connection so the next request can
    // acquire, then let the handler blackhole it again.
    proxy.set(Fault::Pass);
    proxy.sever();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let begun = Instant::now();
    let reply = http.post(unbounded, "/jobs/2").await;
    let unbounded_took = begun.elapsed();
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert!(
        unbounded_took >= TIMEOUT,
        "without the bound the store's timeout is waited out: {unbounded_took:?}"
    );
}

/// An application's `IntoResponse` error type, as its handlers return it.
enum AppError {
    Busy,
    Other(StatusCode),
}

impl axum::response::IntoResponse for AppError {
    fn into_response(self) -> axum::response::Response {
        match self {
            AppError::Busy => (StatusCode::CONFLICT, "app: busy, try later").into_response(),
            AppError::Other(status) => (status, "app: failed").into_response(),
        }
    }
}

/// `on_rejection` takes a hook that answers `axum::response::Response` (axum's own body), so the
/// layer's refusals come out in the application's format.
async fn on_rejection_takes_an_axum_applications_own_error_type(env: Backing) {
    use axum::response::IntoResponse;
    let render = |rejection: &tower_lease::rejection::Rejection| match rejection.reason() {
        tower_lease::rejection::Reason::Busy { .. } => AppError::Busy.into_response(),
        _ => AppError::Other(rejection.status()).into_response(),
    };
    let layer = LockLayer::new(env.store.clone(), SEATS, extract::path_segment(1));
    let app = Router::new()
        .route("/seats/{id}", post(count))
        .route_layer(layer.on_rejection(render))
        .with_state(Arc::new(AtomicUsize::new(0)));
    let addr = serve(app).await;
    let holder = SEATS.try_lock(&env.store, "9").await.unwrap().unwrap();
    let reply = Http::new().post(addr, "/seats/9").await;
    assert_eq!(reply.status, StatusCode::CONFLICT);
    assert_eq!(reply.text(), "app: busy, try later");
    assert!(holder.release().await.unwrap());
    let bad = Http::new().post(addr, "/seats/%00").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(bad.text(), "app: failed");
}
