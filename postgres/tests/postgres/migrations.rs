//! The schema as a migration tool applies it: `schema_sql`, a store that does not install
//! (for a role that cannot create), a schema of another name, and the versions refused.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Extension, Router};
use tower_lease::{Idempotency, IdempotencyKey, IdempotencyLayer, Lock, Store};
use tower_lease_postgres::deadpool_postgres::Pool;
use tower_lease_postgres::{ClaimError, PgStore, claim_in, schema_sql};

const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(30)).fenced();
const PAYMENTS: Idempotency =
    Idempotency::new("payments", Duration::from_secs(3600)).lease(Duration::from_secs(5));

/// Whether the schema `name` exists.
async fn schema_exists(client: &tokio_postgres::Client, name: &str) -> bool {
    client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)",
            &[&name],
        )
        .await
        .unwrap()
        .get(0)
}

/// Applies `schema_sql(schema)` in one transaction, as a migration tool does.
async fn migrate(client: &mut tokio_postgres::Client, schema: &str) {
    let tx = client.transaction().await.unwrap();
    tx.batch_execute(&schema_sql(schema)).await.unwrap();
    tx.commit().await.unwrap();
}

#[derive(Clone)]
struct App {
    pool: Pool,
    claimed: Arc<AtomicUsize>,
}

