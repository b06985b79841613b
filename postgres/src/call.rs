//! How one call reaches the server: a pooled connection, one statement (prepared, or unnamed
//! behind a transaction pooler: [`crate::statement`]), the store's deadline, one more try on a
//! connection found closed, and the connections of calls that stalled, kept for the releases
//! that give back what those calls may still take.
//!
//! A call that timed out is not undone: its statement is on the connection, and a paused or
//! slow server runs it when it gets to it. The core then releases the lease with the call's
//! secret. Sent on another connection, that release could run first and find nothing, and
//! the late acquisition would hold the lease for its whole TTL. So the connection of a
//! stalled acquisition is kept aside under its secret (until its TTL ran out), and a release
//! with that secret goes on it: PostgreSQL runs one connection's statements in order, so the
//! release runs after the acquisition.
//!
//! A release that times out on such a connection leaves it aside again, until the TTL. Any
//! other call's connection that the deadline passed with a statement on it (a plain call, a
//! release on a pooled connection) is closed, never pooled: the next call would queue behind that statement, or,
//! on a connection whose bytes a network lost, wait for an answer that never comes. The server
//! ends the statement itself within its bound (`statement_timeout`, [`crate::session`]), and
//! a statement it cancels answers [`Error::Timeout`], as the client's deadline does.

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
        expire(&mut kept);
        if kept.len() < MOST_STALLED {
            kept.push((secret.clone(), client, until));
        } else {
            // Never pooled with its statement on it; what it takes ends with its TTL.
            close(client);
        }
    }

    /// The connection kept for `secret`, and until when.
    fn take(&self, secret: &Secret) -> Option<(Object, Instant)> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        expire(&mut kept);
        let at = kept.iter().position(|(held, _, _)| held == secret)?;
        let (_, client, until) = kept.swap_remove(at);
        Some((client, until))
    }
}

/// Closes the kept connections whose lease's TTL ran out with no release for them: whether
/// their statement ever answered is not known, so they are not pooled.
fn expire(kept: &mut Vec<(Secret, Object, Instant)>) {
    let now = Instant::now();
    let mut at = 0;
    while at < kept.len() {
        if kept[at].2 > now {
            at += 1;
        } else {
            close(kept.swap_remove(at).1);
        }
    }
}

/// Takes `client` out of its pool and closes it (once the statements on it answered, or its
/// socket is found dead): the pool opens another in its place.
fn close(client: Object) {
    drop(Object::take(client));
}

/// A checked-out connection with a statement on it; dropped before the answer came (the
/// deadline passed, or the caller gave up), it is kept aside for the release if it may take a
/// lease, and closed otherwise.
pub(crate) struct OnTheWire<'a> {
    client: Option<Object>,
    keep: Option<(&'a Stalled, &'a Secret, Instant)>,
}

impl OnTheWire<'_> {
    /// `client`, closed unless [`answered`](Self::answered) takes it back first.
    pub(crate) fn plain(client: Object) -> Self {
        OnTheWire {
            client: Some(client),
            keep: None,
        }
    }

    pub(crate) fn client(&self) -> &Object {
        self.client.as_ref().expect("on the wire until answered")
    }

    /// The connection, whose statements all answered: nothing of them is left on the wire.
    pub(crate) fn answered(&mut self) -> Object {
        self.client.take().expect("answered once")
    }
}

impl Drop for OnTheWire<'_> {
    fn drop(&mut self) {
        match (self.client.take(), self.keep) {
            (Some(client), Some((stalled, secret, until))) => stalled.keep(secret, client, until),
            (Some(client), None) => close(client),
            (None, _) => {}
        }
    }
}

impl PgStore {
    /// Runs `sql` (one statement answering one row) within the store's deadline.
    pub(crate) async fn row(
        &self,
        sql: &'static str,
        params: &[&(dyn ToSql + Sync)],
        acts: Acts<'_>,
    ) -> Result<Row> {
        let mut rows = self.rows(sql, &[params], acts).await?;
        rows.pop()
            .expect("one answer a statement")
            .map_err(|e| self.call_error(e))
    }

