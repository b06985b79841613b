//! [`claim`]: an idempotency key claimed in the application's own transaction, so the effect
//! and the claim commit together.

use std::fmt;

use tokio_postgres::Transaction;
use tower_lease::IdempotencyKey;

use crate::backend::millis;

const CLAIM: &str = "SELECT tower_lease.claim($1, $2, $3) AS claimed";

/// Why [`claim`] did not claim a key.
#[derive(Debug)]
#[non_exhaustive]
pub enum ClaimError {
    /// A committed transaction claimed the key already, within the definition's retention:
    /// its effect was made. Roll back, and do not make it again.
    AlreadyClaimed,
    /// The statement failed (the transaction is aborted then, as for any failed statement).
    Postgres(tokio_postgres::Error),
}

impl fmt::Display for ClaimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClaimError::AlreadyClaimed => {
                f.write_str("the idempotency key was claimed by a committed transaction")
            }
            ClaimError::Postgres(e) => write!(f, "claiming the idempotency key failed: {e}"),
        }
    }
}

impl std::error::Error for ClaimError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClaimError::AlreadyClaimed => None,
            ClaimError::Postgres(e) => Some(e),
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
/// - a retry after the first committed and died before its response was stored is answered
///   `409` `urn:tower-lease:idempotency-outcome-unknown` (no `Retry-After`) for the
///   definition's retention: the effect was made, the response is lost, and the handler never
///   runs again; one with another fingerprint (another body under the same key) is answered
///   `422` key reused;
/// - once the first request's response is stored, retries replay it;
/// - a first request whose transaction rolled back claimed nothing: its retries run it.
///
/// A `5xx` answered after the commit does not free a claimed key either. A second run (its
/// reservation ran out while the first was still committing) finds the claim and gets
/// [`ClaimError::AlreadyClaimed`]: roll back. Claims live for the definition's retention
/// ([`IdempotencyKey::retention`]).
///
/// Claim last, just before the commit: a claim being made holds off the other claims of its
/// key (an insert into the claims' primary key) until its transaction ends.
///
/// ```no_run
/// use axum::Extension;
/// use tower_lease::IdempotencyKey;
/// use tower_lease_postgres::{claim, deadpool_postgres::Pool};
///
/// async fn pay(Extension(pool): Extension<Pool>, Extension(key): Extension<IdempotencyKey>) -> &'static str {
///     let mut client = pool.get().await.unwrap();
///     let tx = client.transaction().await.unwrap();
///     tx.execute("UPDATE accounts SET balance = balance - 10 WHERE id = 1", &[]).await.unwrap();
///     claim(&tx, &key).await.unwrap();
///     tx.commit().await.unwrap();
///     "charged"
/// }
/// ```
pub async fn claim(tx: &Transaction<'_>, key: &IdempotencyKey) -> Result<(), ClaimError> {
    let name = key.stored_name();
    let namespace = key.namespace();
    let retention = millis(key.retention()).max(1);
    let row = tx
        .query_one(CLAIM, &[&namespace, &name, &retention])
        .await
        .map_err(ClaimError::Postgres)?;
    match row
        .try_get::<_, bool>("claimed")
        .map_err(ClaimError::Postgres)?
    {
        true => Ok(()),
        false => Err(ClaimError::AlreadyClaimed),
    }
}
