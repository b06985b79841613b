//! `PgStore` beside the lock one writes by hand on the same PostgreSQL server (*the minimum*):
//! a `Lock` cycle, and `LockLayer` over HTTP against a hand-written `from_fn` middleware.
//!
//! ```text
//! cargo bench -p tower-lease-postgres --bench pg
//! BENCH_ROUNDS=15 BENCH_ROUND_MS=1000 cargo bench -p tower-lease-postgres --bench pg
//! TOWER_LEASE_PG_SETTINGS='fsync=on full_page_writes=on' cargo bench -p tower-lease-postgres --bench pg
//! ```
//!
//! The benchmark starts its own server (`PgServer`: an `initdb` cluster on a free loopback
//! port, `fsync=off` unless `TOWER_LEASE_PG_SETTINGS` says otherwise), with `pg_stat_statements` loaded but not
//! tracking until the last part.
//!
//! The minimum is a table of its own (`name` primary key, `token`, `expires`) and two prepared
//! statements, each sent on a connection checked out of a pool like `PgStore`'s
//! (deadpool-postgres, 16 connections, fast recycling): `INSERT … ON CONFLICT (name) DO UPDATE
//! … WHERE expired`, the expiry on the server's clock, and `DELETE … WHERE name AND token`.
//!
//! 1. Lock cycles (`try_lock` + `release`, a name per task) at 1 and 16 tasks: the minimum,
//!    `PgStore`, and two variants that split the difference: `PgStore`'s own SQL functions
//!    called by hand like the minimum (the server's share of the difference, against the
//!    client's), and the same with a copy of the release function that sends no `NOTIFY`; and
//!    a lone read of an `RwLock` (`try_read` + `release`), what a catalog's `GET` pays alone.
//! 2. HTTP: one axum app (`POST /jobs/{name}`, a random name per request) behind a hand-written
//!    `from_fn` middleware on the minimum (`409` when held, the release after the handler),
//!    behind `LockLayer` on `PgStore`, and behind the same `from_fn` middleware around
//!    `Lock::attempt` on `PgStore` (the layer's cost apart from the cycle's), and behind
//!    `IdempotencyLayer` on `PgStore` with a fresh `Idempotency-Key` per request (its first
//!    request: look-up and reservation, the handler, the stored record); 16 keep-alive
//!    connections each.
//!
//! Every variant runs once per round, in an order that rotates from round to round; ratios are
//! medians of the ratios within each round, with the rounds' p25–p75. Client CPU is this
//! process's (the load generator and the HTTP apps included), server CPU the postmaster's and
//! its children's. Every cycle checks its own result, and the benchmark checks that it left no
//! lease behind.
//!
//! 3. Where the time goes: with `pg_stat_statements` tracking every statement, the statements
//!    (round trips) per cycle and the server's execution time per cycle and per statement
//!    inside the functions; and `EXPLAIN ANALYZE` of each statement and function, one at a time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::StatusCode;
use tower_lease::{Idempotency, IdempotencyLayer, Lock, LockLayer, RwLock, Store, extract};
use tower_lease_harness::PgServer;
use tower_lease_harness::bench::{self, Op, Settings, median, op, quantile_us};
use tower_lease_harness::http::{Sender, connect, serve};
use tower_lease_postgres::PgStore;
use tower_lease_postgres::deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tower_lease_postgres::tokio_postgres::types::ToSql;
use tower_lease_postgres::tokio_postgres::{self, Client, NoTls};

const TTL: Duration = Duration::from_secs(10);
const TTL_MS: i64 = 10_000;
const LOCK: Lock<str> = Lock::new("bench", TTL);
const JOBS: Lock<str> = Lock::new("jobs", TTL);
const DOCS: RwLock<str> = RwLock::new("bench-docs", TTL);
const ORDERS: Idempotency = Idempotency::new("bench-orders", Duration::from_secs(120));
const CONCURRENCY: [usize; 2] = [1, 16];
/// HTTP connections per app: as many as each pool has connections.
const CONNECTIONS: usize = 16;
/// `PgStore::connect`'s pool, and the minimum's.
const POOL: usize = 16;

const HAND_TABLE: &str = "CREATE TABLE bench_hand_locks (
    name text PRIMARY KEY, token bytea NOT NULL, expires timestamptz NOT NULL)";
