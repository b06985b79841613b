//! A catalog behind [`RwLockLayer`], as a team runs one: three replicas (each its own store
//! handle) in front of one store, four shops, twenty closed-loop clients; a `GET` works 5 ms
//! under the shop's read lease, a reprice `PUT` 30 ms under its write lease. Clients honour
//! `Retry-After` (a refused request is sent again after it, for up to 5 s from its first send).
//!
//! ```text
//! cargo bench --all-features --bench catalog
//! BENCH_SECONDS=30 CATALOG_STORES=redis,postgres cargo bench --all-features --bench catalog
//! ```
//!
//! For each store (memory, Redis, PostgreSQL), share of writes (2 % and 15 %) and policy, it
//! prints the share of GETs and PUTs answered `2xx` at their first send and within their
//! patience, the p50/p99 of each from first send to `2xx`, and the overlaps the handlers saw (a
//! marker per shop counts readers and writers inside; a write beside anyone is an overlap).
//! Goals with the catalog configuration (the layer's defaults, which wait up to 2 s): 0 overlaps,
//! ≥ 99.9 % of GETs and of PUTs answered `2xx`, PUT p99 ≤ 3 × 30 ms + 5 ms, GET p99 ≤ 5 ms +
//! 30 ms; with no wait (`.max_wait(Duration::ZERO)`), no side below 95 %.
//!
//! First, for each share of writes, a reference with no store: the same handlers behind one
//! fair `tokio::sync::RwLock` per shop in this one process, which shows what the requests'
//! queueing alone costs at this load; a catalog row that misses its goals prints its p99s as
//! multiples of the reference's. `CATALOG_WRITES=2,15` and `CATALOG_POLICIES=phase-fair;…`
//! (parts of the policies' names, `;`-separated) choose the runs.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::get;
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Empty};
use tower_lease::{Fairness, RedisStore, RwLock, RwLockLayer, Store, extract};
use tower_lease_harness::bench::{self, Redis};
use tower_lease_harness::http::{Sender, connect, serve};
use tower_lease_harness::postgres::PgServer;
use tower_lease_postgres::PgStore;

const REPLICAS: usize = 3;
const SHOPS: usize = 4;
const CLIENTS: usize = 20;
const READ: Duration = Duration::from_millis(5);
const WRITE: Duration = Duration::from_millis(30);
/// How long a client keeps sending one request again after `Retry-After`.
const PATIENCE: Duration = Duration::from_secs(5);
const TTL: Duration = Duration::from_secs(10);

/// One way to configure the catalog: the lock's policy and the layer's wait (`None`: the
/// layer's default, 2 s).
struct Policy {
    name: &'static str,
    lock: RwLock<str>,
    max_wait: Option<Duration>,
    /// Held to the catalog goals (the README's configuration), or to those without a wait
    /// (95 %).
    catalog: bool,
}

/// What a run is held to.
#[derive(Clone, Copy, PartialEq)]
enum Goals {
    /// The README's configuration, the layer's defaults: the catalog goals.
    Catalog,
    /// No side below 95 % within its patience.
    NoWait,
    /// None: the in-process reference, for what queueing alone costs.
    Reference,
}

fn policies() -> Vec<Policy> {
    let lock = RwLock::new("catalog", TTL);
    let wait = Some(Duration::from_secs(2));
    let at_once = Some(Duration::ZERO);
    vec![
        Policy {
            name: "readers-first, no wait",
            lock: lock.fairness(Fairness::ReadersFirst),
            max_wait: at_once,
            catalog: false,
        },
        Policy {
            name: "writers-first, max_wait(2 s)",
            lock: lock.fairness(Fairness::WritersFirst),
            max_wait: wait,
            catalog: false,
        },
        Policy {
            name: "phase-fair, no wait",
            lock,
            max_wait: at_once,
            catalog: false,
        },
        Policy {
            name: "phase-fair (defaults)",
            lock,
            max_wait: None,
            catalog: true,
        },
    ]
}

/// Readers and writers inside one shop's handlers right now, and how often a write met anyone.
#[derive(Default)]
struct Marker {
    shops: [AtomicI64; SHOPS],
    overlaps: AtomicU64,
}

/// A writer counts as this many readers, so one number says who is inside.
const WRITER: i64 = 1 << 20;

