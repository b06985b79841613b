//! Requests per second over real HTTP for reads behind [`RwLockLayer`]: one small axum app
//! served three ways on one `redis-server` — bare, behind `RwLockLayer` (reads coalesced, the
//! default), and behind `RwLockLayer` with `.coalesce_reads(false)` (a reader lease per request).
//!
//! ```text
//! cargo bench --all-features --bench rw_http
//! BENCH_ROUNDS=15 BENCH_ROUND_MS=2000 cargo bench --all-features --bench rw_http
//! ```
//!
//! Two workloads, each in alternating rounds over the three apps, 64 keep-alive HTTP/1.1
//! connections per app sending `GET /docs/<name>` back to back: **hot**, four names (connection
//! `i` reads name `i % 4`), where reads of one name overlap all the time; and **distinct**, a
//! random name per request, where nothing is shared. Every response must be `200`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use http::StatusCode;
use http_body_util::Empty;
use tower_lease::{RedisStore, RwLock, RwLockLayer, Store, extract};

use tower_lease_harness::Endpoint;
use tower_lease_harness::bench::{self, Redis, Settings, median};
use tower_lease_harness::http::{Sender, connect, serve};

const DOCS: RwLock<str> = RwLock::new("docs", Duration::from_secs(10));
const CONNECTIONS: usize = 64;
const HOT_NAMES: usize = 4;

fn main() {
    bench::run_on_redis(7, 700, |redis, settings| async move {
        bench(&redis, settings).await
    });
}

async fn read() -> &'static str {
    "doc"
}