/// Takes the lock when nobody holds it or its holder's lease ran out: one row affected.
const HAND_ACQUIRE: &str = "INSERT INTO bench_hand_locks AS l (name, token, expires)
    VALUES ($1, $2, clock_timestamp() + make_interval(secs => $3::bigint / 1000.0))
    ON CONFLICT (name) DO UPDATE SET token = excluded.token, expires = excluded.expires
    WHERE l.expires <= clock_timestamp()";
const HAND_RELEASE: &str = "DELETE FROM bench_hand_locks WHERE name = $1 AND token = $2";

/// `PgStore`'s own functions, called by hand.
/// `sql`'s calls of the schema's functions named as this version installs them
/// (`tower_lease.lock_release` as `tower_lease.lock_release_v9`), kept for the run.
fn versioned(sql: &'static str) -> &'static str {
    let version = tower_lease_postgres::SCHEMA_VERSION;
    let named = ["lock_acquire", "lock_release"]
        .iter()
        .fold(sql.to_owned(), |sql, name| {
            sql.replace(
                &format!("tower_lease.{name}("),
                &format!("tower_lease.{name}_v{version}("),
            )
        });
    Box::leak(named.into_boxed_str())
}

const FN_ACQUIRE: &str =
    "SELECT acquired FROM tower_lease.lock_acquire($1, $2, $3, $4::bigint, false)";
const FN_RELEASE: &str = "SELECT tower_lease.lock_release($1, $2, $3) AS released";
/// A copy of `lock_release` without its `NOTIFY`, made by the benchmark.
const QUIET_RELEASE: &str = "SELECT bench_lock_release_quiet($1, $2, $3) AS released";

const MINIMUM: &str = "minimum: INSERT … ON CONFLICT + DELETE";
const PG_LOCK: &str = "PgStore: Lock try_lock + release";
const FUNCTIONS: &str = "diagnostic: PgStore's functions, called by hand";
const QUIET: &str = "diagnostic: the same, release without NOTIFY";
const PG_READ: &str = "diagnostic: PgStore: RwLock try_read + release (a lone read)";
const PG_FIRST: &str = "diagnostic: IdempotencyLayer first request, oneshot, no HTTP";

const HAND_HTTP: &str = "from_fn lock by hand on the minimum";
const LAYER_HTTP: &str = "LockLayer on PgStore";
const LOCK_FN_HTTP: &str = "diagnostic: from_fn around Lock::attempt on PgStore";
const FIRST_HTTP: &str = "IdempotencyLayer on PgStore, first request";

fn main() {
    let settings = Settings::from_env(15, 300);
    // On the main thread: the server dies with the thread that started it.
    let mut server = PgServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    // pg_stat_statements needs a restart to load; it tracks nothing until the last part.
    runtime.block_on(async {
        let admin = client(&server.url()).await;
        admin
            .batch_execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
            .await
            .unwrap();
    });
    server.restart();
    runtime.block_on(bench(&server, settings));
}

async fn client(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect to the benchmark's postgres");
    tokio::spawn(connection);
    client
}

/// Runs each statement in a transaction of its own (`ALTER SYSTEM` refuses to run in one with
/// others).
async fn each(client: &Client, statements: &[&str]) {
    for statement in statements {
        client.batch_execute(statement).await.unwrap();
    }
}

/// A pool like the one `PgStore::connect` makes.
fn pool(url: &str) -> Pool {
    let config: tokio_postgres::Config = url.parse().unwrap();
    let manager = Manager::from_config(
        config,
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager).max_size(POOL).build().unwrap()
}

/// The lock one writes by hand: two prepared statements, each on a connection from the pool.
#[derive(Clone)]
struct Hand {
    pool: Pool,
    acquire: &'static str,
    release: &'static str,
}

impl Hand {
    /// Whether the lock was taken.
    async fn acquire(&self, name: &str, token: &[u8]) -> Result<bool, tokio_postgres::Error> {
        let client = self.pool.get().await.expect("a connection from the pool");
        let statement = client.prepare_cached(self.acquire).await?;
        if self.acquire == HAND_ACQUIRE {
            return Ok(client
                .execute(&statement, &[&name, &token, &TTL_MS])
                .await?
                == 1);
        }
        let name = name.as_bytes();
        let params: [&(dyn ToSql + Sync); 4] = [&"bench-fn", &name, &token, &TTL_MS];
        let row = client.query_one(&statement, &params).await?;
        Ok(row.get("acquired"))
    }

    /// Whether our lease was there to release.
    async fn release(&self, name: &str, token: &[u8]) -> Result<bool, tokio_postgres::Error> {
        let client = self.pool.get().await.expect("a connection from the pool");
        let statement = client.prepare_cached(self.release).await?;
        if self.release == HAND_RELEASE {
            return Ok(client.execute(&statement, &[&name, &token]).await? == 1);
        }
        let name = name.as_bytes();
        let row = client
            .query_one(&statement, &[&"bench-fn", &name, &token])
            .await?;
        Ok(row.get("released"))
    }
}

/// One name per task, so that every acquisition is uncontended and must succeed.
fn names(prefix: &str) -> Arc<Vec<String>> {
    let most = CONCURRENCY.iter().max().unwrap();
    Arc::new((0..*most).map(|t| format!("{prefix}{t}")).collect())
}

fn hand_cycle(hand: Hand, prefix: &str) -> Op {
    let names = names(prefix);
    op(move |task, _| {
        let (hand, names) = (hand.clone(), names.clone());
        async move {
            let name = names[task].as_str();
            let token: [u8; 16] = rand::random();
            let taken = hand.acquire(name, &token).await.expect("acquire by hand");
            assert!(taken, "the hand-written lock was held");
            let released = hand.release(name, &token).await.expect("release by hand");
            assert!(released, "the hand-written release found no lease");
        }
    })
}

fn store_cycle(store: Store) -> Op {
    let names = names("store-");
    op(move |task, _| {
        let (store, names) = (store.clone(), names.clone());
        async move {
            let token = LOCK
                .try_lock(&store, names[task].as_str())
                .await
                .expect("try_lock")
                .expect("the lock was held");
            assert!(token.release().await.expect("release"), "released nothing");
        }
    })
}

/// A read of an `RwLock` nobody else reads or writes: what a catalog's lone `GET` pays.
fn store_read_cycle(store: Store) -> Op {
    let names = names("read-");
    op(move |task, _| {
        let (store, names) = (store.clone(), names.clone());
        async move {
            let token = DOCS
                .try_read(&store, names[task].as_str())
                .await
                .expect("try_read")
                .expect("the read was refused");
            assert!(token.release().await.expect("release"), "released nothing");
        }
    })
}

/// One request with a fresh `Idempotency-Key` through `IdempotencyLayer`, sent with `oneshot`
/// and its body read: the statements of a first request, in section 3.
fn first_request(store: Store) -> Op {
    use tower::ServiceExt;
    let app = app().route_layer(IdempotencyLayer::new(store, ORDERS));
    op(move |_, _| {
        let app = app.clone();
        async move {
            let req = http::Request::post("/jobs/o")
                .header("idempotency-key", format!("{:x}", rand::random::<u128>()))
                .body(axum::body::Body::empty())
                .unwrap();
            let res = app.oneshot(req).await.expect("infallible");
            assert_eq!(res.status(), StatusCode::OK, "a first request failed");
            axum::body::to_bytes(res.into_body(), usize::MAX)
                .await
                .expect("the body");
        }
    })
}

/// CPU time (user + system) of the postmaster and every process it started.
fn server_cpu(postmaster: u32) -> Duration {
    let mut total = bench::cpu_time_of(postmaster).unwrap_or_default();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return total;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: the name may hold spaces and parentheses.
        let ppid = stat.rfind(')').and_then(|at| {
            stat[at + 1..]
                .split_whitespace()
                .nth(1)?
                .parse::<u32>()
                .ok()
        });
        if ppid == Some(postmaster) {
            total += bench::cpu_time_of(pid).unwrap_or_default();
        }
    }
    total
}

