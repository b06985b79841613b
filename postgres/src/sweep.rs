//! The sweep of ended rows: sent by the store itself about once a second (its cadence is the
//! builder's), after one of its acquisitions, on a task of its own, so no call waits for it
//! and an idle store sends none. No background job: a store that acquires sweeps.

use std::sync::Mutex;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::time::Instant;
use tokio_postgres::types::Type;

use crate::call::{OnTheWire, checkout};
use crate::naming::Schema;
use crate::session::{Sessions, query_each};
use crate::statement::{Prepared, Statements};

const SWEEP: &str = "SELECT tower_lease.sweep($1) AS most_gone";
/// Rows of each table one statement deletes at most.
const BATCH: i32 = 100;
/// Statements one sweep sends at most while their batches come back full: up to 1,000 ended
/// rows of each table a second per store, far more than crashed holders leave behind.
const MOST_BATCHES: usize = 10;

/// How often the store sweeps, with which statement, and when it last did.
#[derive(Debug)]
pub(crate) struct Sweeper {
    every: Duration,
    sweep: &'static str,
    last: Mutex<Option<Instant>>,
}

impl Sweeper {
    pub(crate) fn new(every: Duration, schema: Schema) -> Self {
        Sweeper {
            every,
            sweep: schema.statement(SWEEP),
            last: Mutex::default(),
        }
    }

    /// Starts a sweep on its own task unless one started within its cadence; outside a tokio
    /// runtime (never, on a call's path) it does nothing.
    pub(crate) fn now_and_then(
        &self,
        pool: &Pool,
        sessions: Sessions,
        statements: &Statements,
        timeout: Duration,
    ) {
        let now = Instant::now();
        {
            let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_some_and(|last| now.duration_since(last) < self.every) {
                return;
            }
            *last = Some(now);
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (pool, statement) = (pool.clone(), self.sweep);
        let unnamed = matches!(statements, Statements::Unnamed(_));
        runtime.spawn(async move {
            for _ in 0..MOST_BATCHES {
                match tokio::time::timeout(
                    timeout,
                    sweep(&pool, sessions, unnamed, timeout, statement),
                )
                .await
                {
                    Ok(Ok(gone)) if gone >= BATCH => {}
                    Ok(Ok(_)) => break,
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "tower_lease sweep failed");
                        break;
                    }
                    Err(_) => {
                        tracing::debug!("tower_lease sweep timed out");
                        break;
                    }
                }
            }
        });
    }
}

async fn sweep(
    pool: &Pool,
    sessions: Sessions,
    unnamed: bool,
    timeout: Duration,
    statement: &'static str,
) -> tower_lease::Result<i32> {
    // Closed, not pooled, if the deadline passes with the sweep on it.
    let mut wire = OnTheWire::plain(checkout(pool).await?);
    let client = wire.client();
    let statement = if unnamed {
        Prepared::Unnamed(statement, std::sync::Arc::from([Type::INT4]))
    } else {
        Prepared::Named(
            client
                .prepare_cached(statement)
                .await
                .map_err(crate::backend::backend)?,
        )
    };
    let mut answers = query_each(client, sessions, timeout, &statement, &[&[&BATCH]]).await;
    let client = wire.answered();
    if answers.discard {
        // Its transaction's state is unknown: never back into the pool.
        drop(deadpool_postgres::Object::take(client));
    }
    let row = answers
        .rows
        .pop()
        .expect("one answer a statement")
        .map_err(crate::backend::backend)?;
    row.try_get("most_gone").map_err(crate::backend::backend)
}
