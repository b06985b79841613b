//! `IdempotencyLayer` over real HTTP on one `redis-server`, paired with what it is measured
//! against in alternating rounds: a replayed request against a bare one (goal ≥ 0.8×), and a
//! first request with a fresh key against a `LockLayer` request on a fresh name (goal ≥ 0.9×).
//!
//! ```text
//! cargo bench --all-features --bench idempotency
//! BENCH_ROUNDS=15 BENCH_ROUND_MS=2000 cargo bench --all-features --bench idempotency
//! BENCH_ONLY="first request" cargo bench --all-features --bench idempotency   # one app, counted
//! ```
//!
//! 64 keep-alive HTTP/1.1 connections per app, each sending requests back to back. The replay
//! app's connections each repeat one key stored before the rounds (every response must carry
//! `Idempotent-Replayed: true`); the first-request app sends a new random key each time; the
//! `LockLayer` app a new random name. Any other answer stops the benchmark.

use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use http_body_util::{BodyExt, Empty};
use tower_lease::{Idempotency, IdempotencyLayer, Lock, LockLayer, RedisStore, Store, extract};

use tower_lease_harness::Endpoint;
use tower_lease_harness::bench::{self, Redis, Settings, median};
use tower_lease_harness::http::{Sender, connect, serve};

const CONNECTIONS: usize = 64;
const ORDERS: Idempotency = Idempotency::new("bench-orders", Duration::from_secs(120));
const JOBS: Lock<str> = Lock::new("bench-jobs", Duration::from_secs(10));

fn main() {
    bench::run_on_redis(7, 700, |redis, settings| async move {
        bench(&redis, settings).await
    });
}

async fn work() -> &'static str {
    "done"
}

fn app() -> Router {
    Router::new().route("/orders/{name}", post(work))
}

/// One round of one app: requests per second, and CPU per request of this process (the app and
/// its load generator) and of the server (when the bench started it).
struct Round {
    rate: f64,
    client: f64,
    server: Option<f64>,
}

fn server_cpu(redis: &Redis) -> Option<Duration> {
    redis.pid().and_then(bench::cpu_time_of)
}

/// What each request of an app carries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Load {
    /// A random name, no key.
    Plain,
    /// Connection `i`'s own stored key, `replay-i`.
    Replay,
    /// A fresh random key.
    First,
}

/// Drives `senders` for `length`; answers requests per second and the requests answered.
async fn drive(senders: &mut Vec<Sender>, host: &str, length: Duration, load: Load) -> (f64, u64) {
    let host = host.to_owned();
    let request = move |connection| {
        let (path, key) = match load {
            Load::Plain => (format!("/orders/{:x}", rand::random::<u64>()), None),
            Load::Replay => ("/orders/o".to_owned(), Some(format!("replay-{connection}"))),
            Load::First => {
                let key = format!("first-{:x}", rand::random::<u64>());
                ("/orders/o".to_owned(), Some(key))
            }
        };
        let mut req = http::Request::post(path).header(http::header::HOST, &host);
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        req.body(Empty::new()).unwrap()
    };
    let check = move |_, head: &http::response::Parts| {
        assert_eq!(head.status, StatusCode::OK, "unexpected status");
        let replayed = head.headers.contains_key("idempotent-replayed");
        assert_eq!(
            replayed,
            load == Load::Replay,
            "replayed or not as expected"
        );
    };
    let driven = bench::drive(senders, length, request, check).await;
    (driven.per_second(), driven.responses())
}