impl Marker {
    fn enter(&self, shop: usize, weight: i64) {
        let before = self.shops[shop].fetch_add(weight, Ordering::SeqCst);
        if before != 0 && (weight == WRITER || before >= WRITER) {
            self.overlaps.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn leave(&self, shop: usize, weight: i64) {
        self.shops[shop].fetch_sub(weight, Ordering::SeqCst);
    }
}

async fn work(marker: &Marker, shop: &str, weight: i64, time: Duration) -> StatusCode {
    let Some(shop) = shop.parse::<usize>().ok().filter(|&s| s < SHOPS) else {
        return StatusCode::NOT_FOUND;
    };
    marker.enter(shop, weight);
    tokio::time::sleep(time).await;
    marker.leave(shop, weight);
    StatusCode::OK
}

fn app(marker: Arc<Marker>, layer: RwLockLayer<extract::PathSegment>) -> Router {
    let read = |State(m): State<Arc<Marker>>, Path(shop): Path<String>| async move {
        work(&m, &shop, 1, READ).await
    };
    let write = |State(m): State<Arc<Marker>>, Path(shop): Path<String>| async move {
        work(&m, &shop, WRITER, WRITE).await
    };
    Router::new()
        .route("/shops/{shop}", get(read).put(write))
        .route_layer(layer)
        .with_state(marker)
}

/// The reference: the same handlers behind one `tokio::sync::RwLock` per shop in this one
/// process (fair: a queued writer holds off the reads that come after it, and the lock goes
/// to waiters in the order they came), with no store and no layer. What it answers is what
/// the requests' queueing alone costs at this load.
fn reference_app(marker: Arc<Marker>, locks: Arc<[tokio::sync::RwLock<()>; SHOPS]>) -> Router {
    let shop_lock = |locks: &Arc<[tokio::sync::RwLock<()>; SHOPS]>, shop: &str| {
        let shop = shop.parse::<usize>().ok().filter(|&s| s < SHOPS)?;
        Some((locks.clone(), shop))
    };
    let read = {
        let (marker, locks) = (marker.clone(), locks.clone());
        move |Path(shop): Path<String>| async move {
            let Some((locks, i)) = shop_lock(&locks, &shop) else {
                return StatusCode::NOT_FOUND;
            };
            let _read = locks[i].read().await;
            work(&marker, &shop, 1, READ).await
        }
    };
    let write = move |Path(shop): Path<String>| async move {
        let Some((locks, i)) = shop_lock(&locks, &shop) else {
            return StatusCode::NOT_FOUND;
        };
        let _write = locks[i].write().await;
        work(&marker, &shop, WRITER, WRITE).await
    };
    Router::new().route("/shops/{shop}", get(read).put(write))
}

/// What the clients saw of one kind of request.
#[derive(Default)]
struct Side {
    sent: u64,
    first: u64,
    served: u64,
    refusals: u64,
    errors: u64,
    latencies_ns: Vec<u64>,
}

impl Side {
    fn share(&self, n: u64) -> f64 {
        100.0 * n as f64 / self.sent.max(1) as f64
    }

    fn quantile_ms(&self, q: f64) -> f64 {
        bench::quantile_us(&mut self.latencies_ns.clone(), q) / 1000.0
    }
}

/// One request sent until it is answered `2xx`, refused past its patience, or fails.
async fn request(sender: &mut Sender, host: &str, method: Method, shop: usize, side: &mut Side) {
    let first_sent = Instant::now();
    side.sent += 1;
    let mut first = true;
    loop {
        let req = http::Request::builder()
            .method(method.clone())
            .uri(format!("/shops/{shop}"))
            .header(http::header::HOST, host)
            .body(Empty::new())
            .unwrap();
        sender.ready().await.expect("connection closed");
        let res = sender.send_request(req).await.expect("request failed");
        let status = res.status();
        let retry_after = res
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
            .map(Duration::from_secs);
        res.into_body().collect().await.expect("body failed");
        if status.is_success() {
            side.served += 1;
            side.first += u64::from(first);
            side.latencies_ns
                .push(first_sent.elapsed().as_nanos() as u64);
            return;
        }
        let refused = matches!(status, StatusCode::CONFLICT | StatusCode::LOCKED);
        match retry_after {
            Some(after) if refused && first_sent.elapsed() + after <= PATIENCE => {
                side.refusals += 1;
                first = false;
                tokio::time::sleep(after).await;
            }
            _ if refused => {
                side.refusals += 1;
                return;
            }
            _ => {
                side.errors += 1;
                return;
            }
        }
    }
}

/// Twenty clients for `length`, each on its own connection to replica `i % 3`, each request
/// a `PUT` with probability `writes`.
async fn drive(replicas: &[SocketAddr], writes: f64, length: Duration) -> (Side, Side) {
    let deadline = Instant::now() + length;
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let addr = replicas[i % replicas.len()];
        let mut sender = connect(addr, 1).await.pop().unwrap();
        let host = addr.to_string();
        clients.push(tokio::spawn(async move {
            let (mut gets, mut puts) = (Side::default(), Side::default());
            while Instant::now() < deadline {
                let shop = rand::random_range(0..SHOPS);
                if rand::random_bool(writes) {
                    request(&mut sender, &host, Method::PUT, shop, &mut puts).await;
                } else {
                    request(&mut sender, &host, Method::GET, shop, &mut gets).await;
                }
            }
            (gets, puts)
        }));
    }
    let (mut gets, mut puts) = (Side::default(), Side::default());
    for client in clients {
        let (g, p) = client.await.expect("a client panicked");
        for (all, one) in [(&mut gets, g), (&mut puts, p)] {
            all.sent += one.sent;
            all.first += one.first;
            all.served += one.served;
            all.refusals += one.refusals;
            all.errors += one.errors;
            all.latencies_ns.extend(one.latencies_ns);
        }
    }
    (gets, puts)
}

/// Where the catalog keeps its leases: three handles on one store, as three replicas have.
enum Backing {
    Memory,
    Redis(Redis),
    Postgres(PgServer),
}

impl Backing {
    fn name(&self) -> &'static str {
        match self {
            Backing::Memory => "memory",
            Backing::Redis(_) => "Redis",
            Backing::Postgres(_) => "PostgreSQL",
        }
    }

