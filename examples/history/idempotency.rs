//! The idempotency workload: app replicas (one process each) serve `POST /pay` behind
//! `IdempotencyLayer` on the lock store under test, and a driver's clients send payments, each
//! with a key of its own, retrying on timeouts, errors, `409`, `429` and `5xx` as a stock
//! retrying client does, and, once a payment was acknowledged, asking again (a replay) now and
//! then. The handler appends each run to a ledger, a list in the register's Redis, which no
//! fault touches and which outlives the replica that wrote it; its response names the run.
//!
//! What comes back is recorded as `idem` lines (one per attempt), the ledger as `run` lines,
//! and [`idem_check`](crate::idem_check) counts, per key, the runs that started after an
//! acknowledged (`2xx`) response, the `2xx` answers that differ from the first, and under
//! `at_most_once` every run after the first.
//!
//! Under `--broken-idem` the replicas run over [`AckBeforeStore`], the control's broken
//! store: it acknowledges a completion at once and stores it later, in the background, so the
//! layer answers before the record is stored.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tower_lease::backend::{
    Acquisition, Backend, Begin, BoxFuture, Completion, Extended, LeaseRef, LockRef,
};
use tower_lease::{Idempotency, IdempotencyLayer, Lease, Store};

use crate::connect::{Locks, connect};
use crate::record::now_us;

/// The register's list every run is appended to.
pub const LEDGER: &str = "ledger";

/// The timings of one variant, by the reservation's lease: the handler works up to half of
/// it, and a client gives an attempt a lease and a half before it retries.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub lease: Duration,
}

impl Timing {
    fn work(self, rng: &mut impl Rng) -> Duration {
        let ms = self.lease.as_millis() as u64;
        Duration::from_millis(rng.random_range(ms / 50..ms / 2))
    }

    fn attempt_timeout(self) -> Duration {
        self.lease * 3 / 2
    }

    fn backoff(self, rng: &mut impl Rng) -> Duration {
        let ms = self.lease.as_millis() as u64;
        Duration::from_millis(rng.random_range(ms / 20..ms / 5))
    }
}

/// The payments namespace: records kept longer than any history.
fn payments(lease: Duration, at_most_once: bool) -> Idempotency {
    let definition = Idempotency::new("history-payments", Duration::from_secs(3_600))
        .lease(lease)
        .fenced();
    if at_most_once {
        definition.at_most_once()
    } else {
        definition
    }
}

/// One app replica.
pub struct Replica {
    pub replica: u64,
    pub locks: Locks,
    pub register_url: String,
    pub port: u16,
    pub secs: u64,
    pub timing: Timing,
    pub at_most_once: bool,
    pub broken: bool,
}

struct App {
    ledger: redis::aio::ConnectionManager,
    replica: u64,
    runs: AtomicU64,
    timing: Timing,
}

