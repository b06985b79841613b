//! The layer over HTTP as a client: one process serves an axum app whose routes take the same
//! locks as the other clients through `LockLayer` (`PUT /lock/{name}`) and `RwLockLayer`
//! (`GET /doc/{name}` shares, `PUT` excludes), and another sends it requests.
//!
//! The handler, run while the layer holds the lease, records its own holding (from its first
//! poll to the last time it saw `Lease::is_held`) and writes the request's fence to the
//! register at each step. The driver records each request with what came back: `200` ok,
//! `409`/`423`/`429` fail (the layer refused it), `503`, a timeout or a connection error
//! unknown. The checker claims for a request only the handler's own holding: the layer took the
//! lease between the request's sending and the handler's first poll (a read that shares a
//! lease may join one taken before), and a `503` for a lost
//! lease may come after the lease ended, so neither the driver's times nor its outcome bound
//! the holding; the fenced register protects the write either way.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Extension, Path, State};
use axum::routing::{get, put};
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tower_lease::backend::Mode;
use tower_lease::{Lease, LockLayer, RwLockLayer, extract};

use crate::connect::{Locks, connect, scaled};
use crate::record::{Hold, now_us, op};
use crate::worker::{LOCK_NAMES, RW_NAME, docs, lock, outcome, register, wait, write};

/// A request's process in the history: its own, as it holds a lease of its own.
pub const REQUEST_PROCESS: u64 = 1_000_000;

/// The serving process.
pub struct Server {
    pub locks: Locks,
    pub register_url: String,
    pub port: u16,
    pub secs: u64,
    pub broken_lock: bool,
    pub ttl: Duration,
}

struct App {
    register: redis::aio::ConnectionManager,
    lines: Mutex<Vec<Value>>,
    ttl: Duration,
}

impl Server {
    /// Serves until `SIGTERM` (sent once the driver is done) or long past `secs`, then writes
    /// the handlers' lines.
    pub async fn run(self, out: &mut impl Write) {
        let store = connect(&self.locks, self.ttl, self.broken_lock).await;
        let app = Arc::new(App {
            register: register(&self.register_url).await,
            lines: Mutex::new(Vec::new()),
            ttl: self.ttl,
        });
        let wait = wait(self.ttl);
        let router = Router::new()
            .route(
                "/lock/{name}",
                put(handle).route_layer(
                    LockLayer::new(store.clone(), lock(self.ttl), extract::path_segment(1))
                        .max_wait(wait),
                ),
            )
            .route(
                "/doc/{name}",
                get(handle).put(handle).route_layer(
                    RwLockLayer::new(store, docs(self.ttl), extract::path_segment(1))
                        .max_wait(wait),
                ),
            )
            .with_state(app.clone());
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], self.port)))
            .await
            .expect("the HTTP client's port");
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("a SIGTERM handler");
        let serving = axum::serve(listener, router).with_graceful_shutdown(async move {
            terminate.recv().await;
        });
        let until = Duration::from_secs(self.secs + 120);
        let _ = tokio::time::timeout(until, serving).await;
        for line in app.lines.lock().expect("the lines").iter() {
            writeln!(out, "{line}").expect("history file");
        }
    }
}

