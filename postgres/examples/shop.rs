//! A shop on PostgreSQL alone: three replicas share one database for their data and their
//! locks. The catalog exports under a read lease and reprices under the write lease
//! (`RwLockLayer`); checkout charges under `IdempotencyLayer`, claiming the idempotency key in
//! the charge's own transaction (`claim_in`), so a retry never charges twice, even after a run
//! that committed and then failed before its response was stored.
//!
//! ```text
//! DATABASE_URL=postgres://shop@127.0.0.1/shop cargo run -p tower-lease-postgres --example shop
//! ```
//!
//! Its migration applies `schema_sql` for the schema `shop_locks` beside the shop's own tables,
//! and the replicas' stores do not install anything (`install_schema(false)`), as a database
//! user without `CREATE` runs them. Clients retry a purchase with one `Idempotency-Key` on
//! every timeout or cut connection, and a third of the purchases fail once after their charge
//! committed. The example exits non-zero unless every purchase was charged exactly once and its
//! client got that charge's receipt, no export saw a half-repriced catalog, and no repricing
//! was lost.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Extension, Router};
use rand::Rng;
use tokio::net::TcpListener;
use tower_lease::extract;
use tower_lease::{Idempotency, IdempotencyKey, IdempotencyLayer, RwLock, RwLockLayer, Store};
use tower_lease_postgres::deadpool_postgres::{Manager, Pool};
use tower_lease_postgres::{ClaimError, PgStore, claim_in, schema_sql, tokio_postgres};

/// The schema of the locks, created by the shop's migration.
const LOCKS: &str = "shop_locks";
const CATALOG: RwLock<str> = RwLock::new("catalog", Duration::from_secs(5));
/// Purchases are replayed for a day; a charge takes well under the 2 s reservation lease.
const PURCHASES: Idempotency =
    Idempotency::new("checkout", Duration::from_secs(24 * 3600)).lease(Duration::from_secs(2));

const REPLICAS: usize = 3;
const PRODUCTS: [&str; 3] = ["kettle", "teapot", "mug"];