    async fn replicas(&self) -> Vec<Store> {
        match self {
            // One process: the replicas share one store, its rooms and its shares.
            Backing::Memory => vec![Store::memory(); REPLICAS],
            Backing::Redis(redis) => {
                let mut stores = Vec::new();
                for _ in 0..REPLICAS {
                    let url = tower_lease_harness::Endpoint::url(redis);
                    let store = RedisStore::connect(&url).await.expect("a RedisStore");
                    stores.push(store.prefix("bench-catalog").into());
                }
                stores
            }
            Backing::Postgres(server) => {
                let mut stores = Vec::new();
                for _ in 0..REPLICAS {
                    let store = PgStore::connect(&server.url()).await.expect("a PgStore");
                    stores.push(store.into());
                }
                stores
            }
        }
    }
}

fn seconds() -> Duration {
    let seconds = std::env::var("BENCH_SECONDS")
        .ok()
        .map(|v| {
            v.parse::<u64>()
                .expect("BENCH_SECONDS must be a whole number")
        })
        .unwrap_or(10);
    Duration::from_secs(seconds.max(1))
}

fn main() {
    let length = seconds();
    let wanted = std::env::var("CATALOG_STORES").unwrap_or("memory,redis,postgres".to_owned());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("\nmachine: {}", bench::machine());
    println!(
        "{REPLICAS} replicas, {SHOPS} shops, {CLIENTS} closed-loop clients, GET {READ:?}, PUT \
         {WRITE:?}, {length:?} per run; a refused request is sent again after its Retry-After \
         for up to {PATIENCE:?}\n"
    );
    println!(
        "| store | writes | policy | GET 2xx first | GET 2xx | GET p50 / p99 ms | PUT 2xx first | PUT 2xx | PUT p50 / p99 ms | overlaps | goals |"
    );
    println!("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|");
    let mut missed = 0;
    let writes_wanted = std::env::var("CATALOG_WRITES").unwrap_or("2,15".to_owned());
    let writes_wanted: Vec<f64> = writes_wanted
        .split(',')
        .map(|w| {
            w.trim()
                .parse::<f64>()
                .expect("CATALOG_WRITES: whole percents")
                / 100.0
        })
        .collect();
    // The reference's p99s (GET, PUT) by share of writes, which each catalog row compares with.
    let references: Vec<(f64, (f64, f64))> = writes_wanted
        .iter()
        .map(|&writes| (writes, runtime.block_on(reference(writes, length))))
        .collect();
    for store in wanted.split(',').filter(|s| !s.trim().is_empty()) {
        let backing = match store.trim() {
            "memory" => Backing::Memory,
            "redis" => Backing::Redis(Redis::start()),
            "postgres" => Backing::Postgres(PgServer::start()),
            other => panic!("CATALOG_STORES: unknown store {other:?}"),
        };
        // One set of replicas' stores for every run: a run's servers live on with their stores,
        // and PostgreSQL counts every pooled connection against its `max_connections`.
        let stores = runtime.block_on(backing.replicas());
        let policy_wanted = std::env::var("CATALOG_POLICIES").unwrap_or_default();
        for &writes in &writes_wanted {
            for policy in policies().into_iter().filter(|p| {
                policy_wanted.is_empty()
                    || policy_wanted.split(';').any(|w| p.name.contains(w.trim()))
            }) {
                let reference = references.iter().find(|r| r.0 == writes).map(|r| r.1);
                let run = run(backing.name(), &stores, writes, &policy, reference, length);
                let line = runtime.block_on(run);
                missed += usize::from(!line);
            }
        }
    }
    println!("\nload average after: {}", bench::load_average());
    if missed > 0 {
        println!("{missed} runs missed their goals");
    }
}