/// One variant's figures, one entry per round, in round order.
#[derive(Default)]
struct Row {
    rates: Vec<f64>,
    p50s: Vec<f64>,
    client_cpu: Vec<f64>,
    server_cpu: Vec<f64>,
}

impl Row {
    fn push(&mut self, ops: u64, elapsed: Duration, client: Duration, server: Duration) {
        let per_op = |d: Duration| d.as_secs_f64() * 1e6 / ops as f64;
        self.rates.push(ops as f64 / elapsed.as_secs_f64());
        self.client_cpu.push(per_op(client));
        self.server_cpu.push(per_op(server));
    }
}

/// The median and the p25–p75 of `values`.
fn spread(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    let mid = median(&mut sorted);
    let quartile = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    (mid, quartile(0.25), quartile(0.75))
}

/// The ratios of `a` to `b` within each round.
fn within(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(a, b)| a / b).collect()
}

fn ratio_cell(ratios: &[f64]) -> String {
    let (mid, p25, p75) = spread(ratios);
    format!("{mid:.3} ({p25:.3}–{p75:.3})")
}

struct Counts {
    ok: AtomicU64,
    conflict: AtomicU64,
}

/// Drives `senders` for `length` with a random name per request, and with `keyed` a fresh
/// `Idempotency-Key` too; answers the requests.
async fn drive(
    senders: &mut Vec<Sender>,
    host: &str,
    length: Duration,
    counts: &Counts,
    keyed: bool,
) -> u64 {
    let host = host.to_owned();
    let request = move |_| {
        let mut req = http::Request::post(format!("/jobs/{:x}", rand::random::<u64>()))
            .header(http::header::HOST, &host);
        if keyed {
            req = req.header("idempotency-key", format!("{:x}", rand::random::<u128>()));
        }
        req.body(Default::default()).unwrap()
    };
    let check = move |_, head: &http::response::Parts| match head.status {
        StatusCode::OK if keyed && head.headers.contains_key("idempotent-replayed") => {
            panic!("a fresh key was replayed")
        }
        StatusCode::OK => {}
        // Two random names of 64 bits that meet: possible, not expected.
        StatusCode::CONFLICT => {}
        other => panic!("unexpected status {other}"),
    };
    let driven = bench::drive(senders, length, request, check).await;
    let (ok, conflict) = (
        driven.count(StatusCode::OK),
        driven.count(StatusCode::CONFLICT),
    );
    counts.ok.fetch_add(ok, Ordering::Relaxed);
    counts.conflict.fetch_add(conflict, Ordering::Relaxed);
    ok + conflict
}

