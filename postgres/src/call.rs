//! How one call reaches the server: a pooled connection, one prepared statement, the store's
//! deadline, one more try on a connection found closed, and the connections of calls that
//! stalled, kept for the releases that give back what those calls may still take.
//!
//! A call that timed out is not undone: its statement is on the connection, and a paused or
//! slow server runs it when it gets to it. The core then releases the lease with the call's
//! secret. Sent on another connection, that release could run first and find nothing, and
//! the late acquisition would hold the lease for its whole TTL. So the connection of a
//! stalled acquisition is kept aside under its secret (until its TTL ran out), and a release
//! with that secret goes on it: PostgreSQL runs one connection's statements in order, so the
//! release runs after the acquisition.

use std::sync::Mutex;
use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use tokio::time::Instant;
use tokio_postgres::Row;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tower_lease::backend::Secret;
use tower_lease::{Error, Result};

use crate::PgStore;
use crate::session::{Answers, query_each};

/// The most stalled connections kept aside at once; past it a stalled call's connection goes
/// back to the pool, and what it takes ends with its TTL.
const MOST_STALLED: usize = 64;

/// What a call does to a lease, for the connection it goes on.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Acts<'a> {
    /// Reads, or changes what it finds under its secret: any connection.
    Plainly,
    /// May take a lease with this secret, for this long, which this statement gives back:
    /// its connection is kept aside if it stalls.
    Takes(&'a Secret, Duration, &'static str),
    /// Gives a lease with this secret back: on the connection a stalled call with it left.
    GivesBack(&'a Secret),
}

/// The connections of stalled calls, by the secret of the lease they may take.
#[derive(Default)]
pub(crate) struct Stalled {
    kept: Mutex<Vec<(Secret, Object, Instant)>>,
}

impl Stalled {
    fn keep(&self, secret: &Secret, client: Object, until: Instant) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        // Dropped ones go back to the pool; their statements run before the next one's.
        kept.retain(|(_, _, until)| *until > now);
        if kept.len() < MOST_STALLED {
            kept.push((secret.clone(), client, until));
        }
    }

    fn take(&self, secret: &Secret) -> Option<Object> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        kept.retain(|(_, _, until)| *until > now);
        let at = kept.iter().position(|(held, _, _)| held == secret)?;
        Some(kept.swap_remove(at).1)
    }
}

/// A checked-out connection with a statement on it; dropped before the answer came (the
/// deadline passed, or the caller gave up), it is kept aside for the release.
struct OnTheWire<'a> {
    client: Option<Object>,
    keep: Option<(&'a Stalled, &'a Secret, Instant)>,
}

impl Drop for OnTheWire<'_> {
    fn drop(&mut self) {
        if let (Some(client), Some((stalled, secret, until))) = (self.client.take(), self.keep) {
            stalled.keep(secret, client, until);
        }
    }
}

impl PgStore {
    /// Runs `sql` (one prepared statement answering one row) within the store's deadline.
    pub(crate) async fn row(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        acts: Acts<'_>,
    ) -> Result<Row> {
        let mut rows = self.rows(sql, &[params], acts).await?;
        rows.pop()
            .expect("one answer a statement")
            .map_err(|e| Error::Backend(Box::new(e)))
    }

    /// Runs `sql` (one prepared statement answering one row) once per set of `params`, sent
    /// together on one connection (one round trip, each its own transaction), within the
    /// store's deadline: each one's answer, in order.
    pub(crate) async fn rows(
        &self,
        sql: &'static str,
        params: &[&[&(dyn ToSql + Sync)]],
        acts: Acts<'_>,
    ) -> Result<Vec<std::result::Result<Row, tokio_postgres::Error>>> {
        let sql = self.schema.statement(sql);
        let acts = match acts {
            Acts::Takes(secret, ttl, gives_back) => {
                Acts::Takes(secret, ttl, self.schema.statement(gives_back))
            }
            other => other,
        };
        let deadline = Instant::now() + self.timeout;
        match tokio::time::timeout_at(deadline, self.rows_now(sql, params, acts)).await {
            Ok(answer) => answer,
            Err(_) => Err(Error::Timeout(self.timeout)),
        }
    }

