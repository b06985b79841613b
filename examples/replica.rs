//! One replica of a counter service whose handler is a lost-update race: it reads a counter from
//! Redis, works a little, and writes the counter + 1 back. `LockLayer` makes the read-modify-write
//! exclusive per counter across every replica that shares the Redis. The fault tests start this
//! example several times as separate processes.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example replica
//! curl -X POST http://127.0.0.1:<port>/counters/visits/increment
//! ```
//!
//! Environment:
//!
//! - `REDIS_URL` (required): the Redis holding the leases and the counters.
//! - `REDIS_CLUSTER` (with feature `cluster`, instead of `REDIS_URL`): comma-separated node URLs
//!   of a Redis Cluster.
//! - `LISTEN` (default `127.0.0.1:0`): where to serve; the address is printed as
//!   `listening on <addr>` on the first line of stdout.
//! - `LOCK_TTL_MS` (default 2000): the lease TTL.
//! - `WORK_MS` (default 2): how long the handler works between read and write; a request header
//!   `x-work-ms` overrides it for one request.
//! - `STORE_TIMEOUT_MS` (default 1000): the timeout of every lease call.
//! - `LOCKED` (default `1`): `0` serves without `LockLayer`, to watch updates get lost.
//! - `WAIT_MS` (default 0): how long a request waits for a held counter, pool or document
//!   before `409` (`429` for a pool); waiters are woken by release notifications on a single
//!   Redis. At 0 the documents' reads and writes are refused at once, as the fault tests
//!   measure them, not after the `RwLockLayer`'s default wait.
//! - `PERMITS` (default 3): how many requests of one pool may run at once across the replicas.
//! - `READ_MS` (default 50): how long a read of a document takes.
//! - `FAIRNESS` (default `phase_fair`): the documents' `RwLock`'s policy, `phase_fair`,
//!   `readers_first` or `writers_first`.
//! - `COALESCE_READS` (default `1`): `0` gives every read of a document a reader lease of its
//!   own instead of sharing one per document in this process.
//! - `RELAY_READS` (default `0`): `1` keeps each read of a document inside, after `READ_MS`,
//!   until a later read entered (`docs:{name}:entered`), a read was refused after it entered
//!   (`docs:{name}:refused`, which the caller counts), or `docs:{name}:stop` is set: reads
//!   handed on like a baton, which overlap however long a machine pauses.
//!
//! `POST /counters/{name}/increment` answers `200` with the new value, `409` while another
//! request holds the counter, `503` when the store fails or the lease was lost.
//!
//! `GET /docs/{name}` and `PUT /docs/{name}` read and write a document under an `RwLockLayer`;
//! they keep a witness in Redis, across replicas: `docs:{name}:readers` counts the reads inside,
//! and `docs:{name}:overlaps` counts the reads and writes that found the other inside (it must
//! stay 0).
//!
//! `POST /pools/{name}/enter` runs under one of the pool's `PERMITS` permits (`429` when all are
//! taken): it counts itself in Redis at `pool:{name}:inside` while it works, and keeps the most
//! ever inside at `pool:{name}:most`, so a test can see whether the limit held.

use std::io::Write;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use redis::AsyncCommands;
use redis::aio::{ConnectionLike, ConnectionManager};
use tokio::net::TcpListener;
use tower_lease::{
    Lock, LockLayer, RedisStore, RwLock, RwLockLayer, Semaphore, SemaphoreLayer, Store, extract,
};

#[derive(Clone)]
struct App<C> {
    counters: C,
    work: Duration,
    read: Duration,
    relay: bool,
}

/// A read of a document: inside for `READ_MS`, counted in the witness.
async fn read_doc<C>(
    State(app): State<App<C>>,
    Path(name): Path<String>,
) -> Result<&'static str, (StatusCode, String)>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut conn = app.counters.clone();
    let failed = |e: redis::RedisError| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    let (readers, writing) = (
        format!("docs:{name}:readers"),
        format!("docs:{name}:writing"),
    );
    let () = conn.incr(&readers, 1).await.map_err(failed)?;
    let writer: bool = conn.exists(&writing).await.map_err(failed)?;
    if writer {
        let () = conn
            .incr(format!("docs:{name}:overlaps"), 1)
            .await
            .map_err(failed)?;
    }
    let (entered, refused) = (
        format!("docs:{name}:entered"),
        format!("docs:{name}:refused"),
    );
    let relayed: Option<(i64, Option<i64>)> = match app.relay {
        true => Some((
            conn.incr(&entered, 1).await.map_err(failed)?,
            conn.get(&refused).await.map_err(failed)?,
        )),
        false => None,
    };
    tokio::time::sleep(app.read).await;
    if let Some((me, refused_before)) = relayed {
        loop {
            let now: (i64, Option<i64>, bool) = redis::pipe()
                .get(&entered)
                .get(&refused)
                .exists(format!("docs:{name}:stop"))
                .query_async(&mut conn)
                .await
                .map_err(failed)?;
            if now.0 > me || now.1 != refused_before || now.2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let () = conn.decr(&readers, 1).await.map_err(failed)?;
    Ok("read")
}

/// A write of a document: it must find no read inside, and no read may start during it.
async fn write_doc<C>(
    State(app): State<App<C>>,
    Path(name): Path<String>,
) -> Result<&'static str, (StatusCode, String)>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut conn = app.counters.clone();
    let failed = |e: redis::RedisError| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    let (readers, writing) = (
        format!("docs:{name}:readers"),
        format!("docs:{name}:writing"),
    );
    let () = conn.set(&writing, 1).await.map_err(failed)?;
    let inside: Option<i64> = conn.get(&readers).await.map_err(failed)?;
    if inside.unwrap_or(0) > 0 {
        let () = conn
            .incr(format!("docs:{name}:overlaps"), 1)
            .await
            .map_err(failed)?;
    }
    tokio::time::sleep(app.work).await;
    let () = conn.del(&writing).await.map_err(failed)?;
    Ok("written")
}

