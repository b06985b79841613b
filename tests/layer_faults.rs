//! Faults around the layer, over real TCP: a client that goes away, and a Redis that stops,
//! hangs or slows down.

mod common_http;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::post;
use bytes::Bytes;
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tower_lease::{Lock, LockLayer, RedisStore, Store, extract};

use common_http::{Env, Http, STORE_TIMEOUT, serve};
use support::proxy::{Fault, Proxy};

const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(2));

on_both_stores!(
    a_client_that_disconnects_frees_the_lock_at_once,
    a_client_that_disconnects_mid_body_frees_the_lock_at_once,
);

mod redis_only {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_stopped_answers_503_promptly_or_runs_unlocked_with_fail_open() {
        redis_stopped(Env::redis().await).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn redis_blackholed_answers_503_within_the_store_deadline() {
        redis_blackholed().await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slow_store_is_retried_until_the_lease_would_end() {
        slow_store().await
    }
}

struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// How long until `name` can be locked directly, polling every 5 ms for at most 3 s.
async fn free_after(store: &Store, name: &str) -> Duration {
    let begun = Instant::now();
    loop {
        if let Some(token) = JOBS.try_lock(store, name).await.unwrap() {
            let took = begun.elapsed();
            token.release().await.unwrap();
            return took;
        }
        assert!(begun.elapsed() < Duration::from_secs(3), "never freed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn a_client_that_disconnects_frees_the_lock_at_once(env: Env) {
    let started = Arc::new(Notify::new());
    let dropped = Arc::new(AtomicBool::new(false));
    let handler = {
        let (started, dropped) = (started.clone(), dropped.clone());
        move || async move {
            let _flag = DropFlag(dropped);
            started.notify_one();
            tokio::time::sleep(Duration::from_secs(10)).await;
            "finished"
        }
    };
    let app = Router::new()
        .route("/jobs/{id}", post(handler))
        .route_layer(LockLayer::new(
            env.store.clone(),
            JOBS,
            extract::path_segment(1),
        ));
    let addr = serve(app).await;

    let mut client = TcpStream::connect(addr).await.unwrap();
    let request = "POST /jobs/1 HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\n\r\n";
    client.write_all(request.as_bytes()).await.unwrap();
    started.notified().await;
    assert!(JOBS.try_lock(&env.store, "1").await.unwrap().is_none());
    drop(client);

    // The TTL is 2 s: only the dropped guard's release can free it this soon.
    let took = free_after(&env.store, "1").await;
    assert!(took < Duration::from_millis(200), "freed after {took:?}");
    assert!(
        dropped.load(Ordering::SeqCst),
        "the handler was not dropped"
    );
}

async fn a_client_that_disconnects_mid_body_frees_the_lock_at_once(env: Env) {
    let app = Router::new()
        .route("/jobs/{id}", post(|| async { Body::new(Endless) }))
        .route_layer(
            LockLayer::new(env.store.clone(), JOBS, extract::path_segment(1)).hold_through_body(),
        );
    let addr = serve(app).await;

    let mut client = TcpStream::connect(addr).await.unwrap();
    let request = "POST /jobs/2 HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\n\r\n";
    client.write_all(request.as_bytes()).await.unwrap();
    let mut some = [0u8; 4096];
    client.read_exact(&mut some).await.unwrap();
    assert!(some.starts_with(b"HTTP/1.1 200"));
    assert!(
        JOBS.try_lock(&env.store, "2").await.unwrap().is_none(),
        "the body holds the lease"
    );
    drop(client);

    let took = free_after(&env.store, "2").await;
    assert!(took < Duration::from_millis(200), "freed after {took:?}");
}

/// A body that never ends, one small chunk per poll.
struct Endless;

impl http_body::Body for Endless {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
            &[b'x'; 1024],
        )))))
    }
}

