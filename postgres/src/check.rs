//! [`PgWarning`]: what [`PgStore::check`] finds about a database that can break the locks'
//! guarantees, or slow them.

use std::fmt;

use tower_lease::Result;

use crate::PgStore;
use crate::backend::backend;
use crate::call::Acts;

const SETUP: &str = "SELECT pg_is_in_recovery(), current_setting('synchronous_commit'), \
     current_setting('default_transaction_isolation')";

/// Something about a store's database that can break the locks' guarantees, or slow them,
/// found by [`PgStore::check`]. Prints as a message a user can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PgWarning {
    /// The server is a read-only standby (`pg_is_in_recovery()`): every call fails until the
    /// store points at the primary.
    Standby,
    /// `synchronous_commit` is `off` for the store's sessions: a crash of the server loses
    /// the last acquisitions it answered, and a lock answered as taken can be taken again
    /// after the restart. Fences still only grow (they follow the clock).
    AsynchronousCommit,
    /// The pool has fewer connections than the calls [expected at
    /// once](PgStore::expect_concurrency): calls wait for a connection, and past the store's
    /// timeout fail.
    SmallPool {
        /// The pool's most connections.
        pool: usize,
        /// The calls expected at once.
        expected: usize,
    },
    /// The store does not [listen](PgStore::listen) for releases: waiters find releases made
    /// by other processes by polling.
    NoNotifications,
    /// A note: the sessions of the store's pool default to an isolation level other than read
    /// committed (`ALTER ROLE/DATABASE … SET default_transaction_isolation`, the pool's
    /// settings). The calls are right anyway: on a pool given to
    /// [`from_pool`](crate::PgStoreBuilder::from_pool) each runs in a transaction of its own
    /// at read committed, which costs the server two more statements a call.
    DefaultIsolation {
        /// The sessions' `default_transaction_isolation`.
        default: String,
    },
}

impl fmt::Display for PgWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PgWarning::Standby => f.write_str(
                "the server is a read-only standby (pg_is_in_recovery()): every lock call \
                 fails; point the store at the primary",
            ),
            PgWarning::AsynchronousCommit => f.write_str(
                "synchronous_commit is off: a server crash loses the last acquisitions it \
                 answered, and a held lock can be taken again after the restart; set \
                 synchronous_commit to on (or local) for the store's user",
            ),
            PgWarning::SmallPool { pool, expected } => write!(
                f,
                "the pool has {pool} connections for {expected} calls expected at once: calls \
                 wait for a connection and fail past the store's timeout; raise \
                 PgStore::builder().max_connections(n) (or your pool's max_size)"
            ),
            PgWarning::NoNotifications => f.write_str(
                "no release notifications: waiters poll for releases in other processes; \
                 build the store with PgStore::connect, or add listen(config) (a direct URL, \
                 not a transaction pooler's)",
            ),
            PgWarning::DefaultIsolation { default } => write!(
                f,
                "the pool's sessions default to {default} isolation: each lock call runs in a \
                 transaction of its own at read committed, two more statements a call; a pool \
                 of PgStore::connect (or sessions defaulting to read committed) needs none"
            ),
        }
    }
}

impl PgStore {
    /// Checks the database and the store's setup for what can break the locks' guarantees,
    /// or slow them: a read-only standby, `synchronous_commit = off`, a pool smaller than the
    /// [expected concurrency](Self::expect_concurrency), no release notifications; and notes
    /// sessions whose default isolation is not read committed. Call it
    /// once at startup and report what it finds; it logs nothing itself.
    pub async fn check(&self) -> Result<Vec<PgWarning>> {
        let row = self.row(SETUP, &[], Acts::Plainly).await?;
        let standby: bool = row.try_get(0).map_err(backend)?;
        let commit: String = row.try_get(1).map_err(backend)?;
        let isolation: String = row.try_get(2).map_err(backend)?;
        let mut found = Vec::new();
        if standby {
            found.push(PgWarning::Standby);
        }
        if commit == "off" {
            found.push(PgWarning::AsynchronousCommit);
        }
        let pool = self.pool.status().max_size;
        if let Some(expected) = self.concurrency.filter(|&expected| expected > pool) {
            found.push(PgWarning::SmallPool { pool, expected });
        }
        if self.listening.is_none() {
            found.push(PgWarning::NoNotifications);
        }
        // The call above ran in a transaction of its own: the session's default is not its
        // isolation.
        if isolation != "read committed" {
            found.push(PgWarning::DefaultIsolation { default: isolation });
        }
        Ok(found)
    }
}