/// The shop's own tables, and the lock schema, in one migration.
async fn migrate(db: &Pool) -> Result<(), Box<dyn std::error::Error>> {
    let mut client = db.get().await?;
    let tx = client.transaction().await?;
    tx.batch_execute(&schema_sql(LOCKS)).await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS shop_catalog (
             shop text, product text, version bigint NOT NULL, PRIMARY KEY (shop, product));
         CREATE TABLE IF NOT EXISTS shop_payments (
             id bigserial PRIMARY KEY, idempotency_key text NOT NULL, purchase text NOT NULL)",
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

#[derive(Clone)]
struct App {
    db: Pool,
    /// Purchases whose first run fails after its charge committed.
    fail_once: Arc<Mutex<HashSet<String>>>,
    answered_from_record: Arc<AtomicUsize>,
}

fn internal(e: impl std::fmt::Display) -> (StatusCode, String) {
    (StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

/// Every product's version, read one by one: a repricing between two reads would show.
async fn export(
    State(app): State<App>,
    Path(shop): Path<String>,
) -> Result<String, (StatusCode, String)> {
    let db = app.db.get().await.map_err(internal)?;
    let mut versions = Vec::new();
    for product in PRODUCTS {
        tokio::time::sleep(Duration::from_millis(2)).await;
        let row = db
            .query_one(
                "SELECT version FROM shop_catalog WHERE shop = $1 AND product = $2",
                &[&shop, &product],
            )
            .await
            .map_err(internal)?;
        versions.push(row.get::<_, i64>(0).to_string());
    }
    Ok(versions.join(","))
}

/// Raises every product's version by one, one product at a time.
async fn reprice(
    State(app): State<App>,
    Path(shop): Path<String>,
) -> Result<String, (StatusCode, String)> {
    let db = app.db.get().await.map_err(internal)?;
    let row = db
        .query_one(
            "SELECT max(version) FROM shop_catalog WHERE shop = $1",
            &[&shop],
        )
        .await
        .map_err(internal)?;
    let next = row.get::<_, i64>(0) + 1;
    for product in PRODUCTS {
        tokio::time::sleep(Duration::from_millis(2)).await;
        db.execute(
            "UPDATE shop_catalog SET version = $3 WHERE shop = $1 AND product = $2",
            &[&shop, &product, &next],
        )
        .await
        .map_err(internal)?;
    }
    Ok(format!("{shop} repriced: version {next}"))
}

/// Charges once per key: the charge and the key's claim commit together.
async fn buy(
    State(app): State<App>,
    Extension(key): Extension<IdempotencyKey>,
    purchase: String,
) -> Result<(StatusCode, String), (StatusCode, String)> {
    let mut client = app.db.get().await.map_err(internal)?;
    let tx = client.transaction().await.map_err(internal)?;
    let row = tx
        .query_one(
            "INSERT INTO shop_payments (idempotency_key, purchase) VALUES ($1, $2) RETURNING id",
            &[&key.key(), &purchase],
        )
        .await
        .map_err(internal)?;
    let id: i64 = row.get(0);
    let charging = Duration::from_millis(rand::rng().random_range(5..40));
    tokio::time::sleep(charging).await;
    match claim_in(LOCKS, &tx, &key).await {
        Ok(()) => tx.commit().await.map_err(internal)?,
        // Charged by an earlier run whose response was never stored: the same receipt, from
        // the record, and no second charge.
        Err(ClaimError::AlreadyClaimed { .. }) => {
            tx.rollback().await.map_err(internal)?;
            app.answered_from_record.fetch_add(1, Ordering::SeqCst);
            let row = client
                .query_one(
                    "SELECT id FROM shop_payments WHERE idempotency_key = $1",
                    &[&key.key()],
                )
                .await
                .map_err(internal)?;
            return Ok((
                StatusCode::CREATED,
                format!("payment {}", row.get::<_, i64>(0)),
            ));
        }
        Err(e) => return Err(internal(e)),
    }
    if app.fail_once.lock().unwrap().remove(&purchase) {
        // Committed, then failed before answering, as a replica that dies there: the layer
        // stores no response, and the retry runs this handler again.
        return Err((StatusCode::SERVICE_UNAVAILABLE, "replica failed".to_owned()));
    }
    Ok((StatusCode::CREATED, format!("payment {id}")))
}

async fn replica(url: &str, n: usize, app: App) -> Result<SocketAddr, Box<dyn std::error::Error>> {
    let store = PgStore::builder()
        .schema(LOCKS)
        .install_schema(false)
        .application_name(format!("shop-{n}"))
        .max_connections(24)
        .connect(url)
        .await?
        .expect_concurrency(24);
    for warning in store.check().await? {
        println!("replica {n}: lock store: {warning}");
    }
    let store: Store = store.into();
    let app = Router::new()
        .route(
            "/catalog/{shop}",
            get(export).put(reprice).route_layer(
                RwLockLayer::new(store.clone(), CATALOG, extract::path_segment(1))
                    .max_wait(Duration::from_secs(3)),
            ),
        )
        .route(
            "/buy",
            post(buy).route_layer(
                IdempotencyLayer::new(store, PURCHASES).max_wait(Duration::from_secs(1)),
            ),
        )
        .with_state(app);
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(addr)
}

/// Exports and repricings of `shop` from `clients` clients on random replicas: answers the
/// exports that saw a half-repriced catalog, the exports and the repricings answered `200`.
async fn catalog_run(replicas: &[SocketAddr], shop: &str) -> (usize, usize, usize) {
    let (torn, exports, repricings) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let client = reqwest::Client::new();
    let runs = (0..6).map(|_| async {
        for _ in 0..20 {
            let addr = replicas[rand::rng().random_range(0..replicas.len())];
            let url = format!("http://{addr}/catalog/{shop}");
            let write = rand::rng().random_bool(0.2);
            let request = if write {
                client.put(&url)
            } else {
                client.get(&url)
            };
            let Ok(reply) = request.send().await else {
                continue;
            };
            if reply.status() != StatusCode::OK {
                continue;
            }
            let body = reply.text().await.unwrap_or_default();
            if write {
                repricings.fetch_add(1, Ordering::SeqCst);
            } else {
                exports.fetch_add(1, Ordering::SeqCst);
                if body.split(',').collect::<HashSet<_>>().len() != 1 {
                    torn.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    });
    futures_util::future::join_all(runs).await;
    (
        torn.into_inner(),
        exports.into_inner(),
        repricings.into_inner(),
    )
}

/// Buys `purchase` until a receipt comes: each attempt is given up after 300 ms, and a third
/// are cut at a random moment; every retry carries the same key.
async fn purchase(
    client: &reqwest::Client,
    replicas: &[SocketAddr],
    key: &str,
    purchase: &str,
) -> String {
    for _ in 0..200 {
        let addr = replicas[rand::rng().random_range(0..replicas.len())];
        let give_up = if rand::rng().random_bool(1.0 / 3.0) {
            Duration::from_millis(rand::rng().random_range(0..60))
        } else {
            Duration::from_millis(300)
        };
        let send = client
            .post(format!("http://{addr}/buy"))
            .header("idempotency-key", format!("\"{key}\""))
            .body(purchase.to_owned())
            .send();
        if let Ok(Ok(reply)) = tokio::time::timeout(give_up, send).await
            && reply.status() == StatusCode::CREATED
            && let Ok(Ok(receipt)) = tokio::time::timeout(give_up, reply.text()).await
        {
            return receipt;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{purchase}: no receipt after 200 tries");
}

/// The first live leases the view `leases` of the lock schema lists, looked at every 10 ms.
async fn leases_seen(db: Pool) -> Result<Vec<String>, tokio_postgres::Error> {
    let client = db.get().await.expect("a connection");
    for _ in 0..300 {
        let rows = client
            .query(
                "SELECT kind, namespace, holder FROM shop_locks.leases LIMIT 3",
                &[],
            )
            .await?;
        if !rows.is_empty() {
            return Ok(rows
                .iter()
                .map(|r| {
                    let (kind, namespace, holder): (String, String, String) =
                        (r.get(0), r.get(1), r.get(2));
                    format!("{kind} of {namespace}, held by {holder}")
                })
                .collect());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(Vec::new())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Ok(url) = std::env::var("DATABASE_URL") else {
        eprintln!("set DATABASE_URL to a PostgreSQL database, e.g. postgres://shop@127.0.0.1/shop");
        std::process::exit(2);
    };
    let config: tokio_postgres::Config = url.parse()?;
    let db = Pool::builder(Manager::new(config, tokio_postgres::NoTls))
        .max_size(24)
        .build()?;
    migrate(&db).await?;
    // Names of this run's own, so a database shared with earlier runs counts only this one.
    let run = format!("{}-{}", std::process::id(), rand::rng().random::<u32>());
    let shop = format!("acme-{run}");
    let products = &PRODUCTS[..];
    let insert = "INSERT INTO shop_catalog SELECT $1, unnest($2::text[]), 0";
    db.get().await?.execute(insert, &[&shop, &products]).await?;
    let purchases: Vec<String> = (0..60).map(|p| format!("purchase-{run}-{p}")).collect();
    let app = App {
        db: db.clone(),
        fail_once: Arc::new(Mutex::new(purchases.iter().step_by(3).cloned().collect())),
        answered_from_record: Arc::default(),
    };
    let mut replicas = Vec::new();
    for n in 0..REPLICAS {
        replicas.push(replica(&url, n, app.clone()).await?);
    }

    let (torn, exports, repricings) = catalog_run(&replicas, &shop).await;
    let version: i64 = db
        .get()
        .await?
        .query_one(
            "SELECT min(version) FROM shop_catalog WHERE shop = $1",
            &[&shop],
        )
        .await?
        .get(0);
    println!(
        "catalog: {exports} exports, {torn} of them half-repriced; {repricings} repricings, \
         the catalog at version {version}"
    );

    // What an operator sees while checkout runs: the live leases, and who holds them.
    let view = tokio::spawn(leases_seen(db.clone()));
    let client = reqwest::Client::new();
    let receipts: HashMap<String, String> =
        futures_util::future::join_all(purchases.iter().map(|p| {
            let (client, replicas) = (&client, &replicas);
            async move {
                let key = format!("key-{p}");
                (p.clone(), purchase(client, replicas, &key, p).await)
            }
        }))
        .await
        .into_iter()
        .collect();
    for lease in view.await?? {
        println!("  seen in shop_locks.leases: {lease}");
    }
    // Cut requests may still be charging: let them land before counting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut charges: HashMap<String, Vec<i64>> = HashMap::new();
    let rows = db
        .get()
        .await?
        .query(
            "SELECT purchase, id FROM shop_payments WHERE purchase LIKE $1",
            &[&format!("purchase-{run}-%")],
        )
        .await?;
    for row in rows {
        charges.entry(row.get(0)).or_default().push(row.get(1));
    }
    let wrong = purchases
        .iter()
        .filter(|p| match charges.get(*p).map(Vec::as_slice) {
            Some([id]) => receipts.get(*p) != Some(&format!("payment {id}")),
            _ => true,
        })
        .count();
    let charged: usize = charges.values().map(Vec::len).sum();
    let from_record = app.answered_from_record.load(Ordering::SeqCst);
    println!(
        "checkout: {charged} charges for {} purchases, {wrong} charged other than once or \
         answered with another receipt, {from_record} answered from the record",
        purchases.len()
    );

    let catalog_kept = torn == 0 && exports > 0 && repricings > 0 && version == repricings as i64;
    if !catalog_kept || wrong != 0 || from_record == 0 {
        eprintln!(
            "FAILED: expected no half-repriced export, every repricing kept, every purchase \
             charged once with its own receipt, and the failed ones answered from the record"
        );
        std::process::exit(1);
    }
    println!("every purchase charged exactly once, every export whole, across {REPLICAS} replicas");
    Ok(())
}