/// Claims its key in the schema `shop_locks`.
async fn pay(State(app): State<App>, Extension(key): Extension<IdempotencyKey>) -> StatusCode {
    let mut client = app.pool.get().await.unwrap();
    let tx = client.transaction().await.unwrap();
    match claim_in("shop_locks", &tx, &key).await {
        Ok(()) => {}
        Err(ClaimError::AlreadyClaimed { .. }) => return StatusCode::OK,
        Err(e) => panic!("claim: {e}"),
    }
    tx.commit().await.unwrap();
    app.claimed.fetch_add(1, Ordering::SeqCst);
    StatusCode::CREATED
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_keeps_everything_in_the_schema_it_is_given() {
    let server = support::server().await;
    let url = server.url();
    let in_schema = || PgStore::builder().schema("shop_locks").connect(&url);
    let a: Store = in_schema().await.unwrap().into();
    let b: Store = in_schema().await.unwrap().into();
    let client = support::client(&url).await;
    assert!(schema_exists(&client, "shop_locks").await);
    assert!(!schema_exists(&client, "tower_lease").await);

    // A release in the schema wakes a waiter of another store on it (its own channel).
    let held = JOBS.try_lock(&a, "nightly").await.unwrap().unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            JOBS.try_lock_for(&b, "nightly", Duration::from_secs(10))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let listed: i64 = client
        .query_one(
            "SELECT count(*) FROM shop_locks.leases WHERE namespace = 'jobs'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(listed, 1, "the view of the schema lists the lease");
    let released = tokio::time::Instant::now();
    assert!(held.release().await.unwrap());
    let taken = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("woken by the release");
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "woken by the notification, not by polling: {:?}",
        released.elapsed()
    );
    assert!(taken.release().await.unwrap());

    // A store of the default schema on the same database is another lock space.
    let other: Store = PgStore::connect(&url).await.unwrap().into();
    let held = JOBS.try_lock(&a, "weekly").await.unwrap().unwrap();
    let elsewhere = JOBS.try_lock(&other, "weekly").await.unwrap();
    assert!(elsewhere.is_some(), "another schema, another lock");
    assert!(held.release().await.unwrap());

    // `claim_in` claims in the schema.
    let app = App {
        pool: PgStore::builder()
            .schema("shop_locks")
            .connect(&url)
            .await
            .unwrap()
            .pool()
            .clone(),
        claimed: Arc::default(),
    };
    let router = Router::new()
        .route("/pay", post(pay))
        .route_layer(IdempotencyLayer::new(a.clone(), PAYMENTS))
        .with_state(app.clone());
    let addr = tower_lease_harness::http::serve(router).await;
    let reply = reqwest::Client::new()
        .post(format!("http://{addr}/pay"))
        .header("idempotency-key", "\"order-1\"")
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 201);
    assert_eq!(app.claimed.load(Ordering::SeqCst), 1);
    let claims: i64 = client
        .query_one("SELECT count(*) FROM shop_locks.claims", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(claims, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_names_are_identifiers() {
    let server = support::server().await;
    let url = server.url();
    for bad in [
        "",
        "Locks",
        "1st",
        "a-b",
        "x\"; DROP TABLE t; --",
        "pg_locks",
        &"x".repeat(64),
    ] {
        let refused = PgStore::builder()
            .schema(bad)
            .connect(&url)
            .await
            .expect_err(bad);
        assert!(
            refused.to_string().contains("schema name"),
            "{bad:?}: {refused}"
        );
    }
    // A keyword is quoted wherever the store names it.
    let store: Store = PgStore::builder()
        .schema("order")
        .connect(&url)
        .await
        .unwrap()
        .into();
    let token = JOBS.try_lock(&store, "a").await.unwrap().unwrap();
    assert!(token.fence().is_some());
    assert!(token.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_that_cannot_create_runs_on_a_migrated_schema() {
    let server = support::server().await;
    let url = server.url();
    let mut admin = support::client(&url).await;
    admin
        .batch_execute("CREATE ROLE app LOGIN; REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        .await
        .unwrap();
    let app_url = url.replace("postgres://postgres@", "postgres://app@");
    let without_install = || PgStore::builder().install_schema(false).connect(&app_url);

    let missing = without_install().await.expect_err("nothing installed");
    let said = missing.to_string();
    assert!(
        said.contains("not installed") && said.contains("schema_sql"),
        "says how to install it: {said}"
    );
    // Installing needs CREATE on the database, which the role lacks.
    let installing = PgStore::connect(&app_url).await;
    assert!(installing.is_err(), "the role cannot create the schema");

    // The migration, by the owner, with the grants the store's role needs; twice, as a tool
    // that re-applies it.
    migrate(&mut admin, "tower_lease").await;
    migrate(&mut admin, "tower_lease").await;
    admin
        .batch_execute(
            "GRANT USAGE ON SCHEMA tower_lease TO app;
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA tower_lease TO app",
        )
        .await
        .unwrap();
    for store in [without_install().await, PgStore::connect(&app_url).await] {
        let store: Store = store.expect("the migrated schema").into();
        let token = JOBS.try_lock(&store, "j").await.unwrap().unwrap();
        assert!(token.release().await.unwrap());
    }

    // A newer version that does not run beside this one: refused, both versions named; nor
    // does this version's migration go in beside it.
    let version = tower_lease_postgres::SCHEMA_VERSION;
    let newer = version + 1;
    admin
        .batch_execute(&format!(
            "INSERT INTO tower_lease.schema_version (version, oldest_peer) VALUES ({newer}, {newer})"
        ))
        .await
        .unwrap();
    let said = without_install().await.expect_err("refused").to_string();
    assert!(
        said.contains(&format!("version {newer}"))
            && said.contains(&format!("version {version}"))
            && said.contains("newer"),
        "names both versions: {said}"
    );
    let refused = admin
        .batch_execute(&schema_sql("tower_lease"))
        .await
        .expect_err("a newer schema is kept");
    let said = refused.as_db_error().map(|e| e.message().to_owned());
    assert!(
        said.as_ref()
            .is_some_and(|said| said.contains(&format!("version {newer}"))),
        "{said:?}"
    );

    // Only an older version installed: this one's functions are missing, and the refusal says
    // how to install them.
    admin
        .batch_execute(&format!(
            "DELETE FROM tower_lease.schema_version; \
             INSERT INTO tower_lease.schema_version (version) VALUES ({})",
            version - 1
        ))
        .await
        .unwrap();
    let said = without_install().await.expect_err("refused").to_string();
    assert!(
        said.contains(&format!("version {version}"))
            && said.contains(&format!("is {}", version - 1))
            && said.contains("schema_sql"),
        "names both versions: {said}"
    );
}

#[test]
fn schema_sql_names_only_its_schema() {
    let sql = schema_sql("shop_locks");
    assert!(sql.contains("CREATE SCHEMA \"shop_locks\""));
    let code: String = sql
        .lines()
        .map(|line| line.split("--").next().unwrap_or(""))
        .collect();
    assert!(!code.contains("tower_lease"), "{code}");
}
