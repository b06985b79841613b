//! Requests per second over real HTTP: one small axum app served three ways on one
//! `redis-server` — bare, behind the lock middleware a user would otherwise write by hand
//! (`axum::middleware::from_fn`), and behind [`LockLayer`].
//!
//! ```text
//! cargo bench --all-features --bench http
//! BENCH_ROUNDS=15 BENCH_ROUND_MS=2000 cargo bench --all-features --bench http
//! ```
//!
//! One load generator drives all three: 64 keep-alive HTTP/1.1 connections per app, each sending
//! `POST /jobs/<random name>` back to back, in alternating rounds. Every response must be `200`
//! (or `409` when two random names collide); anything else stops the benchmark.
//!
//! Then the refused path: the locked apps again, every request for one name that is held all
//! along (`POST /jobs/held`), so every response must be `409`. A fourth locked app, the
//! hand-written middleware asking `PTTL` for a `Retry-After` when refused, splits the refused
//! path's gap into the cost of that round trip and the cost of the layer.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::StatusCode;
use http_body_util::Empty;
use redis::aio::MultiplexedConnection;
use tower_lease::store::KeyRole;
use tower_lease::{Lock, LockLayer, RedisStore, Store, extract};

use tower_lease_harness::Endpoint;
use tower_lease_harness::bench::{self, Redis, Settings, median};
use tower_lease_harness::http::{Sender, connect, serve};

const TTL: Duration = Duration::from_secs(10);
const JOBS: Lock<str> = Lock::new("jobs", TTL);
const CONNECTIONS: usize = 64;

static COMPARE_AND_DELETE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
});

fn main() {
    bench::run_on_redis(7, 700, |redis, settings| async move {
        bench(&redis, settings).await
    });
}

async fn work() -> &'static str {
    "done"
}

fn app() -> Router {
    Router::new().route("/jobs/{name}", post(work))
}

/// What a hand-written middleware needs: its connection, its keys' prefix, and whether it asks
/// `PTTL` for a `Retry-After` when the lock is held.
#[derive(Clone)]
struct Hand {
    conn: MultiplexedConnection,
    prefix: &'static str,
    retry_after: bool,
}

