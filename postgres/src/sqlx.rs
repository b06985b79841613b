//! [`claim`](crate::claim) for sqlx (the `sqlx` feature): the same claim, in an sqlx transaction, for an application
//! whose queries go through sqlx and not through `tokio-postgres`.

use std::time::{Duration, SystemTime};

use tower_lease::IdempotencyKey;

use crate::backend::millis;
use crate::claim::ClaimError;
use crate::naming::Schema;

/// The claim's statement, with the first claim's time in microseconds since the Unix epoch
/// (sqlx decodes `timestamptz` only with its `chrono` or `time` feature).
const CLAIM: &str = "SELECT (extract(epoch FROM tower_lease.claimed_before($1, $2, $3)) \
                     * 1000000)::bigint AS claimed_before_us";

/// Claims the idempotency key `key` in the transaction on `tx` (an
/// `sqlx::Transaction<'_, Postgres>` derefs to it), as [`claim`](crate::claim) does in a
/// `tokio-postgres` transaction: the claim commits with the effect the transaction makes, or
/// not at all, and [`ClaimError::AlreadyClaimed`] says a committed transaction claimed the key
/// already, within its retention, so the handler answers from its own record.
///
/// ```no_run
/// use sqlx::PgPool;
/// use tower_lease::IdempotencyKey;
/// use tower_lease_postgres::ClaimError;
///
/// /// The receipt of the charge made under `key`: made now, or by an earlier run whose
/// /// response was lost.
/// async fn charge(pool: &PgPool, key: &IdempotencyKey) -> Result<i64, ClaimError> {
///     let mut tx = pool.begin().await.map_err(ClaimError::Sqlx)?;
///     let receipt: i64 =
///         sqlx::query_scalar("INSERT INTO charges (key) VALUES ($1) RETURNING receipt")
///             .bind(key.key())
///             .fetch_one(&mut *tx)
///             .await
///             .map_err(ClaimError::Sqlx)?;
///     match tower_lease_postgres::sqlx::claim(&mut tx, key).await {
///         Ok(()) => {
///             tx.commit().await.map_err(ClaimError::Sqlx)?;
///             Ok(receipt)
///         }
///         Err(ClaimError::AlreadyClaimed { .. }) => {
///             tx.rollback().await.map_err(ClaimError::Sqlx)?;
///             sqlx::query_scalar("SELECT receipt FROM charges WHERE key = $1")
///                 .bind(key.key())
///                 .fetch_one(pool)
///                 .await
///                 .map_err(ClaimError::Sqlx)
///         }
///         Err(e) => Err(e),
///     }
/// }
/// ```
pub async fn claim(tx: &mut ::sqlx::PgConnection, key: &IdempotencyKey) -> Result<(), ClaimError> {
    claim_with(Schema::default(), tx, key).await
}

/// [`claim`] for a store whose leases are in the schema `schema`, as
/// [`claim_in`](crate::claim_in).
///
/// # Panics
///
/// When `schema` is not a schema name a store takes.
pub async fn claim_in(
    schema: &str,
    tx: &mut ::sqlx::PgConnection,
    key: &IdempotencyKey,
) -> Result<(), ClaimError> {
    let schema = Schema::new(schema).unwrap_or_else(|why| panic!("claim_in: {why}"));
    claim_with(schema, tx, key).await
}

async fn claim_with(
    schema: Schema,
    tx: &mut ::sqlx::PgConnection,
    key: &IdempotencyKey,
) -> Result<(), ClaimError> {
    let retention = millis(key.retention()).max(1);
    let claimed_before: Option<i64> = ::sqlx::query_scalar(schema.statement(CLAIM))
        .bind(key.namespace())
        .bind(key.stored_name())
        .bind(retention)
        .fetch_one(tx)
        .await
        .map_err(ClaimError::Sqlx)?;
    match claimed_before {
        None => Ok(()),
        Some(micros) => Err(ClaimError::AlreadyClaimed {
            claimed_at: SystemTime::UNIX_EPOCH + Duration::from_micros(micros.max(0) as u64),
        }),
    }
}
