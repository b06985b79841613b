//! [`claim`]: an idempotency key claimed in the application's own transaction, so the effect
//! and the claim commit together.

use std::fmt;
use std::time::SystemTime;

use tokio_postgres::Transaction;
use tower_lease::IdempotencyKey;

use crate::backend::millis;
use crate::naming::Schema;

/// Answers NULL when the key was claimed now, else when its living claim was made.
const CLAIM: &str = "SELECT tower_lease.claimed_before($1, $2, $3) AS claimed_before";

/// Why [`claim`] did not claim a key.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClaimError {
    /// A committed transaction claimed the key already, within the definition's retention:
    /// its effect was made. Roll back, do not make it again, and answer from the record that
    /// transaction left (its response was never stored, or this run would not have started).
    AlreadyClaimed {
        /// When the committed claim was made, on the database server's clock.
        claimed_at: SystemTime,
    },
    /// The statement failed (the transaction is aborted then, as for any failed statement).
    Postgres(tokio_postgres::Error),
    /// The statement failed, sent by `sqlx::claim` (the transaction is
    /// aborted then, as for any failed statement).
    #[cfg(feature = "sqlx")]
    Sqlx(::sqlx::Error),
}

impl fmt::Display for ClaimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClaimError::AlreadyClaimed { .. } => {
                f.write_str("the idempotency key was claimed by a committed transaction")
            }
            ClaimError::Postgres(e) => write!(f, "claiming the idempotency key failed: {e}"),
            #[cfg(feature = "sqlx")]
            ClaimError::Sqlx(e) => write!(f, "claiming the idempotency key failed: {e}"),
        }
    }
}

impl std::error::Error for ClaimError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClaimError::AlreadyClaimed { .. } => None,
            ClaimError::Postgres(e) => Some(e),
            #[cfg(feature = "sqlx")]
            ClaimError::Sqlx(e) => Some(e),
        }
    }
}

/// Claims the idempotency key `key` in the transaction `tx`, so the claim commits with the
/// effect `tx` makes, or not at all.
///
/// `IdempotencyLayer` stores a request's response once its handler answered, and a retry
/// replays it. A process that dies between the handler's commit and that store leaves a key
/// with no response, and a retry would run the handler again. With the layer on a
/// [`PgStore`](crate::PgStore) of the same database, a handler that claims its key in the
/// transaction of its effect closes that gap:
///
/// - a retry while the first request still runs is answered as usual (`409` in flight, or
///   its response under `max_wait`);
/// - a retry after the first committed and died before its response was stored runs the
///   handler again, under the key's reservation as any first request (never two runs at
///   once): its `claim` answers [`ClaimError::AlreadyClaimed`] with the time of the first
///   claim, and the handler rolls back and answers from its own record (the receipt the
///   first run would have sent), which the layer stores and replays from then on. One with
///   another fingerprint (another body under the same key) is answered `422` key reused;
/// - once the first request's response is stored, retries replay it;
/// - a first request whose transaction rolled back claimed nothing: its retries run it (or,
///   under `at_most_once`, are answered `409` outcome unknown if it died).
///
/// So a handler that claims must find what its first run did by the key, and answer the
/// same. What it does before its `claim` runs again on a retry: keep it in the transaction.
/// A `5xx` answered after the commit does not free a claimed key either: the next retry runs
/// the handler again, and its claim answers `AlreadyClaimed`. A second run while the first is
/// still committing (its reservation ran out) waits for that commit in its `claim`, then gets
/// `AlreadyClaimed` too. Claims live for the definition's retention
/// ([`IdempotencyKey::retention`]), under `at_most_once` too: a claimed key is known to have
/// taken effect, so its outcome is not unknown.
///
/// Claim last, just before the commit: a claim being made holds off the other claims of its
/// key (an insert into the claims' primary key) until its transaction ends.
///
/// Any isolation level of `tx` works: the claims' primary key never lets two claims of a key
/// commit. At read committed a claim that waited for another one's commit answers
/// [`ClaimError::AlreadyClaimed`]; at repeatable read or serializable, whose snapshot is older
/// than that commit, it fails instead with a serialization error (SQLSTATE `40001`, as
/// [`ClaimError::Postgres`]): roll back and run the transaction again, as for any serialization
/// failure, and the retry's claim answers `AlreadyClaimed`.
///
/// Claims in the schema `tower_lease`, the store's default; a store built with another
/// [`schema`](crate::PgStoreBuilder::schema) claims with [`claim_in`].
///
/// The call is one statement, `SELECT tower_lease.claimed_before($1, $2, $3)` with the key's
/// [`namespace`](IdempotencyKey::namespace) (`text`), its
/// [`stored_name`](IdempotencyKey::stored_name) (`bytea`) and the retention in milliseconds
/// (`bigint`, at least 1); it answers `NULL` when it claimed the key, and the first claim's
/// `timestamptz` when the key was claimed already.
///
/// ```no_run
/// use axum::Extension;
/// use axum::http::StatusCode;
/// use tower_lease::IdempotencyKey;
/// use tower_lease_postgres::{ClaimError, claim, deadpool_postgres::Pool};
///
/// async fn pay(
///     Extension(pool): Extension<Pool>,
///     Extension(key): Extension<IdempotencyKey>,
/// ) -> Result<(StatusCode, String), StatusCode> {
///     fn error<E>(_: E) -> StatusCode {
///         StatusCode::INTERNAL_SERVER_ERROR
///     }
///     let mut client = pool.get().await.map_err(error)?;
///     let tx = client.transaction().await.map_err(error)?;
///     let row = tx
///         .query_one(
///             "INSERT INTO payments (idempotency_key, amount) VALUES ($1, 10) RETURNING id",
///             &[&key.key()],
///         )
///         .await
///         .map_err(error)?;
///     let id: i64 = row.get(0);
///     match claim(&tx, &key).await {
///         Ok(()) => {}
///         // Charged by an earlier run, whose response was lost: no second charge, and the
///         // same answer, from the record.
///         Err(ClaimError::AlreadyClaimed { .. }) => {
///             tx.rollback().await.map_err(error)?;
///             let row = client
///                 .query_one(
///                     "SELECT id FROM payments WHERE idempotency_key = $1",
///                     &[&key.key()],
///                 )
///                 .await
///                 .map_err(error)?;
///             let id: i64 = row.get(0);
///             return Ok((StatusCode::CREATED, format!("payment {id}")));
///         }
///         Err(_) => return Err(StatusCode::INTERNAL_SERVER_ERROR),
///     }
///     tx.commit().await.map_err(error)?;
///     Ok((StatusCode::CREATED, format!("payment {id}")))
/// }
/// ```
pub async fn claim(tx: &Transaction<'_>, key: &IdempotencyKey) -> Result<(), ClaimError> {
    claim_with(Schema::default(), tx, key).await
}

