//! A locked route beside `/metrics` in the Prometheus text format: drives some contended load
//! through the layer, then prints what an operator's scrape sees.
//!
//! ```sh
//! cargo run --example metrics --features metrics
//! ADDR=127.0.0.1:8080 REDIS_URL=redis://127.0.0.1:6379/ cargo run --example metrics --features metrics
//! ```
//!
//! With `ADDR` set it keeps serving after the load, so `curl $ADDR/metrics` shows the numbers move.

use std::time::Duration;

use axum::Router;
use axum::routing::{get, post};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tower_lease::{Lock, LockLayer, RedisStore, Store, extract};

const REPORTS: Lock<str> = Lock::new("report", Duration::from_secs(5));

async fn build_report() -> &'static str {
    tokio::time::sleep(Duration::from_millis(20)).await;
    "built"
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Install the exporter before the first lock is taken: metrics recorded earlier go nowhere.
    let prometheus: PrometheusHandle = PrometheusBuilder::new().install_recorder()?;

    let store: Store = match std::env::var("REDIS_URL") {
        Ok(url) => RedisStore::connect(&url).await?.into(),
        Err(_) => Store::memory(),
    };
    let app = Router::new()
        .route("/reports/{id}", post(build_report))
        .route_layer(LockLayer::new(store, REPORTS, extract::path_segment(1)))
        .route(
            "/metrics",
            get(move || std::future::ready(prometheus.render())),
        );

    let addr = std::env::var("ADDR").unwrap_or_else(|_| "127.0.0.1:0".to_owned());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let local = listener.local_addr()?;
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    // 200 requests from 20 clients on 5 report names: some build, some find the lock held.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<bytes::Bytes>>();
    let mut clients = Vec::new();
    for c in 0..20 {
        let client = client.clone();
        clients.push(tokio::spawn(async move {
            for i in 0..10 {
                let uri = format!("http://{local}/reports/r{}", (c + i) % 5);
                let req = http::Request::post(uri).body(Default::default()).unwrap();
                let _ = client.request(req).await;
            }
        }));
    }
    for c in clients {
        c.await?;
    }

    let uri: http::Uri = format!("http://{local}/metrics").parse()?;
    let scrape = client.get(uri).await?;
    let scrape = http_body_util::BodyExt::collect(scrape.into_body()).await?;
    println!("{}", String::from_utf8_lossy(&scrape.to_bytes()));

    if std::env::var("ADDR").is_ok() {
        println!("serving on http://{local} (GET /metrics, POST /reports/{{id}})");
        server.await??;
    }
    Ok(())
}
