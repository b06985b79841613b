//! `LockLayer` over HTTP on `PgStore`: two replicas (two stores on one database, two axum
//! servers on 127.0.0.1:0), a real HTTP client. A name held by a request on one replica is
//! refused on the other (`409` with `Retry-After`), other names run, and the next request
//! after a response finds the lock free.

use crate::support;

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use tower_lease::{Lock, LockLayer, Store, extract};
use tower_lease_testkit::Holders;

const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(5));

/// Works for `x-work-ms`, inside the count of handlers holding the job.
async fn work(State(holders): State<Holders>, headers: HeaderMap) -> &'static str {
    let _inside = holders.enter();
    let ms = headers
        .get("x-work-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    "done"
}

async fn replica(store: Store, holders: Holders) -> SocketAddr {
    let app = Router::new()
        .route(
            "/jobs/{id}",
            post(work).route_layer(LockLayer::new(store, JOBS, extract::path_segment(1))),
        )
        .with_state(holders);
    tower_lease_harness::http::serve(app).await
}

async fn post_job(addr: SocketAddr, id: &str, work_ms: u64) -> (u16, Option<String>) {
    let reply = reqwest::Client::new()
        .post(format!("http://{addr}/jobs/{id}"))
        .header("x-work-ms", work_ms.to_string())
        .send()
        .await
        .unwrap();
    let retry_after = reply
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (reply.status().as_u16(), retry_after)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_held_on_one_replica_is_refused_on_the_other() {
    let server = support::server().await;
    let holders = Holders::default();
    let a = replica(support::pg_store(&server).await.into(), holders.clone()).await;
    let b = replica(support::pg_store(&server).await.into(), holders.clone()).await;

    let first = tokio::spawn(post_job(a, "7", 800));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, retry_after) = post_job(b, "7", 0).await;
    assert_eq!(status, 409);
    assert!(retry_after.is_some(), "a refusal says when to retry");
    assert_eq!(post_job(b, "8", 0).await.0, 200, "another name runs");
    assert_eq!(first.await.unwrap().0, 200);
    // Released before the response went out: the client's next request, anywhere, runs.
    assert_eq!(post_job(b, "7", 0).await.0, 200);
    assert_eq!(post_job(a, "7", 0).await.0, 200);
    assert_eq!(support::live_leases(&server.url()).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_requests_on_two_replicas_never_overlap() {
    let server = support::server().await;
    let holders = Holders::default();
    let replicas = [
        replica(support::pg_store(&server).await.into(), holders.clone()).await,
        replica(support::pg_store(&server).await.into(), holders.clone()).await,
    ];
    let requests = (0..40).map(|i| post_job(replicas[i % 2], "one", 20));
    let answers = futures_util::future::join_all(requests).await;
    let ran = answers.iter().filter(|(status, _)| *status == 200).count();
    let refused = answers.iter().filter(|(status, _)| *status == 409).count();
    assert_eq!(ran + refused, answers.len(), "{answers:?}");
    assert!(ran >= 1);
    assert_eq!(holders.most(), 1, "two requests held the name at once");
    assert_eq!(support::live_leases(&server.url()).await, 0);
}
