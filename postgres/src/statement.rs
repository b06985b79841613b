//! What a call sends: by default a named statement, prepared once per connection and cached
//! on it; behind a transaction pooler
//! ([`transaction_pooler`](crate::PgStoreBuilder::transaction_pooler)) the unnamed statement,
//! parsed, bound and run in one message with its parameters' types, which the store learned
//! once per statement.
//!
//! A transaction pooler (PgBouncer in `transaction` mode before 1.21) gives each transaction
//! whichever server connection is free: a statement named on one is missing on the next
//! ("prepared statement \"s0\" does not exist"). The unnamed statement lives within its own
//! message (`Parse`, `Bind`, `Execute`, `Sync`), which the pooler sends to one server
//! connection.
//!
//! Its parameters' types must be sent with it (the client encodes them in binary, and checks
//! each value's type against them). The store learns them from the server the first time it
//! sends a statement: it prepares the statement named inside a transaction of its own and
//! closes it before the `COMMIT`, so the pooler keeps all of it on one server connection and
//! nothing named is left there. The functions' parameters are built-in types, which the
//! client knows without asking the server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use deadpool_postgres::ClientWrapper;
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Error, Row, Statement};

/// How a store's calls send their statements.
#[derive(Clone, Debug)]
pub(crate) enum Statements {
    /// Prepared and cached on each connection.
    Named,
    /// The unnamed statement, with the parameters' types learned once per statement.
    Unnamed(Arc<ParamTypes>),
}

impl Statements {
    /// For a store behind a transaction pooler (`pooler`) or not.
    pub(crate) fn new(pooler: bool) -> Self {
        if pooler {
            Statements::Unnamed(Arc::default())
        } else {
            Statements::Named
        }
    }

    /// The statement of `sql` on `client`, and with it the one of `also` (a call's release,
    /// which must then be sendable in one message: prepared, or its types known).
    pub(crate) async fn of(
        &self,
        client: &ClientWrapper,
        sql: &'static str,
        also: Option<&'static str>,
    ) -> Result<Prepared, Error> {
        match self {
            Statements::Named => match also {
                Some(also) => {
                    let (statement, also) =
                        tokio::join!(client.prepare_cached(sql), client.prepare_cached(also));
                    also?;
                    statement.map(Prepared::Named)
                }
                None => client.prepare_cached(sql).await.map(Prepared::Named),
            },
            Statements::Unnamed(types) => {
                let of_sql = types.of(client, sql).await?;
                if let Some(also) = also {
                    types.of(client, also).await?;
                }
                Ok(Prepared::Unnamed(sql, of_sql))
            }
        }
    }
}

/// The parameters' types of each statement a store sent unnamed.
#[derive(Default)]
pub(crate) struct ParamTypes {
    known: Mutex<HashMap<&'static str, Arc<[Type]>>>,
}

impl ParamTypes {
    /// The parameters' types of `sql`: known, or learned on `client`.
    async fn of(&self, client: &Client, sql: &'static str) -> Result<Arc<[Type]>, Error> {
        if let Some(types) = self.known().get(sql) {
            return Ok(types.clone());
        }
        let types = learn(client, sql).await?;
        self.known().insert(sql, types.clone());
        Ok(types)
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<&'static str, Arc<[Type]>>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl std::fmt::Debug for ParamTypes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ParamTypes")
            .field("statements", &self.known().len())
            .finish()
    }
}

/// Prepares `sql` inside a transaction of its own, reads its parameters' types and closes it
/// before the transaction ends: a pooler keeps the three on one server connection.
async fn learn(client: &Client, sql: &str) -> Result<Arc<[Type]>, Error> {
    client.batch_execute("BEGIN").await?;
    let learned = match client.prepare(sql).await {
        // Dropped, it sends its `Close` before the `ROLLBACK` below is sent.
        Ok(statement) => Ok(Arc::from(statement.params())),
        Err(e) => Err(e),
    };
    let end = client.batch_execute("ROLLBACK").await;
    let learned = learned?;
    end?;
    Ok(learned)
}

/// A statement to run, one row an answer.
#[derive(Debug)]
pub(crate) enum Prepared {
    /// Prepared on the connection.
    Named(Statement),
    /// Sent unnamed, with its parameters' types.
    Unnamed(&'static str, Arc<[Type]>),
}

impl Prepared {
    /// Runs the statement with `params` on `client`: its one row. The request is written in
    /// the first poll, as one message.
    pub(crate) async fn query_one(
        &self,
        client: &Client,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, Error> {
        match self {
            Prepared::Named(statement) => client.query_one(statement, params).await,
            Prepared::Unnamed(sql, types) => {
                let typed: Vec<(&(dyn ToSql + Sync), Type)> = params
                    .iter()
                    .zip(types.iter())
                    .map(|(param, ty)| (*param, ty.clone()))
                    .collect();
                client.query_typed_one(sql, &typed).await
            }
        }
    }
}