fn counting(store: Store, calls: &Arc<AtomicUsize>, fail_open: bool) -> Router {
    let calls = calls.clone();
    let layer = LockLayer::new(store, JOBS, extract::path_segment(1));
    let layer = if fail_open { layer.fail_open() } else { layer };
    Router::new()
        .route(
            "/jobs/{id}",
            post(move || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                "ran"
            }),
        )
        .route_layer(layer)
}

async fn redis_stopped(mut env: Env) {
    let calls = Arc::new(AtomicUsize::new(0));
    let closed = serve(counting(env.store.clone(), &calls, false)).await;
    let open = serve(counting(env.store.clone(), &calls, true)).await;
    let http = Http::new();
    assert_eq!(http.post(closed, "/jobs/1").await.status, StatusCode::OK);

    env.server.as_mut().unwrap().stop();
    for _ in 0..3 {
        let begun = Instant::now();
        let reply = http.post(closed, "/jobs/1").await;
        let took = begun.elapsed();
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
        assert_eq!(reply.retry_after(), Some(1));
        assert_eq!(
            reply.problem()["type"],
            "urn:tower-lease:lock-store-unavailable"
        );
        assert!(
            took < STORE_TIMEOUT + Duration::from_secs(1),
            "took {took:?}"
        );
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "a fail-closed request ran");

    let reply = http.post(open, "/jobs/1").await;
    assert_eq!((reply.status, reply.text()), (StatusCode::OK, "ran"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

async fn redis_blackholed() {
    let server = support::RedisServer::start();
    let proxy = Proxy::to_port(server.port()).await;
    let conn = proxy
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let store: Store = RedisStore::new(conn).timeout(STORE_TIMEOUT).into();
    let calls = Arc::new(AtomicUsize::new(0));
    let addr = serve(counting(store, &calls, false)).await;
    let http = Http::new();
    assert_eq!(http.post(addr, "/jobs/1").await.status, StatusCode::OK);

    proxy.set(Fault::Blackhole);
    let begun = Instant::now();
    let reply = http.post(addr, "/jobs/2").await;
    let took = begun.elapsed();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(
        reply.problem()["type"],
        "urn:tower-lease:lock-store-unavailable"
    );
    assert!(
        took >= STORE_TIMEOUT,
        "answered before the deadline: {took:?}"
    );
    assert!(
        took < STORE_TIMEOUT + Duration::from_secs(1),
        "took {took:?}"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

async fn slow_store() {
    let server = support::RedisServer::start();
    let proxy = Proxy::to_port(server.port()).await;
    let conn = proxy
        .client()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let store: Store = RedisStore::new(conn).timeout(STORE_TIMEOUT).into();
    let started = Arc::new(Notify::new());
    let handler = {
        let started = started.clone();
        move || async move {
            started.notify_one();
            tokio::time::sleep(Duration::from_millis(2500)).await;
            "finished"
        }
    };
    let app = Router::new()
        .route("/jobs/{id}", post(handler))
        .route_layer(LockLayer::new(store, JOBS, extract::path_segment(1)));
    let addr = serve(app).await;

    // A hiccup: the first extend (at ~667 ms) times out, a retry gets through well before the
    // 2 s lease would end.
    let reply = tokio::spawn(async move { Http::new().post(addr, "/jobs/1").await });
    started.notified().await;
    proxy.set(Fault::Delay(Duration::from_millis(700)));
    tokio::time::sleep(Duration::from_millis(900)).await;
    proxy.set(Fault::Pass);
    let reply = reply.await.unwrap();
    assert_eq!((reply.status, reply.text()), (StatusCode::OK, "finished"));

    // An outage longer than the lease: lost once the lease would have ended.
    let reply = tokio::spawn(async move { Http::new().post(addr, "/jobs/2").await });
    started.notified().await;
    let slowed = Instant::now();
    proxy.set(Fault::Delay(Duration::from_secs(10)));
    let reply = reply.await.unwrap();
    let took = slowed.elapsed();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(reply.problem()["type"], "urn:tower-lease:lease-lost");
    assert!(
        took < JOBS.ttl() + Duration::from_millis(500),
        "lost after {took:?}"
    );
}