    /// The error a call answers for `error`: [`Error::Timeout`] when the server cancelled the
    /// statement (its `statement_timeout` or `lock_timeout`, or an operator's cancel), as when
    /// the client's deadline passes.
    pub(crate) fn call_error(&self, error: tokio_postgres::Error) -> Error {
        match error.code() {
            Some(&SqlState::QUERY_CANCELED | &SqlState::LOCK_NOT_AVAILABLE) => {
                Error::Timeout(self.timeout)
            }
            _ => Error::Backend(Box::new(error)),
        }
    }

    /// Runs `sql` (one statement answering one row) once per set of `params`, sent
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
                Acts::GivesBack(secret) => self.stalled.take(secret).map(|kept| (secret, kept)),
                _ => None,
            };
            // Kept aside if the deadline passes with the statement on it: a call that may
            // take a lease, for its release; a release on a stalled call's connection, again
            // (whatever of the two is on the wire still runs in order); any other is closed.
            let (client, keep) = match kept {
                Some((secret, (client, until))) => (client, Some((&*self.stalled, secret, until))),
                None => {
                    let client = checkout(&self.pool).await?;
                    let keep = match acts {
                        Acts::Takes(secret, ttl, _) => {
                            Some((&*self.stalled, secret, Instant::now() + ttl))
                        }
                        _ => None,
                    };
                    (client, keep)
                }
            };
            let mut wire = OnTheWire {
                client: Some(client),
                keep,
            };
            let client = wire.client();
            // A call that may take a lease has the statement that gives it back ready too:
            // a release sent behind a stalled call must be one message, not a prepare the
            // server would answer first and the release's deadline might never see.
            let gives_back = match acts {
                Acts::Takes(_, _, gives_back) => Some(gives_back),
                _ => None,
            };
            let answers = match self.statements.of(client, sql, gives_back).await {
                Ok(statement) => {
                    let answers =
                        query_each(client, self.sessions, self.timeout, &statement, params).await;
                    Ok(answers)
                }
                Err(e) => Err(e),
            };
            // Answered: nothing of it is left on the wire.
            let client = wire.answered();
            let answers = match answers {
                Ok(Answers { rows, discard }) => {
                    let lost = rows
                        .iter()
                        .find_map(|row| row.as_ref().err().filter(|e| lost(e, &client)));
                    match lost {
                        Some(e) if tries < most_tries => {
                            tracing::debug!(error = %e, "connection lost; sending the call again");
                            close(client);
                            continue;
                        }
                        Some(_) => {
                            close(client);
                            return Ok(rows);
                        }
                        None => {}
                    }
                    if discard {
                        // Its transaction's state is unknown: never back into the pool.
                        close(client);
                    }
                    return Ok(rows);
                }
                Err(e) => e,
            };
            if lost(&answers, &client) {
                // Never back into the pool: the next try takes another connection.
                close(client);
                if tries < most_tries {
                    tracing::debug!(error = %answers, "connection lost; sending the call again");
                    continue;
                }
            }
            return Err(self.call_error(answers));
        }
    }
}

/// A connection from the pool.
pub(crate) async fn checkout(pool: &Pool) -> Result<Object> {
    pool.get().await.map_err(|e| Error::Backend(Box::new(e)))
}

/// Whether `error` says the connection is gone (closed, its backend terminated or the server
/// shutting down) or useless (its server takes no writes: a standby, or a primary demoted
/// with its sessions kept, "cannot execute … in a read-only transaction"), rather than that
/// the statement failed: then the connection is closed, never pooled again, and the call sent
/// again on another, which every function is safe to be. Under
/// `target_session_attrs=read-write` the pool opens that one on the server that takes writes.
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
                | &SqlState::READ_ONLY_SQL_TRANSACTION
        )
    )
}