/// The handler of every route: one to four steps under the request's lease.
async fn handle(
    State(app): State<Arc<App>>,
    Extension(lease): Extension<Lease>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> StatusCode {
    let header = |h: &str| -> u64 {
        let value = headers.get(h).and_then(|v| v.to_str().ok());
        value.and_then(|v| v.parse().ok()).unwrap_or(0)
    };
    let request = header("x-request");
    let kind = match lease.mode() {
        Mode::Read => "read",
        Mode::Write => "write",
        _ => "lock",
    };
    let exclusive = kind != "read";
    let fence = lease.fence().unwrap_or(0);
    // Written when the handler ends, or when the layer drops it for a lost lease.
    let mut record = Record {
        app: app.clone(),
        request,
        hold: Hold {
            process: REQUEST_PROCESS + request,
            kind: kind.to_owned(),
            name: name.clone(),
            fence,
            // The driver's sending: the layer's acquisition went out after it.
            invoked: header("x-invoked"),
            acquired: now_us(),
            confirmed: 0,
            release_invoked: 0,
            released: None,
            served: true,
        },
        writes: Vec::new(),
    };
    let mut rng = StdRng::seed_from_u64(request);
    for _ in 0..header("x-steps") {
        let at = now_us();
        if !lease.is_held() {
            return StatusCode::SERVICE_UNAVAILABLE;
        }
        record.hold.confirmed = at;
        if exclusive {
            let accepted = write(&app.register, &name, fence, record.hold.process, true).await;
            let line = op(
                record.hold.process,
                "write",
                &name,
                outcome(&accepted),
                at,
                now_us(),
            );
            record.writes.push(line);
        }
        tokio::time::sleep(scaled(app.ttl, rng.random_range(20..200))).await;
    }
    let at = now_us();
    if !lease.is_held() {
        return StatusCode::SERVICE_UNAVAILABLE;
    }
    record.hold.confirmed = at;
    StatusCode::OK
}

struct Record {
    app: Arc<App>,
    request: u64,
    hold: Hold,
    writes: Vec<Value>,
}

impl Drop for Record {
    fn drop(&mut self) {
        let mut hold = self.hold.to_json();
        hold["request"] = json!(self.request);
        let mut lines = self.app.lines.lock().expect("the lines");
        lines.append(&mut self.writes);
        lines.push(hold);
    }
}

/// The process that sends the requests, from `CONCURRENCY` tasks.
pub struct Driver {
    pub port: u16,
    pub secs: u64,
    pub seed: u64,
    pub ttl: Duration,
}

const CONCURRENCY: u64 = 3;

impl Driver {
    pub async fn run(self, out: &mut impl Write) {
        let client: Client<_, Empty<bytes::Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let end = now_us() + self.secs * 1_000_000;
        let tasks = (0..CONCURRENCY).map(|task| {
            let client = client.clone();
            let mut rng = StdRng::seed_from_u64(self.seed * 10 + task);
            let (port, ttl) = (self.port, self.ttl);
            async move {
                let mut lines = Vec::new();
                let mut seq = 0;
                while now_us() < end {
                    // Request ids are unique across the tasks.
                    let request = seq * CONCURRENCY + task;
                    seq += 1;
                    let (method, path, name) = match rng.random_range(0..3) {
                        0 => {
                            let name = LOCK_NAMES[rng.random_range(0..LOCK_NAMES.len())];
                            (Method::PUT, "lock", name)
                        }
                        1 => (Method::PUT, "doc", RW_NAME),
                        _ => (Method::GET, "doc", RW_NAME),
                    };
                    let invoked = now_us();
                    let sent = Request::builder()
                        .method(method.clone())
                        .uri(format!("http://127.0.0.1:{port}/{path}/{name}"))
                        .header("x-request", request)
                        .header("x-invoked", invoked)
                        .header("x-steps", rng.random_range(1..=4))
                        .body(Empty::new())
                        .expect("a request");
                    // Long enough for a wait and four steps; a frozen server runs it out.
                    let answer = tokio::time::timeout(scaled(ttl, 1_800), async {
                        let response = client.request(sent).await?;
                        let status = response.status();
                        let _ = response.into_body().collect().await;
                        Ok::<_, hyper_util::client::legacy::Error>(status)
                    })
                    .await;
                    let status = match &answer {
                        Ok(Ok(status)) => Some(status.as_u16()),
                        _ => None,
                    };
                    let outcome = match status {
                        Some(200) => "ok",
                        Some(409 | 423 | 429) => "fail",
                        _ => "unknown",
                    };
                    lines.push(json!({
                        "op": "http", "process": REQUEST_PROCESS + request, "request": request,
                        "method": method.as_str(), "name": name, "status": status,
                        "outcome": outcome, "invoked": invoked, "completed": now_us(),
                    }));
                    // A store that is down answers every request at once: wait a little, as
                    // the library's clients do after an error, instead of spinning.
                    if outcome == "unknown" {
                        tokio::time::sleep(scaled(ttl, 20)).await;
                    }
                }
                lines
            }
        });
        for lines in futures_util::future::join_all(tasks).await {
            for line in lines {
                writeln!(out, "{line}").expect("history file");
            }
        }
    }
}