impl Replica {
    /// Serves until `SIGTERM` or long past `secs`; writes nothing but the ledger, so a
    /// `SIGKILL` loses no record.
    pub async fn run(self) {
        let store = connect(&self.locks, self.timing.lease, false).await;
        let store = if self.broken {
            Store::from_backend(AckBeforeStore { inner: store })
        } else {
            store
        };
        let app = Arc::new(App {
            ledger: crate::worker::register(&self.register_url).await,
            replica: self.replica,
            runs: AtomicU64::new(0),
            timing: self.timing,
        });
        let layer = IdempotencyLayer::new(store, payments(self.timing.lease, self.at_most_once))
            .require_key();
        let router = Router::new()
            .route("/pay", post(pay).route_layer(layer))
            .with_state(app);
        // A replica restarted after a kill binds the port its predecessor had.
        let listener = loop {
            let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
            match tokio::net::TcpListener::bind(addr).await {
                Ok(listener) => break listener,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        };
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("a SIGTERM handler");
        let serving = axum::serve(listener, router).with_graceful_shutdown(async move {
            terminate.recv().await;
        });
        let _ = tokio::time::timeout(Duration::from_secs(self.secs + 120), serving).await;
    }
}

/// The payment: appends the run to the ledger first (the effect), works a while, and answers
/// `201` naming the run.
async fn pay(
    axum::extract::State(app): axum::extract::State<Arc<App>>,
    axum::extract::Extension(lease): axum::extract::Extension<Lease>,
    headers: HeaderMap,
) -> (StatusCode, String) {
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let n = app.runs.fetch_add(1, Ordering::Relaxed);
    let run = format!("{}.{}.{n}", app.replica, std::process::id());
    // Taken before the effect is sent, so a run counts from no later than its effect.
    // The fence tells a stale run (a replica frozen past its reservation) from a new one.
    let entry = json!({
        "key": key, "run": run, "replica": app.replica, "fence": lease.fence(), "at": now_us(),
    });
    let mut ledger = app.ledger.clone();
    // The register has no faults; a failure here is this replica's own (frozen) trouble.
    while redis::cmd("RPUSH")
        .arg(LEDGER)
        .arg(entry.to_string())
        .query_async::<i64>(&mut ledger)
        .await
        .is_err()
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let work = app.timing.work(&mut rand::rng());
    tokio::time::sleep(work).await;
    (StatusCode::CREATED, run)
}

/// The driver: `CLIENTS` clients, each paying with fresh keys until the history ends.
pub struct Driver {
    pub ports: Vec<u16>,
    pub secs: u64,
    pub seed: u64,
    pub timing: Timing,
}

const CLIENTS: u64 = 6;

/// How a client takes an answer.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// Acknowledged.
    Done,
    /// Final without an acknowledgement (`410`, `422`, outcome unknown): the client stops.
    GiveUp,
    /// Retried.
    Retry,
}

fn next(status: Option<u16>, problem: Option<&str>) -> Next {
    match status {
        Some(200..=299) => Next::Done,
        Some(409) if problem.is_some_and(|p| p.ends_with("idempotency-outcome-unknown")) => {
            Next::GiveUp
        }
        Some(408 | 409 | 429 | 500..=599) | None => Next::Retry,
        Some(_) => Next::GiveUp,
    }
}