async fn increment<C>(
    State(app): State<App<C>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<String, (StatusCode, String)>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let work = headers
        .get("x-work-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .map_or(app.work, Duration::from_millis);
    let key = format!("counter:{name}");
    let mut conn = app.counters.clone();
    let failed = |e: redis::RedisError| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    // Deliberately not atomic: only the lease keeps two replicas from interleaving here.
    let value: Option<u64> = conn.get(&key).await.map_err(failed)?;
    tokio::time::sleep(work).await;
    let next = value.unwrap_or(0) + 1;
    let () = conn.set(&key, next).await.map_err(failed)?;
    Ok(next.to_string())
}

/// Counts the request in, and the most ever inside, in one step.
const ENTER: &str = "local n = redis.call('INCR', KEYS[1]) \
    if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end \
    return n";

async fn enter<C>(
    State(app): State<App<C>>,
    Path(name): Path<String>,
) -> Result<String, (StatusCode, String)>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let (inside, most) = (
        format!("pool:{{{name}}}:inside"),
        format!("pool:{{{name}}}:most"),
    );
    let mut conn = app.counters.clone();
    let failed = |e: redis::RedisError| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string());
    let now: u64 = redis::Script::new(ENTER)
        .key(&inside)
        .key(&most)
        .invoke_async(&mut conn)
        .await
        .map_err(failed)?;
    tokio::time::sleep(app.work).await;
    let _: i64 = conn.decr(&inside, 1).await.map_err(failed)?;
    Ok(now.to_string())
}

fn env_ms(name: &str, default: u64) -> Result<Duration, String> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map(Duration::from_millis)
            .map_err(|e| format!("{name}={v}: {e}")),
        Err(_) => Ok(Duration::from_millis(default)),
    }
}

/// Serves the counters with leases on `leases` and counters on `counters`.
async fn serve<C>(
    leases: C,
    counters: C,
    notifications: Option<redis::Client>,
) -> Result<(), Box<dyn std::error::Error>>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:0".to_owned());
    let ttl = env_ms("LOCK_TTL_MS", 2000)?;
    let work = env_ms("WORK_MS", 2)?;
    let timeout = env_ms("STORE_TIMEOUT_MS", 1000)?;
    let wait = env_ms("WAIT_MS", 0)?;
    let read = env_ms("READ_MS", 50)?;
    let flag = |name: &str, default: bool| match std::env::var(name).as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => default,
    };

    let mut store = RedisStore::new(leases).timeout(timeout);
    if let Some(client) = notifications {
        store = store.notifications(client);
    }
    let store: Store = store.into();
    for warning in store.check().await? {
        eprintln!("warning: {warning}");
    }
    let permits = std::env::var("PERMITS").map_or(Ok(3), |v| v.parse())?;
    let lock: Lock<str> = Lock::try_new("counter", ttl)?;
    let fairness = match std::env::var("FAIRNESS").as_deref() {
        Ok("readers_first") => tower_lease::Fairness::ReadersFirst,
        Ok("writers_first") => tower_lease::Fairness::WritersFirst,
        _ => tower_lease::Fairness::PhaseFair,
    };
    let docs: RwLock<str> = RwLock::try_new("docs", ttl)?.fairness(fairness);
    let docs = RwLockLayer::new(store.clone(), docs, extract::path_segment(1))
        .max_wait(wait)
        .coalesce_reads(flag("COALESCE_READS", true));
    let docs = Router::new()
        .route("/docs/{name}", get(read_doc::<C>).put(write_doc::<C>))
        .route_layer(docs);
    let pool: Semaphore<str> = Semaphore::try_new("pool", permits, ttl)?;
    let counter = Router::new().route("/counters/{name}/increment", post(increment::<C>));
    let pools = Router::new().route("/pools/{name}/enter", post(enter::<C>));
    let app = if std::env::var("LOCKED").as_deref() == Ok("0") {
        counter.merge(pools)
    } else {
        let locked = LockLayer::new(store.clone(), lock, extract::path_segment(1)).max_wait(wait);
        let limited = SemaphoreLayer::new(store, pool, extract::path_segment(1)).max_wait(wait);
        counter
            .route_layer(locked)
            .merge(pools.route_layer(limited))
    };
    let app = app.merge(docs).with_state(App {
        counters,
        work,
        read,
        relay: flag("RELAY_READS", false),
    });

    let listener = TcpListener::bind(&listen).await?;
    let mut stdout = std::io::stdout();
    writeln!(stdout, "listening on {}", listener.local_addr()?)?;
    stdout.flush()?;
    axum::serve(listener, app).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    #[cfg(feature = "cluster")]
    if let Ok(nodes) = std::env::var("REDIS_CLUSTER") {
        let client = redis::cluster::ClusterClient::new(nodes.split(','))?;
        let conn = client.get_async_connection().await?;
        return serve(conn.clone(), conn, None).await;
    }
    let url =
        std::env::var("REDIS_URL").map_err(|_| "set REDIS_URL, e.g. redis://127.0.0.1:6379/")?;
    let client = redis::Client::open(url)?;
    let leases = ConnectionManager::new(client.clone()).await?;
    let counters = ConnectionManager::new(client.clone()).await?;
    serve(leases, counters, Some(client)).await
}
