//! `sqlx::claim`: the claim in an sqlx transaction commits with the transaction's effect or
//! not at all, and a second claim of the key after the first committed answers
//! `AlreadyClaimed` with the first claim's time.

#![cfg(feature = "sqlx")]

use crate::support;

use std::time::{Duration, SystemTime};

use sqlx::postgres::PgPoolOptions;
use tower_lease::Idempotency;
use tower_lease_postgres::ClaimError;

const PAYMENTS: Idempotency = Idempotency::new("payments", Duration::from_secs(3600));

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_commits_with_its_transaction_and_a_second_one_is_refused() {
    let server = support::server().await;
    // The store installs the schema the claims live in.
    let _store = support::pg_store(&server).await;
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&server.url())
        .await
        .unwrap();
    sqlx::query("CREATE TABLE charges (receipt bigserial, key text NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let key = support::claimed_key(PAYMENTS, "order-17").await;

    // Rolled back: nothing claimed, nothing charged.
    let mut tx = pool.begin().await.unwrap();
    tower_lease_postgres::sqlx::claim(&mut tx, &key)
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let before = SystemTime::now() - Duration::from_secs(1);
    let mut tx = pool.begin().await.unwrap();
    let receipt: i64 =
        sqlx::query_scalar("INSERT INTO charges (key) VALUES ($1) RETURNING receipt")
            .bind(key.key())
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    tower_lease_postgres::sqlx::claim(&mut tx, &key)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    // The retry after a crash: charged already, so no second charge.
    let mut tx = pool.begin().await.unwrap();
    let again = tower_lease_postgres::sqlx::claim(&mut tx, &key).await;
    tx.rollback().await.unwrap();
    let Err(ClaimError::AlreadyClaimed { claimed_at }) = again else {
        panic!("the second claim: {again:?}");
    };
    assert!(
        claimed_at >= before && claimed_at <= SystemTime::now() + Duration::from_secs(1),
        "the first claim's time: {claimed_at:?}"
    );
    let charges: i64 = sqlx::query_scalar("SELECT count(*) FROM charges")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!((charges, receipt), (1, 1), "one charge, the committed one");

    // Another key is its own.
    let other = support::claimed_key(PAYMENTS, "order-18").await;
    let mut tx = pool.begin().await.unwrap();
    tower_lease_postgres::sqlx::claim(&mut tx, &other)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}