async fn bench(redis: &Redis, settings: Settings) {
    let store: Store = RedisStore::new(redis.connection().await)
        .prefix("bench-idem")
        .into();
    let idempotent = || IdempotencyLayer::new(store.clone(), ORDERS);
    let apps = [
        ("bare", Load::Plain, app()),
        (
            "IdempotencyLayer, replayed",
            Load::Replay,
            app().route_layer(idempotent()),
        ),
        (
            "LockLayer",
            Load::Plain,
            app().route_layer(LockLayer::new(
                store.clone(),
                JOBS,
                extract::path_segment(1),
            )),
        ),
        (
            "IdempotencyLayer, first request",
            Load::First,
            app().route_layer(idempotent()),
        ),
    ];
    let mut targets = Vec::new();
    for (name, load, app) in apps {
        let addr = serve(app).await;
        let senders = connect(addr, CONNECTIONS).await;
        targets.push((name, load, addr.to_string(), senders, Vec::<Round>::new()));
    }
    // Store each replaying connection's key once, then warm every app up.
    let (_, _, host, senders, _) = &mut targets[3];
    for (i, sender) in senders.iter_mut().enumerate() {
        let req = http::Request::post("/orders/o")
            .header(http::header::HOST, host.as_str())
            .header("idempotency-key", format!("replay-{i}"))
            .body(Empty::new())
            .unwrap();
        sender.ready().await.unwrap();
        let res = sender.send_request(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        res.into_body().collect().await.unwrap();
    }
    for (_, load, host, senders, _) in &mut targets {
        drive(senders, host, Duration::from_millis(200), *load).await;
    }
    // BENCH_ONLY=name drives only the apps whose names hold it, for profiling; the others
    // answer no figures.
    let only = std::env::var("BENCH_ONLY").ok();
    let mut done = vec![0; targets.len()];
    for round in 0..settings.rounds {
        for k in 0..targets.len() {
            let n = targets.len();
            let (name, load, host, senders, rounds) = &mut targets[(k + round) % n];
            if only.as_deref().is_some_and(|only| !name.contains(only)) {
                continue;
            }
            let (client, server) = (bench::cpu_time(), server_cpu(redis));
            let (rate, answered) = drive(senders, host, settings.round, *load).await;
            let per = |cpu: Duration| cpu.as_secs_f64() * 1e6 / answered.max(1) as f64;
            rounds.push(Round {
                rate,
                client: per(bench::cpu_time() - client),
                server: server.zip(server_cpu(redis)).map(|(a, b)| per(b - a)),
            });
            done[(k + round) % n] += answered;
        }
    }
    if only.is_some() {
        for ((name, ..), done) in targets.iter().zip(&done) {
            println!("requests: {name}: {done}");
        }
        return;
    }

    println!(
        "\nHTTP/1.1, {CONNECTIONS} connections, POST /orders/…, {} rounds of {:?} per app",
        settings.rounds, settings.round
    );
    println!("machine: {}\n", bench::machine());
    println!("| app | requests/s (median) | client CPU µs/request | server CPU µs/request |");
    println!("|---|---:|---:|---:|");
    let of = |i: usize, of: fn(&Round) -> Option<f64>| {
        let mut values: Vec<f64> = targets[i].4.iter().filter_map(of).collect();
        if values.is_empty() {
            return f64::NAN;
        }
        median(&mut values)
    };
    for (i, (name, ..)) in targets.iter().enumerate() {
        println!(
            "| {name} | {:.0} | {:.1} | {:.1} |",
            of(i, |r| Some(r.rate)),
            of(i, |r| Some(r.client)),
            of(i, |r| r.server),
        );
    }
    // Ratios are taken within each round, so drift between rounds cancels.
    let within = |a: usize, b: usize| {
        let (a, b) = (&targets[a].4, &targets[b].4);
        a.iter()
            .zip(b)
            .map(|(a, b)| a.rate / b.rate)
            .collect::<Vec<_>>()
    };
    let time_goes = |a: usize, b: usize| {
        println!(
            "  where the time goes: client CPU {:.1} µs per request against {:.1}, server CPU \
             {:.1} µs against {:.1} (the load generator's share is in the client's)",
            of(a, |r| Some(r.client)),
            of(b, |r| Some(r.client)),
            of(a, |r| r.server),
            of(b, |r| r.server),
        );
    };
    println!("\ntargets:");
    if !bench::goal("replayed ≥ 0.8× bare", &within(1, 0), 0.8) {
        time_goes(1, 0);
    }
    if !bench::goal("first request ≥ 0.9× LockLayer", &within(3, 2), 0.9) {
        time_goes(3, 2);
    }
}