    async fn rows_now(
        &self,
        sql: &'static str,
        params: &[&[&(dyn ToSql + Sync)]],
        acts: Acts<'_>,
    ) -> Result<Vec<std::result::Result<Row, tokio_postgres::Error>>> {
        // A server restarted or its backends terminated leave every pooled connection closed,
        // some not yet known to be: one more try than the pool has connections.
        let most_tries = self.pool.status().max_size + 1;
        let mut tries = 0;
        loop {
            tries += 1;
            let kept = match acts {
                Acts::GivesBack(secret) => self.stalled.take(secret),
                _ => None,
            };
            let client = match kept {
                Some(client) => client,
                None => checkout(&self.pool).await?,
            };
            let keep = match acts {
                Acts::Takes(secret, ttl, _) => Some((&*self.stalled, secret, Instant::now() + ttl)),
                _ => None,
            };
            let mut wire = OnTheWire {
                client: Some(client),
                keep,
            };
            let client = wire.client.as_ref().expect("just put");
            let answers = match prepare(client, sql, acts).await {
                Ok(statement) => {
                    let answers = query_each(client, self.sessions, &statement, params).await;
                    Ok(answers)
                }
                Err(e) => Err(e),
            };
            // Answered: nothing of it is left on the wire.
            let client = wire.client.take().expect("still there");
            let answers = match answers {
                Ok(Answers { rows, discard }) => {
                    let lost = rows
                        .iter()
                        .find_map(|row| row.as_ref().err().filter(|e| lost(e, &client)));
                    match lost {
                        Some(e) if tries < most_tries => {
                            tracing::debug!(error = %e, "connection lost; sending the call again");
                            drop(Object::take(client));
                            continue;
                        }
                        _ => {}
                    }
                    if discard {
                        // Its transaction's state is unknown: never back into the pool.
                        drop(Object::take(client));
                    }
                    return Ok(rows);
                }
                Err(e) => e,
            };
            if tries < most_tries && lost(&answers, &client) {
                // Never back into the pool: the next try takes another connection.
                drop(Object::take(client));
                tracing::debug!(error = %answers, "connection lost; sending the call again");
                continue;
            }
            return Err(Error::Backend(Box::new(answers)));
        }
    }
}

/// The statement of `sql` on `client`, from its cache. A call that may take a lease also has
/// the statement that gives it back prepared (in the same round trip): a release sent behind
/// a stalled call must be one message, not a prepare the server would answer first and the
/// release's deadline might never see.
async fn prepare(
    client: &Object,
    sql: &str,
    acts: Acts<'_>,
) -> Result<tokio_postgres::Statement, tokio_postgres::Error> {
    match acts {
        Acts::Takes(_, _, gives_back) => {
            let (statement, gives_back) = tokio::join!(
                client.prepare_cached(sql),
                client.prepare_cached(gives_back)
            );
            gives_back?;
            statement
        }
        _ => client.prepare_cached(sql).await,
    }
}

/// A connection from the pool.
pub(crate) async fn checkout(pool: &Pool) -> Result<Object> {
    pool.get().await.map_err(|e| Error::Backend(Box::new(e)))
}

/// Whether `error` says the connection is gone (closed, its backend terminated or the server
/// shutting down), rather than that the statement failed: then it is sent again, which every
/// function is safe to be.
fn lost(error: &tokio_postgres::Error, client: &Object) -> bool {
    if error.is_closed() || client.is_closed() {
        return true;
    }
    matches!(
        error.code(),
        Some(
            &SqlState::ADMIN_SHUTDOWN
                | &SqlState::CRASH_SHUTDOWN
                | &SqlState::CANNOT_CONNECT_NOW
                | &SqlState::CONNECTION_FAILURE
                | &SqlState::CONNECTION_EXCEPTION
        )
    )
}
