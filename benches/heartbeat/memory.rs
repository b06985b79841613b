//! Memory per held request, each way measured in a process of its own (a process reuses the
//! memory an earlier phase freed, so only a fresh one's resident growth means anything).
//!
//! The same requests are held with and without `LockLayer`: the same spawned `oneshot` task
//! per request and the same handler, which keeps its request while it waits. The difference
//! is the layer's own share; the bare requests are the benchmark's.
//!
//! And two ways of arriving: all at once (every acquisition is in flight together, so the
//! process's peak holds each one's store call as well as the held requests), and 64 at a time
//! (a new request only when the previous 64 are held, as under 64 concurrent clients).

use std::convert::Infallible;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use tokio_util::sync::CancellationToken;
use tower::{Layer, Service, ServiceExt};
use tower_lease::layer::TimeoutBody;
use tower_lease::{Lease, Lock, LockLayer, RedisStore, Store, extract};

use crate::alloc::{self, Live};

use tower_lease_harness::Endpoint;
use tower_lease_harness::bench::{self, Redis};

const LEASES: Lock<str> = Lock::new("held", crate::phases::TTL);
const PREFIX: &str = "bench-memory";
/// Requests in flight at once when they arrive in waves.
const WAVE: usize = 64;

/// With or without the layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stack {
    Layer,
    Bare,
}

/// How the requests arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arrival {
    AllAtOnce,
    InWaves,
}

/// What one way of holding kept, per held request.
#[derive(Clone, Debug, Default)]
pub(crate) struct Memory {
    pub(crate) heap: f64,
    /// The most heap alive at once while the requests arrived.
    pub(crate) peak_heap: f64,
    pub(crate) resident: f64,
    /// Heap blocks alive by size class, as [`alloc::describe`] puts it.
    pub(crate) blocks: String,
}

const ENV: &str = "HEARTBEAT_MEMORY";

/// Runs one way in a fresh process (this benchmark again, in [`child`] mode) on `redis`.
pub(crate) fn measure(redis: &Redis, leases: usize, stack: Stack, arrival: Arrival) -> Memory {
    let output = Command::new(std::env::current_exe().expect("the benchmark's executable"))
        .env(ENV, format!("{stack:?},{arrival:?}"))
        .env("HEARTBEAT_LEASES", leases.to_string())
        .env("REDIS_URL", redis.url())
        .output()
        .expect("run the benchmark in memory mode");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "the {stack:?} {arrival:?} memory run failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("memory "))
        .expect("a memory line");
    let mut fields = line.splitn(4, ' ');
    let mut number = || {
        fields
            .next()
            .and_then(|f| f.parse().ok())
            .expect("a number")
    };
    Memory {
        heap: number(),
        peak_heap: number(),
        resident: number(),
        blocks: fields.next().unwrap_or_default().to_owned(),
    }
}

/// The way [`measure`] asked for, if this process was started for one.
pub(crate) fn requested() -> Option<(Stack, Arrival)> {
    let way = std::env::var(ENV).ok()?;
    let (stack, arrival) = way.split_once(',').expect("stack,arrival");
    let stack = match stack {
        "Layer" => Stack::Layer,
        "Bare" => Stack::Bare,
        other => panic!("unknown stack {other}"),
    };
    let arrival = match arrival {
        "AllAtOnce" => Arrival::AllAtOnce,
        "InWaves" => Arrival::InWaves,
        other => panic!("unknown arrival {other}"),
    };
    Some((stack, arrival))
}

/// Holds `leases` requests the way asked for, prints what they keep as one `memory` line for
/// [`measure`], then lets them go.
pub(crate) async fn child(redis: &Redis, leases: usize, stack: Stack, arrival: Arrival) {
    let held = Arc::new(AtomicUsize::new(0));
    let done = CancellationToken::new();
    let handler = {
        let (held, done) = (held.clone(), done.clone());
        tower::service_fn(move |req: Request<TimeoutBody<Empty<Bytes>>>| {
            let (held, done) = (held.clone(), done.clone());
            async move {
                let lease = req.extensions().get::<Lease>().cloned();
                held.fetch_add(1, Ordering::SeqCst);
                done.cancelled().await;
                let kept = lease.is_none_or(|lease| lease.is_held());
                let status = if kept {
                    StatusCode::OK
                } else {
                    StatusCode::GONE
                };
                let mut response = Response::new(Empty::<Bytes>::new());
                *response.status_mut() = status;
                Ok::<_, Infallible>(response)
            }
        })
    };
    let statuses = match stack {
        Stack::Bare => {
            let bare = handler.map_request(|req: Request<Empty<Bytes>>| req.map(TimeoutBody::new));
            hold(bare, leases, arrival, &held, &done).await
        }
        Stack::Layer => {
            let conn = redis.connection().await;
            let store: Store = RedisStore::new(conn).prefix(PREFIX).into();
            let service = LockLayer::new(store, LEASES, extract::path_segment(1)).layer(handler);
            hold(service, leases, arrival, &held, &done).await
        }
    };
    assert!(
        statuses.iter().all(|&s| s == StatusCode::OK),
        "a request lost its lease"
    );
    // A release the layer did not see confirmed within its `release_wait` finishes in the
    // background, after the response: give those a moment on a busy machine.
    let mut conn = redis.connection().await;
    let start = Instant::now();
    loop {
        let left: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{PREFIX}*"))
            .query_async(&mut conn)
            .await
            .unwrap();
        if left.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{} leases were left behind",
            left.len()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn hold<S, B>(
    service: S,
    leases: usize,
    arrival: Arrival,
    held: &AtomicUsize,
    done: &CancellationToken,
) -> Vec<StatusCode>
where
    S: Service<Request<Empty<Bytes>>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    let request = |name: String| {
        let req = Request::post(format!("/l/{name}"))
            .body(Empty::new())
            .unwrap();
        tokio::spawn(service.clone().oneshot(req))
    };
    let wait_held = |n: usize| async move {
        let start = Instant::now();
        while held.load(Ordering::SeqCst) < n {
            assert!(start.elapsed() < Duration::from_secs(60), "not all held");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    // Warm up the connection, the script cache and the runtime before the baselines.
    let warm = request("warm".into());
    wait_held(1).await;

    let (heap, rss) = (Live::now(), bench::resident_bytes());
    let wave = match arrival {
        Arrival::AllAtOnce => leases,
        Arrival::InWaves => WAVE,
    };
    let mut requests = Vec::with_capacity(leases);
    while requests.len() < leases {
        let next = requests.len()..(requests.len() + wave).min(leases);
        requests.extend(next.map(|i| request(i.to_string())));
        wait_held(requests.len() + 1).await;
    }
    let live = Live::now();
    let n = leases as f64;
    println!(
        "memory {:.0} {:.0} {:.0} {}",
        (live.bytes - heap.bytes) as f64 / n,
        (live.peak - heap.bytes) as f64 / n,
        bench::resident_bytes().saturating_sub(rss) as f64 / n,
        alloc::describe(&live.blocks_since(&heap, leases)),
    );

    done.cancel();
    let mut statuses = Vec::with_capacity(leases + 1);
    for request in requests.into_iter().chain([warm]) {
        let response = request.await.expect("a request task panicked").unwrap();
        statuses.push(response.status());
    }
    statuses
}