/// The lock middleware one writes without this crate: `SET NX PX` with a random token, `409`
/// when held (with `Retry-After` from a `PTTL` if `retry_after`, the minimum for what
/// `LockLayer` answers), compare-and-delete after the handler.
async fn hand_lock(
    State(Hand {
        mut conn,
        prefix,
        retry_after,
    }): State<Hand>,
    Path(name): Path<String>,
    req: Request,
    next: Next,
) -> Response {
    let key = format!("{prefix}:jobs:{name}");
    let token: [u8; 16] = rand::random();
    let set: redis::RedisResult<Option<String>> = bench::set_nx_px(&key, &token, TTL)
        .query_async(&mut conn)
        .await;
    match set {
        Ok(Some(_)) => {}
        Ok(None) if !retry_after => return (StatusCode::CONFLICT, "held").into_response(),
        Ok(None) => {
            let pttl: redis::RedisResult<i64> =
                redis::cmd("PTTL").arg(&key).query_async(&mut conn).await;
            let Ok(pttl) = pttl else {
                return StatusCode::SERVICE_UNAVAILABLE.into_response();
            };
            let secs = Duration::from_millis(pttl.max(0) as u64)
                .as_secs_f64()
                .ceil() as u64;
            return (
                StatusCode::CONFLICT,
                [(http::header::RETRY_AFTER, secs.to_string())],
                "held",
            )
                .into_response();
        }
        Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
    let res = next.run(req).await;
    let released: redis::RedisResult<i64> = COMPARE_AND_DELETE
        .key(&key)
        .arg(&token[..])
        .invoke_async(&mut conn)
        .await;
    released.expect("the hand-written release failed");
    res
}

/// The same middleware around tower-lease's [`Lock`] instead of the hand-written commands:
/// `409` with `Retry-After` when held. Between the two others, it tells the cost of the `Lock`
/// cycle from the cost of the layer around it.
async fn lock_middleware(
    State(store): State<Store>,
    Path(name): Path<String>,
    req: Request,
    next: Next,
) -> Response {
    let token = match JOBS.attempt(&store, &name).await {
        Ok(tower_lease::Attempt::Acquired(token)) => token,
        Ok(tower_lease::Attempt::Busy { retry_after }) => {
            let secs = retry_after.as_secs_f64().ceil() as u64;
            return (
                StatusCode::CONFLICT,
                [(http::header::RETRY_AFTER, secs.to_string())],
                "held",
            )
                .into_response();
        }
        Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
    };
    let res = next.run(req).await;
    token.release().await.expect("the release failed");
    res
}

#[derive(Default)]
struct Counts {
    ok: AtomicU64,
    conflict: AtomicU64,
}

/// The name the refused-path rounds ask for, held by someone else all along.
const HELD: &str = "held";

/// Drives `senders` for `length` with random names, or all with `name` when given; answers
/// requests per second (200s and 409s).
async fn drive(
    senders: &mut Vec<Sender>,
    host: &str,
    length: Duration,
    counts: &Counts,
    name: Option<&'static str>,
) -> f64 {
    let host = host.to_owned();
    let request = move |_| {
        let path = match name {
            Some(name) => format!("/jobs/{name}"),
            None => format!("/jobs/{:x}", rand::random::<u64>()),
        };
        http::Request::post(path)
            .header(http::header::HOST, &host)
            .body(Empty::new())
            .unwrap()
    };
    let check = move |_, head: &http::response::Parts| match head.status {
        StatusCode::OK if name.is_none() => {}
        StatusCode::CONFLICT => {}
        other => panic!("unexpected status {other}"),
    };
    let driven = bench::drive(senders, length, request, check).await;
    counts
        .ok
        .fetch_add(driven.count(StatusCode::OK), Ordering::Relaxed);
    counts
        .conflict
        .fetch_add(driven.count(StatusCode::CONFLICT), Ordering::Relaxed);
    driven.per_second()
}

const BARE: &str = "bare";
const HAND: &str = "from_fn SET NX PX + EVALSHA";
const LAYER: &str = "LockLayer";
const LOCK_FN: &str = "from_fn around Lock::attempt";
const HAND_PTTL: &str = "from_fn by hand, PTTL when held";

async fn bench(redis: &Redis, settings: Settings) {
    let conn = redis.connection().await;
    let redis_store = RedisStore::new(conn.clone()).prefix("bench-layer");
    let held_keys = [
        format!("bench-hand:jobs:{HELD}").into_bytes(),
        format!("bench-hand-pttl:jobs:{HELD}").into_bytes(),
        redis_store.key(KeyRole::Lock, JOBS.namespace(), HELD.as_bytes()),
    ];
    let hand = |prefix, retry_after| Hand {
        conn: conn.clone(),
        prefix,
        retry_after,
    };
    let store: Store = redis_store.into();
    let apps = [
        (BARE, app()),
        (
            HAND,
            app().route_layer(middleware::from_fn_with_state(
                hand("bench-hand", false),
                hand_lock,
            )),
        ),
        (
            LAYER,
            app().route_layer(LockLayer::new(
                store.clone(),
                JOBS,
                extract::path_segment(1),
            )),
        ),
        (
            LOCK_FN,
            app().route_layer(middleware::from_fn_with_state(store, lock_middleware)),
        ),
        (
            HAND_PTTL,
            app().route_layer(middleware::from_fn_with_state(
                hand("bench-hand-pttl", true),
                hand_lock,
            )),
        ),
    ];
    let mut targets = Vec::new();
    for (name, app) in apps {
        let addr = serve(app).await;
        targets.push((
            name,
            addr.to_string(),
            connect(addr, CONNECTIONS).await,
            Counts::default(),
            Vec::new(),
        ));
    }
    // A whole round, not counted.
    for (_, host, senders, counts, _) in &mut targets {
        drive(senders, host, settings.round, counts, None).await;
    }
    for round in 0..settings.rounds {
        for k in 0..targets.len() {
            let n = targets.len();
            let (_, host, senders, counts, rates) = &mut targets[(k + round) % n];
            rates.push(drive(senders, host, settings.round, counts, None).await);
        }
    }

    // The refused path: someone else holds `HELD` in both locked apps' keys.
    let mut conn = conn;
    for key in &held_keys {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg("someone else")
            .arg("PX")
            .arg(600_000)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    // The locked apps: from_fn by hand, LockLayer, from_fn around Lock, from_fn by hand with
    // PTTL.
    let locked = targets.len() - 1;
    let mut refused: Vec<(Counts, Vec<f64>)> = (0..locked).map(|_| Default::default()).collect();
    for round in 0..settings.rounds {
        for k in 0..locked {
            let app = (k + round) % locked;
            let (_, host, senders, _, _) = &mut targets[app + 1];
            let (counts, rates) = &mut refused[app];
            rates.push(drive(senders, host, settings.round, counts, Some(HELD)).await);
        }
    }
    let _: () = redis::cmd("DEL")
        .arg(&held_keys[..])
        .query_async(&mut conn)
        .await
        .unwrap();
    let left: Vec<String> = redis::cmd("KEYS")
        .arg("bench-*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(left.is_empty(), "locks were left held: {left:?}");

    println!(
        "\nHTTP/1.1, {CONNECTIONS} connections, POST /jobs/<random>, {} rounds of {:?} per app",
        settings.rounds, settings.round
    );
    println!("machine: {}\n", bench::machine());
    println!("| app | requests/s (median) | × bare | × from_fn | 200 | 409 |");
    println!("|---|---:|---:|---:|---:|---:|");
    // Ratios are medians of the ratios within each round, so drift between rounds cancels.
    let paired = |a: usize, b: usize| {
        let (a, b) = (&targets[a].4, &targets[b].4);
        median(&mut a.iter().zip(b).map(|(a, b)| a / b).collect::<Vec<_>>())
    };
    for (i, (name, _, _, counts, rates)) in targets.iter().enumerate() {
        println!(
            "| {name} | {:.0} | {:.2} | {:.2} | {} | {} |",
            median(&mut rates.clone()),
            paired(i, 0),
            paired(i, 1),
            counts.ok.load(Ordering::Relaxed),
            counts.conflict.load(Ordering::Relaxed),
        );
    }

    println!("\nrefused path: POST /jobs/{HELD}, held all along\n");
    println!("| app | 409s/s (median) | × from_fn | 409 |");
    println!("|---|---:|---:|---:|");
    let refused_paired = |a: usize, b: usize| {
        let (a, b) = (&refused[a].1, &refused[b].1);
        median(&mut a.iter().zip(b).map(|(a, b)| a / b).collect::<Vec<_>>())
    };
    let refused_ratio = |a: usize| refused_paired(a, 0);
    for (i, (counts, rates)) in refused.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.2} | {} |",
            targets[i + 1].0,
            median(&mut rates.clone()),
            refused_ratio(i),
            counts.conflict.load(Ordering::Relaxed),
        );
    }

    println!(
        "  (LockLayer × from_fn around Lock::attempt: {:.3}; refused: {:.3})",
        paired(2, 3),
        refused_paired(1, 2),
    );
    // The refused path split in two: what the PTTL round trip costs a hand-written middleware,
    // and what LockLayer costs over that middleware when both send it.
    println!(
        "  (refused, from_fn by hand with PTTL × without: {:.3}; LockLayer × from_fn by hand with PTTL: {:.3})",
        refused_paired(3, 0),
        refused_paired(1, 3),
    );
    let met = |met: bool| if met { "met" } else { "MISSED" };
    let within = |a: usize, b: usize| -> Vec<f64> {
        let (a, b) = (&targets[a].4, &targets[b].4);
        a.iter().zip(b).map(|(a, b)| a / b).collect()
    };
    println!("\ntargets:");
    bench::goal(
        "LockLayer ≥ 1.0× the from_fn middleware's requests/s",
        &within(2, 1),
        1.0,
    );
    let ratio = refused_ratio(1);
    println!(
        "- LockLayer ≥ 0.9× the from_fn middleware's 409s/s: {ratio:.3} {}",
        met(ratio >= 0.9)
    );
}
