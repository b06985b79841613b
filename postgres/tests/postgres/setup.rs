//! The schema installed once when replicas connect at once, and what `PgStore::check` finds.

use crate::support;

use std::time::Duration;

use tower_lease::{Lock, Store};
use tower_lease_postgres::deadpool_postgres::{Manager, Pool};
use tower_lease_postgres::{PgStore, PgWarning};

const JOBS: Lock<str> = Lock::new("setup", Duration::from_secs(5));

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_connecting_at_once_install_the_schema_once() {
    let server = support::server().await;
    let url = server.url();
    let connects = (0..8).map(|_| PgStore::connect(&url));
    let stores = futures_util::future::join_all(connects).await;
    let stores: Vec<Store> = stores
        .into_iter()
        .map(|store| store.expect("every replica connects").into())
        .collect();
    let versions: i64 = support::client(&url)
        .await
        .query_one("SELECT count(*) FROM tower_lease.schema_version", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(versions, 1);
    // Every one of them works on the same locks.
    let token = JOBS.try_lock(&stores[0], "x").await.unwrap().expect("free");
    for store in &stores[1..] {
        assert!(JOBS.try_lock(store, "x").await.unwrap().is_none());
    }
    assert!(token.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_asynchronous_commit_a_small_pool_and_no_listener() {
    let server = support::server().await;
    let url = server.url();
    let store = support::pg_store(&server).await;
    assert_eq!(store.check().await.unwrap(), []);

    support::client(&url)
        .await
        .batch_execute("ALTER ROLE postgres SET synchronous_commit = off")
        .await
        .unwrap();
    let config: tokio_postgres::Config = url.parse().unwrap();
    let pool = Pool::builder(Manager::new(config, tokio_postgres::NoTls))
        .max_size(4)
        .build()
        .unwrap();
    let store = PgStore::from_pool(pool)
        .await
        .unwrap()
        .expect_concurrency(32);
    let found = store.check().await.unwrap();
    assert_eq!(
        found,
        [
            PgWarning::AsynchronousCommit,
            PgWarning::SmallPool {
                pool: 4,
                expected: 32
            },
            PgWarning::NoNotifications,
        ]
    );
    for warning in &found {
        assert!(!warning.to_string().is_empty());
    }
    // Through the store's handle, as an application checks any store at startup.
    let words: Vec<String> = found.iter().map(ToString::to_string).collect();
    let through_handle = tower_lease::Store::from(store).check().await.unwrap();
    let expected: Vec<_> = words
        .into_iter()
        .map(tower_lease::backend::Warning::Backend)
        .collect();
    assert_eq!(through_handle, expected);
}