/// [`claim`] for a store whose leases are in the schema `schema` (the name given to
/// [`PgStoreBuilder::schema`](crate::PgStoreBuilder::schema), which
/// [`PgStore::schema_name`](crate::PgStore::schema_name) answers): the statement is
/// `SELECT <schema>.claimed_before($1, $2, $3)`.
///
/// ```no_run
/// # use tower_lease::IdempotencyKey;
/// # use tower_lease_postgres::{ClaimError, claim_in, tokio_postgres::Transaction};
/// /// The schema the application's migrations create, and its store is built with.
/// const LOCKS: &str = "shop_locks";
///
/// # async fn charge(tx: &Transaction<'_>, key: &IdempotencyKey) -> Result<(), ClaimError> {
/// claim_in(LOCKS, tx, key).await?;
/// # Ok(())
/// # }
/// ```
///
/// # Panics
///
/// When `schema` is not a schema name a store takes.
pub async fn claim_in(
    schema: &str,
    tx: &Transaction<'_>,
    key: &IdempotencyKey,
) -> Result<(), ClaimError> {
    let schema = Schema::new(schema).unwrap_or_else(|why| panic!("claim_in: {why}"));
    claim_with(schema, tx, key).await
}

async fn claim_with(
    schema: Schema,
    tx: &Transaction<'_>,
    key: &IdempotencyKey,
) -> Result<(), ClaimError> {
    let name = key.stored_name();
    let namespace = key.namespace();
    let retention = millis(key.retention()).max(1);
    let row = tx
        .query_one(schema.statement(CLAIM), &[&namespace, &name, &retention])
        .await
        .map_err(ClaimError::Postgres)?;
    match row
        .try_get::<_, Option<SystemTime>>("claimed_before")
        .map_err(ClaimError::Postgres)?
    {
        None => Ok(()),
        Some(claimed_at) => Err(ClaimError::AlreadyClaimed { claimed_at }),
    }
}
