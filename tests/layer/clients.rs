//! What clients that retry by themselves see, with a stock one (`reqwest-retry`'s transient
//! policy) over real TCP: a busy `503` is retried to success, a `409` is not, and `Retry-After`
//! on a busy name is the wait the layer has seen holds take, not the holder's whole lease.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::Query;
use axum::routing::post;
use http::StatusCode;
use reqwest_middleware::{ClientBuilder, ClientWithMiddleware};
use reqwest_retry::RetryTransientMiddleware;
use reqwest_retry::policies::ExponentialBackoff;
use tokio::sync::{Notify, watch};
use tower_lease::{Lock, LockLayer, Semaphore, SemaphoreLayer, extract};

use tower_lease_harness::http::{Http, serve};
use tower_lease_harness::{Backing, Holders};

/// Long, so a `Retry-After` of the whole lease would say 5.
const REPORT: Lock<str> = Lock::new("report", Duration::from_secs(5));
const EXPORT: Semaphore<str> = Semaphore::new("export-slot", 1, Duration::from_secs(5));

tower_lease_harness::store_tests!(
    Layer: [
        a_stock_client_retries_a_busy_503_to_success_and_never_a_409,
        retry_after_is_the_wait_holds_took_lately_not_the_lease,
        a_full_semaphore_answers_the_wait_holds_took_lately,
    ]
);

/// A client that retries what `reqwest-retry` calls transient (`5xx`, `408`, `429`, connection
/// errors), backing off from 100 ms, as a service would configure it.
fn retrying_client() -> ClientWithMiddleware {
    let policy = ExponentialBackoff::builder()
        .retry_bounds(Duration::from_millis(100), Duration::from_millis(400))
        .build_with_max_retries(8);
    ClientBuilder::new(reqwest::Client::new())
        .with(RetryTransientMiddleware::new_with_policy(policy))
        .build()
}

/// A service of `/reports/{id}` under `layer`: every request counts in `asked` (refusals
/// too) and every handler in `holders`. A handler asked with `?hold` tells `started` and waits
/// for the test to open the gate; one asked with `?ms=N` works N ms.
struct App {
    addr: std::net::SocketAddr,
    asked: Arc<AtomicUsize>,
    holders: Holders,
    started: Arc<Notify>,
    gate: watch::Sender<bool>,
}

async fn app<L>(layer: L) -> App
where
    L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
    L::Service: tower::Service<axum::extract::Request, Error = std::convert::Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    <L::Service as tower::Service<axum::extract::Request>>::Response:
        axum::response::IntoResponse + 'static,
    <L::Service as tower::Service<axum::extract::Request>>::Future: Send + 'static,
{
    let asked: Arc<AtomicUsize> = Arc::default();
    let (holders, started) = (Holders::default(), Arc::new(Notify::new()));
    let (gate, opened) = watch::channel(false);
    let handler = {
        let (holders, started) = (holders.clone(), started.clone());
        move |Query(work): Query<HashMap<String, String>>| async move {
            let _inside = holders.enter();
            if work.contains_key("hold") {
                started.notify_one();
                let mut opened = opened.clone();
                let _ = opened.wait_for(|open| *open).await;
            }
            let ms = work.get("ms").map_or(0, |ms| ms.parse().unwrap());
            tokio::time::sleep(Duration::from_millis(ms)).await;
            "done"
        }
    };
    let counted = asked.clone();
    let router = Router::new()
        .route("/reports/{id}", post(handler))
        .route_layer(layer)
        .layer(tower::util::MapRequestLayer::new(
            move |req: axum::extract::Request| {
                counted.fetch_add(1, Ordering::SeqCst);
                req
            },
        ));
    App {
        addr: serve(router).await,
        asked,
        holders,
        started,
        gate,
    }
}

impl App {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Starts a request that holds `id` until [`done`](Self::done); answers once its handler
    /// runs.
    async fn hold(&self, id: &str) -> tokio::task::JoinHandle<StatusCode> {
        self.gate.send_replace(false);
        let url = self.url(&format!("/reports/{id}?hold=1"));
        let holder = tokio::spawn(async move {
            let reply = reqwest::Client::new().post(url).send().await.unwrap();
            reply.status()
        });
        self.started.notified().await;
        holder
    }

    /// Lets the holder finish, and checks it was answered 200.
    async fn done(&self, holder: tokio::task::JoinHandle<StatusCode>) {
        self.gate.send_replace(true);
        assert_eq!(holder.await.unwrap(), StatusCode::OK);
    }