/// The reference run: [`reference_app`] on three servers of this process; answers its p99s,
/// GET's and PUT's.
async fn reference(writes: f64, length: Duration) -> (f64, f64) {
    let marker = Arc::new(Marker::default());
    let locks = Arc::new(std::array::from_fn(|_| tokio::sync::RwLock::new(())));
    let mut replicas = Vec::new();
    for _ in 0..REPLICAS {
        replicas.push(serve(reference_app(marker.clone(), locks.clone())).await);
    }
    let name = "tokio RwLock per shop, one process (reference)";
    let goals = Goals::Reference;
    let (_, p99s) = measure(
        "none", &replicas, &marker, writes, name, goals, None, length,
    )
    .await;
    p99s
}

/// One run; prints its row and answers whether it met its goals.
async fn run(
    backing: &str,
    stores: &[Store],
    writes: f64,
    policy: &Policy,
    reference: Option<(f64, f64)>,
    length: Duration,
) -> bool {
    let marker = Arc::new(Marker::default());
    let mut replicas = Vec::new();
    for store in stores {
        let mut layer = RwLockLayer::new(store.clone(), policy.lock, extract::path_segment(1));
        if let Some(wait) = policy.max_wait {
            layer = layer.max_wait(wait);
        }
        replicas.push(serve(app(marker.clone(), layer)).await);
    }
    let goals = match policy.catalog {
        true => Goals::Catalog,
        false => Goals::NoWait,
    };
    let name = policy.name;
    let (met, _) = measure(
        backing, &replicas, &marker, writes, name, goals, reference, length,
    )
    .await;
    met
}

/// Drives the clients against `replicas` for `length` after a warm-up, prints the row (with
/// its p99s as multiples of the `reference`'s, for a catalog row that missed its goals: what
/// queueing alone would cost), and answers whether it met its goals, and its p99s (GET, PUT).
#[allow(clippy::too_many_arguments)]
async fn measure(
    backing: &str,
    replicas: &[SocketAddr],
    marker: &Marker,
    writes: f64,
    name: &str,
    goals: Goals,
    reference: Option<(f64, f64)>,
    length: Duration,
) -> (bool, (f64, f64)) {
    // Warm up the connections, the pools and the scripts.
    drive(replicas, writes, Duration::from_millis(300)).await;
    let overlaps_before = marker.overlaps.load(Ordering::Relaxed);
    let (gets, puts) = drive(replicas, writes, length).await;
    let overlaps = marker.overlaps.load(Ordering::Relaxed) - overlaps_before;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let (get_p99, put_p99) = (gets.quantile_ms(0.99), puts.quantile_ms(0.99));
    let met = match goals {
        Goals::Catalog => {
            overlaps == 0
                && gets.share(gets.first) >= 99.9
                && puts.share(puts.first) >= 99.9
                && put_p99 <= ms(WRITE * 3 + READ)
                && get_p99 <= ms(READ) + ms(WRITE)
        }
        Goals::NoWait => {
            overlaps == 0 && gets.share(gets.served) >= 95.0 && puts.share(puts.served) >= 95.0
        }
        Goals::Reference => true,
    };
    let errors = gets.errors + puts.errors;
    let against_reference = match (goals, met, reference) {
        (Goals::Catalog, false, Some((get, put))) => format!(
            " (p99s {:.1}× GET, {:.1}× PUT the reference's)",
            get_p99 / get,
            put_p99 / put
        ),
        _ => String::new(),
    };
    println!(
        "| {} | {:.0} % | {} | {:.1} % | {:.1} % | {:.0} / {:.0} | {:.1} % | {:.1} % | {:.0} / {:.0} | {overlaps} | {}{against_reference}{} |",
        backing,
        writes * 100.0,
        name,
        gets.share(gets.first),
        gets.share(gets.served),
        gets.quantile_ms(0.5),
        get_p99,
        puts.share(puts.first),
        puts.share(puts.served),
        puts.quantile_ms(0.5),
        put_p99,
        match (goals, met) {
            (Goals::Catalog, true) => "catalog goals met",
            (Goals::Catalog, false) => "catalog goals MISSED",
            (Goals::NoWait, true) => "≥ 95 % met",
            (Goals::NoWait, false) => "≥ 95 % MISSED",
            (Goals::Reference, _) => "reference",
        },
        if errors > 0 {
            format!(", {errors} errors")
        } else {
            String::new()
        },
    );
    (met, (get_p99, put_p99))
}