fn app() -> Router {
    Router::new().route("/docs/{name}", get(read))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Names {
    Hot,
    Distinct,
}

/// Drives `senders` for `length`; answers requests per second.
async fn drive(
    senders: &mut Vec<Sender>,
    host: &str,
    length: Duration,
    names: Names,
    ok: &AtomicU64,
) -> f64 {
    let host = host.to_owned();
    let request = move |connection| {
        let path = match names {
            Names::Hot => format!("/docs/hot-{}", connection % HOT_NAMES),
            Names::Distinct => format!("/docs/{:x}", rand::random::<u64>()),
        };
        http::Request::get(path)
            .header(http::header::HOST, &host)
            .body(Empty::new())
            .unwrap()
    };
    let check = |_, head: &http::response::Parts| {
        assert_eq!(head.status, StatusCode::OK, "a read was refused");
    };
    let driven = bench::drive(senders, length, request, check).await;
    ok.fetch_add(driven.responses(), Ordering::Relaxed);
    driven.per_second()
}

fn server_cpu(redis: &Redis) -> Option<Duration> {
    redis.pid().and_then(bench::cpu_time_of)
}

/// `EVALSHA` and `EVAL` calls since the last `CONFIG RESETSTAT`.
async fn script_calls(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    bench::command_calls(conn, |command| matches!(command, "evalsha" | "eval")).await
}

const BARE: usize = 0;
const COALESCED: usize = 1;
const APART: usize = 2;
/// The coalesced app whose shares linger after their last read.
const LINGERING: usize = 3;

struct Target {
    name: &'static str,
    host: String,
    senders: Vec<Sender>,
    ok: AtomicU64,
}

async fn bench(redis: &Redis, settings: Settings) {
    let conn = redis.connection().await;
    let store: Store = RedisStore::new(conn.clone()).prefix("bench-rw").into();
    let layer = || RwLockLayer::new(store.clone(), DOCS, extract::path_segment(1));
    let apps = [
        ("bare", app()),
        ("RwLockLayer", app().route_layer(layer())),
        (
            "RwLockLayer, coalesce_reads(false)",
            app().route_layer(layer().coalesce_reads(false)),
        ),
        (
            "RwLockLayer, linger_reads(20 ms)",
            app().route_layer(layer().linger_reads(Duration::from_millis(20))),
        ),
    ];
    let mut targets = Vec::new();
    for (name, app) in apps {
        let addr = serve(app).await;
        let senders = connect(addr, CONNECTIONS).await;
        let (host, ok) = (addr.to_string(), AtomicU64::new(0));
        targets.push(Target {
            name,
            host,
            senders,
            ok,
        });
    }
    println!("\nmachine: {}", bench::machine());
    for names in [Names::Hot, Names::Distinct] {
        for target in &mut targets {
            // A whole round, not counted.
            let warm = settings.round;
            drive(&mut target.senders, &target.host, warm, names, &target.ok).await;
            target.ok.store(0, Ordering::Relaxed);
        }
        let mut rates: Vec<Vec<f64>> = targets.iter().map(|_| Vec::new()).collect();
        // CPU per request of this process (app and load generator) and of the server.
        let mut cpu: Vec<(Vec<f64>, Vec<f64>)> =
            targets.iter().map(|_| Default::default()).collect();
        for round in 0..settings.rounds {
            for k in 0..targets.len() {
                let i = (k + round) % targets.len();
                let t = &mut targets[i];
                let before = t.ok.load(Ordering::Relaxed);
                let (client, server) = (bench::cpu_time(), server_cpu(redis));
                let rate = drive(&mut t.senders, &t.host, settings.round, names, &t.ok).await;
                let requests = (t.ok.load(Ordering::Relaxed) - before).max(1) as f64;
                let per = |cpu: Duration| cpu.as_secs_f64() * 1e6 / requests;
                cpu[i].0.push(per(bench::cpu_time() - client));
                if let (Some(a), Some(b)) = (server, server_cpu(redis)) {
                    cpu[i].1.push(per(b - a));
                }
                rates[i].push(rate);
            }
        }
        let cpu_of = |i: usize| {
            let (client, server) = &cpu[i];
            let of = |values: &[f64]| match values.is_empty() {
                true => f64::NAN,
                false => median(&mut values.to_vec()),
            };
            (of(client), of(server))
        };
        let what = match names {
            Names::Hot => format!("GET /docs/hot-<0..{HOT_NAMES}>"),
            Names::Distinct => "GET /docs/<random>".to_owned(),
        };
        println!(
            "\nHTTP/1.1, {CONNECTIONS} connections, {what}, {} rounds of {:?} per app\n",
            settings.rounds, settings.round
        );
        println!(
            "| app | requests/s (median) | × bare | × coalesce_reads(false) | 200 | client CPU µs/request | server CPU µs/request |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|");
        // Ratios are medians of the ratios within each round, so drift between rounds cancels.
        let paired = |a: usize, b: usize| {
            let pairs = rates[a].iter().zip(&rates[b]).map(|(a, b)| a / b);
            median(&mut pairs.collect::<Vec<_>>())
        };
        for (i, target) in targets.iter().enumerate() {
            let (client, server) = cpu_of(i);
            println!(
                "| {} | {:.0} | {:.2} | {:.2} | {} | {client:.1} | {server:.1} |",
                target.name,
                median(&mut rates[i].clone()),
                paired(i, BARE),
                paired(i, APART),
                target.ok.load(Ordering::Relaxed),
            );
        }
        let within = |a: usize, b: usize| {
            let pairs = rates[a].iter().zip(&rates[b]).map(|(a, b)| a / b);
            pairs.collect::<Vec<_>>()
        };
        // Store calls per request of the coalesced apps: one round of each alone, between
        // counters.
        let mut calls_per_request = [f64::NAN; 4];
        for i in [COALESCED, LINGERING] {
            let t = &mut targets[i];
            let _: () = redis::cmd("CONFIG")
                .arg("RESETSTAT")
                .query_async(&mut conn.clone())
                .await
                .unwrap();
            let before = t.ok.load(Ordering::Relaxed);
            drive(&mut t.senders, &t.host, settings.round, names, &t.ok).await;
            let requests = t.ok.load(Ordering::Relaxed) - before;
            let calls = script_calls(&mut conn.clone()).await;
            calls_per_request[i] = calls as f64 / requests as f64;
            println!(
                "\n{}: {:.3} script calls per request ({calls} for {requests}; a reader lease \
                 of its own costs 2, its acquire's and its release's)",
                t.name, calls_per_request[i]
            );
        }
        let time_goes = |a: usize| {
            let ((client, server), (bare, _)) = (cpu_of(a), cpu_of(BARE));
            println!(
                "  where the time goes: client CPU {client:.1} µs per request against bare's \
                 {bare:.1}, server CPU {server:.1} µs per request, {:.3} script calls per \
                 request",
                calls_per_request[a]
            );
        };
        println!("\ntargets:");
        match names {
            Names::Hot => {
                let what = "RwLockLayer ≥ 0.95× bare on hot names";
                if !bench::goal(what, &within(COALESCED, BARE), 0.95) {
                    time_goes(COALESCED);
                }
                let what = "RwLockLayer with linger_reads(20 ms) ≥ 0.95× bare on hot names";
                if !bench::goal(what, &within(LINGERING, BARE), 0.95) {
                    time_goes(LINGERING);
                }
            }
            Names::Distinct => {
                let what = "coalesced no slower than coalesce_reads(false) on distinct names";
                bench::goal(what, &within(COALESCED, APART), 0.97);
            }
        }
    }
    let mut conn = conn;
    // The lingering app's shares are released a linger after their last read.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let left: Vec<String> = redis::cmd("KEYS")
        .arg("bench-rw*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(left.is_empty(), "locks were left held: {left:?}");
}