    fn asked(&self) -> usize {
        self.asked.load(Ordering::SeqCst)
    }
}

async fn a_stock_client_retries_a_busy_503_to_success_and_never_a_409(env: Backing) {
    let layer = LockLayer::new(env.store.clone(), REPORT, extract::path_segment(1));
    let client = retrying_client();

    // Busy answers 503: the client retries until the holder is done.
    let unavailable = app(layer.clone().busy_status(StatusCode::SERVICE_UNAVAILABLE)).await;
    let holder = unavailable.hold("1").await;
    let asked = unavailable.asked();
    let retried = tokio::spawn(client.post(unavailable.url("/reports/1")).send());
    // Refused at least once while the holder works, then let go.
    let every = Duration::from_millis(10);
    let refused = tower_lease_harness::poll(every, Duration::from_secs(5), || async {
        (unavailable.asked() > asked).then_some(())
    });
    assert!(refused.await.is_some(), "the client never asked");
    // A retry or two while the holder works.
    tokio::time::sleep(Duration::from_millis(300)).await;
    unavailable.done(holder).await;
    let reply = retried.await.unwrap().unwrap();
    assert_eq!(reply.status(), StatusCode::OK, "retried to success");
    assert_eq!(reply.text().await.unwrap(), "done");
    let tries = unavailable.asked() - asked;
    assert!(tries >= 2, "{tries} tries: the client never saw the 503");
    assert_eq!(unavailable.holders.most(), 1, "two handlers inside at once");

    // Busy answers 409 (the default): the client gives up at once, as it should for a
    // conflict, and the user sees it.
    let conflict = app(layer).await;
    let holder = conflict.hold("2").await;
    let asked = conflict.asked();
    let reply = client
        .post(conflict.url("/reports/2"))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), StatusCode::CONFLICT);
    assert!(reply.headers().contains_key(http::header::RETRY_AFTER));
    assert_eq!(conflict.asked() - asked, 1, "a 409 was retried");
    conflict.done(holder).await;
}

async fn retry_after_is_the_wait_holds_took_lately_not_the_lease(env: Backing) {
    let layer = LockLayer::new(env.store.clone(), REPORT, extract::path_segment(1));
    let app = app(layer).await;
    let http = Http::new();
    // Before any hold was seen, the holder's remaining lease is all the layer knows.
    let holder = app.hold("first").await;
    let reply = http.post(app.addr, "/reports/first").await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
    assert!(reply.retry_after() >= Some(4), "{reply:?}");
    app.done(holder).await;

    // Jobs of about 30 ms: a client waits a second, not the 5 s lease.
    for id in 0..8 {
        let reply = http.post(app.addr, &format!("/reports/{id}?ms=30")).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    }
    let holder = app.hold("a").await;
    let reply = http.post(app.addr, "/reports/a").await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
    assert_eq!(reply.retry_after(), Some(1), "{reply:?}");
    assert_eq!(reply.problem()["type"], "urn:tower-lease:lock-busy");
    app.done(holder).await;

    // Holds of 1.2 s lately (three at once, on other names): two seconds, as whole seconds
    // round up, still under the lease.
    let slow = (0..3).map(|id| {
        let http = http.clone();
        let addr = app.addr;
        tokio::spawn(async move { http.post(addr, &format!("/reports/slow{id}?ms=1200")).await })
    });
    for slow in slow.collect::<Vec<_>>() {
        let slow = slow.await.unwrap();
        assert_eq!(slow.status, StatusCode::OK, "{slow:?}");
    }
    let holder = app.hold("b").await;
    let reply = http.post(app.addr, "/reports/b").await;
    assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
    assert_eq!(reply.retry_after(), Some(2), "{reply:?}");
    app.done(holder).await;
}

async fn a_full_semaphore_answers_the_wait_holds_took_lately(env: Backing) {
    let layer = SemaphoreLayer::new(env.store.clone(), EXPORT, extract::path_segment(1));
    let app = app(layer).await;
    let http = Http::new();
    for _ in 0..4 {
        let reply = http.post(app.addr, "/reports/x?ms=30").await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    }
    let holder = app.hold("x").await;
    let reply = http.post(app.addr, "/reports/x").await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{reply:?}");
    assert_eq!(reply.retry_after(), Some(1), "{reply:?}");
    app.done(holder).await;
}