async fn work() -> &'static str {
    "done"
}

fn app() -> Router {
    Router::new().route("/jobs/{name}", post(work))
}

/// The lock middleware one writes without this crate, on the minimum: `409` when held, the
/// release after the handler.
async fn hand_lock(
    State(hand): State<Hand>,
    Path(name): Path<String>,
    req: Request,
    next: Next,
) -> Response {
    let token: [u8; 16] = rand::random();
    match hand.acquire(&name, &token).await {
        Ok(true) => {}
        Ok(false) => return (StatusCode::CONFLICT, "held").into_response(),
        Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
    let res = next.run(req).await;
    let released = hand.release(&name, &token).await;
    assert!(
        released.expect("the hand-written release failed"),
        "the hand-written release found no lease"
    );
    res
}

/// The same middleware around [`Lock::attempt`] on `PgStore`: between the two others, it tells
/// the cost of the layer from the cost of the `Lock` cycle.
async fn lock_middleware(
    State(store): State<Store>,
    Path(name): Path<String>,
    req: Request,
    next: Next,
) -> Response {
    let token = match JOBS.attempt(&store, &name).await {
        Ok(tower_lease::Attempt::Acquired(token)) => token,
        Ok(tower_lease::Attempt::Busy { .. }) => {
            return (StatusCode::CONFLICT, "held").into_response();
        }
        Err(_) => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
    };
    let res = next.run(req).await;
    assert!(token.release().await.expect("the release failed"));
    res
}

/// Makes `bench_lock_release_quiet`: `tower_lease.lock_release` without its `NOTIFY`. False
/// when the function no longer reads as expected.
async fn make_quiet_release(admin: &Client) -> bool {
    let row = admin
        .query_one(
            versioned(
                "SELECT pg_get_functiondef('tower_lease.lock_release(text,bytea,bytea)'::regprocedure)",
            ),
            &[],
        )
        .await
        .unwrap();
    let definition: String = row.get(0);
    // The schema's name is quoted in the installed text: the line, whatever precedes the call.
    let notify = format!(
        ".notify_v{}('e', lock_namespace, lock_name);",
        tower_lease_postgres::SCHEMA_VERSION
    );
    let release = format!(".lock_release_v{}(", tower_lease_postgres::SCHEMA_VERSION);
    if !definition.contains(&notify) {
        return false;
    }
    let quiet: String = definition
        .lines()
        .filter(|line| !line.contains(&notify))
        .map(|line| format!("{line}\n"))
        .collect();
    let Some(at) = quiet.find(&release) else {
        return false;
    };
    let start = quiet[..at]
        .rfind("FUNCTION ")
        .map_or(0, |f| f + "FUNCTION ".len());
    let quiet = format!(
        "{}public.bench_lock_release_quiet({}",
        &quiet[..start],
        &quiet[at + release.len()..]
    );
    admin.batch_execute(&quiet).await.unwrap();
    true
}

async fn bench(server: &PgServer, settings: Settings) {
    let url = server.url();
    let postmaster = server.pid().expect("the postmaster's pid");
    let admin = client(&url).await;
    let version: String = admin
        .query_one("SHOW server_version", &[])
        .await
        .unwrap()
        .get(0);
    each(
        &admin,
        &[
            "CREATE EXTENSION pg_stat_statements",
            "ALTER SYSTEM SET pg_stat_statements.track = 'none'",
            "ALTER SYSTEM SET pg_stat_statements.track_utility = off",
            "SELECT pg_reload_conf()",
            HAND_TABLE,
        ],
    )
    .await;
    // What the server runs with: `fsync` is off in the harness's servers, unless
    // `TOWER_LEASE_PG_SETTINGS` turns it on.
    let fsync_now: String = admin
        .query_one("SELECT current_setting('fsync')", &[])
        .await
        .unwrap()
        .get(0);
    let load_before = bench::load_average();

    let store: Store = PgStore::connect(&url).await.expect("PgStore").into();
    let hand_pool = pool(&url);
    let minimum = Hand {
        pool: hand_pool.clone(),
        acquire: HAND_ACQUIRE,
        release: HAND_RELEASE,
    };
    let functions = Hand {
        pool: hand_pool.clone(),
        acquire: versioned(FN_ACQUIRE),
        release: versioned(FN_RELEASE),
    };
    let mut cycles: Vec<(&str, Op)> = vec![
        (MINIMUM, hand_cycle(minimum.clone(), "hand-")),
        (PG_LOCK, store_cycle(store.clone())),
        (FUNCTIONS, hand_cycle(functions, "fn-")),
        (PG_READ, store_read_cycle(store.clone())),
        (PG_FIRST, first_request(store.clone())),
    ];
    if make_quiet_release(&admin).await {
        let quiet = Hand {
            pool: hand_pool.clone(),
            acquire: versioned(FN_ACQUIRE),
            release: QUIET_RELEASE,
        };
        cycles.push((QUIET, hand_cycle(quiet, "quiet-")));
    } else {
        println!("(lock_release has changed: no variant without NOTIFY)");
    }

    // 1. Lock cycles.
    let mut cycle_rows: Vec<Vec<Row>> = Vec::new();
    for tasks in CONCURRENCY {
        // Warm-up: every pooled connection opened and its statements prepared.
        for (_, op) in &cycles {
            bench::run(op, tasks, Duration::from_millis(200)).await;
        }
        let mut rows: Vec<Row> = cycles.iter().map(|_| Row::default()).collect();
        for round in 0..settings.rounds {
            for k in 0..cycles.len() {
                let v = (k + round) % cycles.len();
                let (client, server) = (bench::cpu_time(), server_cpu(postmaster));
                let mut run = bench::run(&cycles[v].1, tasks, settings.round).await;
                let (client, server) =
                    (bench::cpu_time() - client, server_cpu(postmaster) - server);
                let row = &mut rows[v];
                row.push(run.ops, run.elapsed, client, server);
                if tasks == 1 {
                    row.p50s.push(quantile_us(&mut run.latencies, 0.5));
                }
            }
        }
        cycle_rows.push(rows);
    }

    // 2. HTTP.
    let apps = [
        (
            HAND_HTTP,
            app().route_layer(middleware::from_fn_with_state(minimum.clone(), hand_lock)),
        ),
        (
            LAYER_HTTP,
            app().route_layer(LockLayer::new(
                store.clone(),
                JOBS,
                extract::path_segment(1),
            )),
        ),
        (
            LOCK_FN_HTTP,
            app().route_layer(middleware::from_fn_with_state(
                store.clone(),
                lock_middleware,
            )),
        ),
        (
            FIRST_HTTP,
            app().route_layer(IdempotencyLayer::new(store.clone(), ORDERS)),
        ),
    ];
    let mut targets = Vec::new();
    for (name, app) in apps {
        let addr = serve(app).await;
        let counts = Counts {
            ok: AtomicU64::new(0),
            conflict: AtomicU64::new(0),
        };
        targets.push((
            name,
            addr.to_string(),
            connect(addr, CONNECTIONS).await,
            counts,
        ));
    }
    let keyed = |name: &str| name == FIRST_HTTP;
    for (name, host, senders, counts) in &mut targets {
        drive(
            senders,
            host,
            Duration::from_millis(300),
            counts,
            keyed(name),
        )
        .await;
    }
    let mut http_rows: Vec<Row> = targets.iter().map(|_| Row::default()).collect();
    for round in 0..settings.rounds {
        for k in 0..targets.len() {
            let v = (k + round) % targets.len();
            let (name, host, senders, counts) = &mut targets[v];
            let (client, server, start) =
                (bench::cpu_time(), server_cpu(postmaster), Instant::now());
            let requests = drive(senders, host, settings.round, counts, keyed(name)).await;
            let elapsed = start.elapsed();
            http_rows[v].push(
                requests,
                elapsed,
                bench::cpu_time() - client,
                server_cpu(postmaster) - server,
            );
        }
    }
    let load_after = bench::load_average();

    // Nothing left behind.
    let left: i64 = admin
        .query_one("SELECT count(*) FROM bench_hand_locks", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "the hand-written locks left rows behind");
    let live: i64 = admin
        .query_one(
            "SELECT count(*) FROM tower_lease.locks
             WHERE secret IS NOT NULL AND expires > clock_timestamp()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(live, 0, "PgStore left leases held");

    println!(
        "\nPostgreSQL {version} (fsync={}), a pool of {POOL} connections for the minimum and for \
         PgStore, {} rounds of {:?} per variant",
        fsync_now, settings.rounds, settings.round
    );
    println!(
        "machine: {}, load average {load_before} before, {load_after} after\n",
        bench::cores()
    );
    println!("Lock cycles, a name per task, TTL {TTL:?}:\n");
    println!(
        "| variant | tasks | cycles/s (median) | × minimum (p25–p75) | p50 µs | client CPU µs/cycle | server CPU µs/cycle |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (tasks, rows) in CONCURRENCY.iter().zip(&cycle_rows) {
        for ((name, _), row) in cycles.iter().zip(rows) {
            let p50 = if row.p50s.is_empty() {
                "".to_owned()
            } else {
                format!("{:.0}", spread(&row.p50s).0)
            };
            println!(
                "| {name} | {tasks} | {:.0} | {} | {p50} | {:.1} | {:.1} |",
                spread(&row.rates).0,
                ratio_cell(&within(&row.rates, &rows[0].rates)),
                spread(&row.client_cpu).0,
                spread(&row.server_cpu).0,
            );
        }
    }
    println!("\nHTTP/1.1, {CONNECTIONS} connections per app, POST /jobs/<random>:\n");
    println!(
        "| app | requests/s (median) | × from_fn (p25–p75) | client CPU µs/request | server CPU µs/request | 200 | 409 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for ((name, _, _, counts), row) in targets.iter().zip(&http_rows) {
        println!(
            "| {name} | {:.0} | {} | {:.1} | {:.1} | {} | {} |",
            spread(&row.rates).0,
            ratio_cell(&within(&row.rates, &http_rows[0].rates)),
            spread(&row.client_cpu).0,
            spread(&row.server_cpu).0,
            counts.ok.load(Ordering::Relaxed),
            counts.conflict.load(Ordering::Relaxed),
        );
    }

    println!("\ngoals:");
    let mut met = Vec::new();
    for (tasks, rows) in CONCURRENCY.iter().zip(&cycle_rows) {
        met.push(bench::goal(
            &format!("PgStore Lock cycle ≥ 0.9× the minimum at {tasks} task(s)"),
            &within(&rows[1].rates, &rows[0].rates),
            0.9,
        ));
    }
    met.push(bench::goal(
        "LockLayer on PgStore ≥ 0.9× the from_fn lock on the minimum",
        &within(&http_rows[1].rates, &http_rows[0].rates),
        0.9,
    ));
    println!(
        "  (LockLayer × from_fn around Lock::attempt, both on PgStore: {})",
        ratio_cell(&within(&http_rows[1].rates, &http_rows[2].rates))
    );
    let first = within(&http_rows[3].rates, &http_rows[1].rates);
    if !bench::goal(
        "IdempotencyLayer first request ≥ 0.9× LockLayer, both on PgStore",
        &first,
        0.9,
    ) {
        met.push(false);
        let (first, layer) = (&http_rows[3], &http_rows[1]);
        println!(
            "  where the time goes: server CPU {:.1} µs per request against {:.1}, client CPU \
             {:.1} µs against {:.1}",
            spread(&first.server_cpu).0,
            spread(&layer.server_cpu).0,
            spread(&first.client_cpu).0,
            spread(&layer.client_cpu).0,
        );
    }
    // What the diagnostic variants split: the server's share (PgStore's functions by hand ×
    // the minimum) and the client's (PgStore × its functions by hand), within each round.
    println!("\nsplit (medians of the ratios within rounds):");
    for (tasks, rows) in CONCURRENCY.iter().zip(&cycle_rows) {
        let mut line = format!(
            "- {tasks} task(s): functions by hand × minimum {}; PgStore × functions by hand {}",
            ratio_cell(&within(&rows[2].rates, &rows[0].rates)),
            ratio_cell(&within(&rows[1].rates, &rows[2].rates)),
        );
        if let Some(k) = cycles.iter().position(|(name, _)| *name == QUIET) {
            line += &format!(
                "; release without NOTIFY × with {}",
                ratio_cell(&within(&rows[k].rates, &rows[2].rates)),
            );
        }
        println!("{line}");
    }

    // 3. Where the time goes.
    where_the_time_goes(&url, &admin, &cycles, settings.round).await;
    if met.iter().all(|met| *met) {
        println!("\nall goals met");
    }
}

/// Each cycle variant alone: at 1 task under `pg_stat_statements` (tracking every statement,
/// nested ones too), its statements per cycle and the server's execution time per cycle and
/// per statement; at 16 tasks, what the busy backends were doing (`pg_stat_activity`, sampled).
/// Then `EXPLAIN ANALYZE` of each statement, one at a time.
async fn where_the_time_goes(url: &str, admin: &Client, cycles: &[(&str, Op)], length: Duration) {
    each(
        admin,
        &[
            "ALTER SYSTEM SET pg_stat_statements.track = 'all'",
            "SELECT pg_reload_conf()",
        ],
    )
    .await;
    // Every pooled connection takes the new setting at its next statement.
    tokio::time::sleep(Duration::from_millis(200)).await;
    println!(
        "\nwhere the time goes: each variant alone, {length:?} at 1 task with every statement \
         tracked by pg_stat_statements (top-level statements are round trips; times are the \
         server's execution times, without parse, bind, commit and the network), then {length:?} \
         at 16 tasks with pg_stat_activity sampled every 2 ms"
    );
    let sampler = client(url).await;
    for (name, op) in cycles {
        admin
            .batch_execute("SELECT pg_stat_statements_reset()")
            .await
            .unwrap();
        let run = bench::run(op, 1, length).await;
        let rows = admin
            .query(
                "SELECT toplevel, calls, total_exec_time, query FROM pg_stat_statements
                 WHERE query NOT LIKE '%pg_stat_statements%' AND calls > $1
                 ORDER BY toplevel DESC, total_exec_time DESC",
                &[&((run.ops / 1000) as i64)],
            )
            .await
            .unwrap();
        let ops = run.ops as f64;
        let (mut statements, mut exec) = (0.0, 0.0);
        for row in &rows {
            if row.get::<_, bool>(0) {
                statements += row.get::<_, i64>(1) as f64 / ops;
                exec += row.get::<_, f64>(2) * 1000.0 / ops;
            }
        }
        println!(
            "\n{name}: {} cycles at 1 task; {statements:.2} top-level statements per cycle, \
             {exec:.1} µs of execution per cycle\n",
            run.ops
        );
        println!("| level | per cycle | µs each | µs per cycle | statement |");
        println!("|---|---:|---:|---:|---|");
        for row in &rows {
            let calls = row.get::<_, i64>(1) as f64;
            let total_us = row.get::<_, f64>(2) * 1000.0;
            if total_us / ops < 0.05 {
                continue;
            }
            let query: String = row.get(3);
            let query: String = query.split_whitespace().collect::<Vec<_>>().join(" ");
            let query: String = query.chars().take(100).collect();
            println!(
                "| {} | {:.2} | {:.1} | {:.1} | `{query}` |",
                if row.get::<_, bool>(0) {
                    "top"
                } else {
                    "nested"
                },
                calls / ops,
                total_us / calls,
                total_us / ops,
            );
        }

        // At 16 tasks: what the backends running a statement were doing.
        let deadline = Instant::now() + length;
        let load = {
            let op = op.clone();
            tokio::spawn(async move { bench::run(&op, 16, length).await })
        };
        let mut seen: std::collections::BTreeMap<String, u64> = Default::default();
        let mut samples = 0u64;
        while Instant::now() < deadline {
            let rows = sampler
                .query(
                    "SELECT coalesce(wait_event_type || ': ' || wait_event, 'running')
                     FROM pg_stat_activity
                     WHERE backend_type = 'client backend' AND state = 'active'
                       AND pid <> pg_backend_pid()",
                    &[],
                )
                .await
                .unwrap();
            samples += 1;
            for row in rows {
                *seen.entry(row.get(0)).or_default() += 1;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let run = load.await.expect("the load panicked");
        let mut seen: Vec<_> = seen.into_iter().collect();
        seen.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        let seen: Vec<String> = seen
            .iter()
            .map(|(what, n)| format!("{what} {:.2}", *n as f64 / samples as f64))
            .collect();
        println!(
            "\nat 16 tasks ({:.0} cycles/s while sampled), backends in a statement, on average: {}",
            run.per_second(),
            seen.join(", ")
        );
    }
    each(
        admin,
        &[
            "ALTER SYSTEM SET pg_stat_statements.track = 'none'",
            "SELECT pg_reload_conf()",
        ],
    )
    .await;

    // EXPLAIN ANALYZE, one call at a time on one connection: the median execution time of
    // each statement over 100 cycles.
    let explained = [
        ("minimum: INSERT … ON CONFLICT", HAND_ACQUIRE),
        ("minimum: DELETE", HAND_RELEASE),
        ("tower_lease.lock_acquire", versioned(FN_ACQUIRE)),
        ("tower_lease.lock_release", versioned(FN_RELEASE)),
    ];
    let mut times: Vec<Vec<f64>> = explained.iter().map(|_| Vec::new()).collect();
    for i in 0..100 {
        let token = rand::random::<[u8; 16]>().to_vec();
        let name = format!("explain-{i}");
        for (k, (_, sql)) in explained.iter().enumerate() {
            let literal = |sql: &str| {
                let token = format!("'\\x{}'::bytea", hex(&token));
                if sql.starts_with("SELECT") {
                    sql.replace("$1", "'bench-fn'")
                        .replace("$2", &format!("'{name}'::bytea"))
                        .replace("$3", &token)
                        .replace("$4", &TTL_MS.to_string())
                } else {
                    sql.replace("$1", &format!("'{name}'"))
                        .replace("$2", &token)
                        .replace("$3", &TTL_MS.to_string())
                }
            };
            let plan = admin
                .simple_query(&format!("EXPLAIN (ANALYZE, TIMING OFF) {}", literal(sql)))
                .await
                .unwrap();
            for message in plan {
                if let tokio_postgres::SimpleQueryMessage::Row(row) = message {
                    let line = row.get(0).unwrap_or_default();
                    if let Some(ms) = line
                        .strip_prefix("Execution Time: ")
                        .and_then(|r| r.strip_suffix(" ms"))
                    {
                        times[k].push(ms.parse::<f64>().unwrap() * 1000.0);
                    }
                }
            }
        }
    }
    println!("\nEXPLAIN ANALYZE, one statement at a time (median of 100, execution time):\n");
    for ((what, _), times) in explained.iter().zip(&mut times) {
        println!("- {what}: {:.1} µs", median(times));
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