impl Driver {
    pub async fn run(self, out: &mut impl Write) {
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        let end = now_us() + self.secs * 1_000_000;
        // A key still unanswered at the end gets a little longer; its retries then stop.
        let last = end + 5_000_000;
        let tasks = (0..CLIENTS).map(|task| {
            let client = client.clone();
            let mut rng = StdRng::seed_from_u64(self.seed * 10 + task);
            let (ports, timing, seed) = (self.ports.clone(), self.timing, self.seed);
            async move {
                let mut lines = Vec::new();
                let mut seq = 0;
                while now_us() < end {
                    let key = format!("{seed}-{task}-{seq}");
                    seq += 1;
                    let mut attempt = 0;
                    // The first phase until an answer is final; then, half the time, a replay.
                    for replay in [false, true] {
                        if replay && rng.random_bool(0.5) {
                            break;
                        }
                        loop {
                            let port = ports[rng.random_range(0..ports.len())];
                            let line = send(&client, port, &key, attempt, replay, timing).await;
                            attempt += 1;
                            let status = line["status"].as_u64().map(|s| s as u16);
                            let next = next(status, line["problem"].as_str());
                            lines.push(line);
                            if next != Next::Retry || now_us() > last {
                                break;
                            }
                            tokio::time::sleep(timing.backoff(&mut rng)).await;
                        }
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

/// One attempt, as its `idem` line.
async fn send(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    port: u16,
    key: &str,
    attempt: u64,
    replay: bool,
    timing: Timing,
) -> Value {
    let request = Request::builder()
        .method(Method::POST)
        .uri(format!("http://127.0.0.1:{port}/pay"))
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(json!({ "amount": 100 }).to_string())))
        .expect("a request");
    let invoked = now_us();
    let answer = tokio::time::timeout(timing.attempt_timeout(), async {
        let response = client.request(request).await?;
        let status = response.status();
        let replayed = response.headers().contains_key("idempotent-replayed");
        let body = response.into_body().collect().await?.to_bytes();
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>((status, replayed, body))
    })
    .await;
    let completed = now_us();
    let (status, replayed, body, problem) = match answer {
        Ok(Ok((status, replayed, body))) => {
            let problem = serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v["type"].as_str().map(str::to_owned));
            let body = String::from_utf8_lossy(&body).into_owned();
            (Some(status.as_u16()), replayed, Some(body), problem)
        }
        _ => (None, false, None, None),
    };
    json!({
        "op": "idem", "key": key, "attempt": attempt, "replay": replay, "port": port,
        "status": status, "replayed": replayed, "body": body, "problem": problem,
        "invoked": invoked, "completed": completed,
    })
}

/// The control's broken store: a completion is acknowledged at once and stored in the
/// background after a while, by which time the reservation (no longer kept alive by the
/// layer, which thinks it stored) may have run out and a retry run the payment again.
struct AckBeforeStore {
    inner: Store,
}

impl Backend for AckBeforeStore {
    fn acquire<'a>(
        &'a self,
        lease: LeaseRef<'a>,
    ) -> BoxFuture<'a, tower_lease::Result<Acquisition>> {
        self.inner.backend().acquire(lease)
    }

    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, tower_lease::Result<Extended>> {
        self.inner.backend().extend(lease)
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, tower_lease::Result<bool>> {
        self.inner.backend().release(lease)
    }

    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, tower_lease::Result<u32>> {
        self.inner.backend().in_use(lock)
    }

    fn idempotency_begin<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        fingerprint: &'a [u8; tower_lease::backend::FINGERPRINT_LEN],
    ) -> BoxFuture<'a, tower_lease::Result<Begin>> {
        self.inner.backend().idempotency_begin(lease, fingerprint)
    }

    fn idempotency_begin_once<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        fingerprint: &'a [u8; tower_lease::backend::FINGERPRINT_LEN],
        retention: Duration,
    ) -> BoxFuture<'a, tower_lease::Result<Begin>> {
        let backend = self.inner.backend();
        backend.idempotency_begin_once(lease, fingerprint, retention)
    }

    fn idempotency_free<'a>(
        &'a self,
        lease: LeaseRef<'a>,
    ) -> BoxFuture<'a, tower_lease::Result<bool>> {
        self.inner.backend().idempotency_free(lease)
    }

    fn idempotency_complete<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        completion: Completion<'a>,
    ) -> BoxFuture<'a, tower_lease::Result<bool>> {
        let inner = self.inner.clone();
        let (namespace, name) = (lease.lock.namespace.to_owned(), lease.lock.name.to_vec());
        let (ttl, fenced, mode, secret) = (
            lease.lock.ttl,
            lease.lock.fenced,
            lease.mode,
            lease.secret.clone(),
        );
        let (fingerprint, response, retention) = (
            *completion.fingerprint,
            completion.response.to_vec(),
            completion.retention,
        );
        let delay = ttl.mul_f64(rand::rng().random_range(0.0..2.0));
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let mut lock = LockRef::new(&namespace, &name, ttl);
            if fenced {
                lock = lock.fenced();
            }
            let lease = LeaseRef::new(lock, mode, &secret);
            let completion = Completion::new(&fingerprint, &response, retention);
            let _ = inner
                .backend()
                .idempotency_complete(lease, completion)
                .await;
        });
        Box::pin(async { Ok(true) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_retries_what_a_stock_client_retries_and_stops_on_final_answers() {
        assert_eq!(next(Some(201), None), Next::Done);
        assert_eq!(next(None, None), Next::Retry);
        assert_eq!(next(Some(503), None), Next::Retry);
        let in_flight = "urn:tower-lease:idempotency-in-flight";
        assert_eq!(next(Some(409), Some(in_flight)), Next::Retry);
        let unknown = "urn:tower-lease:idempotency-outcome-unknown";
        assert_eq!(next(Some(409), Some(unknown)), Next::GiveUp);
        assert_eq!(next(Some(410), None), Next::GiveUp);
    }
}
