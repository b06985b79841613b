//! [`PgWarning`]: what [`PgStore::check`] finds about a database that can break the locks'
//! guarantees, or slow them.

use std::fmt;
use std::sync::LazyLock;

use tower_lease::Result;

use crate::PgStore;
use crate::backend::backend;
use crate::call::Acts;
use crate::version::VERSION;

/// The server's settings, and the physical standbys streaming from it (a logical
/// subscriber's walsender is connected to a database: no failover target). A base backup's
/// walsender is no standby yet.
const SETUP: &str = "SELECT pg_is_in_recovery(), current_setting('synchronous_commit'), \
     current_setting('default_transaction_isolation'), \
     current_setting('synchronous_standby_names'), \
     count(r.pid), count(r.pid) FILTER (WHERE r.sync_state IS NULL), \
     coalesce(array_agg(coalesce(r.application_name, '')) \
         FILTER (WHERE r.sync_state IN ('async', 'potential')), '{}'), \
     coalesce(array_agg(coalesce(r.application_name, '') ORDER BY r.application_name) \
         FILTER (WHERE r.sync_state = 'quorum'), '{}') \
     FROM (SELECT pid, application_name, sync_state FROM pg_stat_replication \
         WHERE coalesce(state, '') <> 'backup' AND pid IN \
             (SELECT pid FROM pg_stat_activity WHERE coalesce(datid, 0) = 0)) r";

/// The privileges on the schema, its tables and this version's functions that the store's user
/// lacks, each as the `GRANT` that gives it.
static PRIVILEGES: LazyLock<String> = LazyLock::new(|| {
    format!(
        "SELECT ARRAY(\
         SELECT 'USAGE ON SCHEMA ' || 'tower_lease'::regnamespace::text \
         WHERE NOT pg_catalog.has_schema_privilege('tower_lease', 'USAGE') \
         UNION ALL \
         SELECT 'SELECT, INSERT, UPDATE, DELETE ON TABLE ' || c.oid::regclass::text \
         FROM pg_catalog.pg_class c \
         WHERE c.relnamespace = 'tower_lease'::regnamespace AND c.relkind = 'r' \
           AND c.relname <> 'schema_version' \
           AND NOT (pg_catalog.has_table_privilege(c.oid, 'SELECT') \
             AND pg_catalog.has_table_privilege(c.oid, 'INSERT') \
             AND pg_catalog.has_table_privilege(c.oid, 'UPDATE') \
             AND pg_catalog.has_table_privilege(c.oid, 'DELETE')) \
         UNION ALL \
         SELECT 'EXECUTE ON FUNCTION ' || p.oid::regprocedure::text \
         FROM pg_catalog.pg_proc p \
         WHERE p.pronamespace = 'tower_lease'::regnamespace \
           AND p.proname LIKE '%\\_v{VERSION}' \
           AND NOT pg_catalog.has_function_privilege(p.oid, 'EXECUTE') \
         ORDER BY 1)"
    )
});

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
    /// Standbys stream from the server whose `sync_state` is `async` or `potential`: the
    /// server's commits do not wait for them, so a failover to one of them loses the
    /// acquisitions it had not received yet, and a lock answered as taken can be taken a
    /// second time. Fences still grow while the servers' clocks agree (they follow the clock).
    AsynchronousStandbys {
        /// Their `application_name`s.
        names: Vec<String>,
    },
    /// Quorum standbys (`synchronous_standby_names = 'ANY n (…)'`) stream from the server,
    /// more of them than a commit waits for: each commit is on `n` of them, not on all, so
    /// a failover keeps every answered acquisition only when it promotes the one that
    /// received the most WAL (as a quorum-aware failover manager does); promoting another
    /// loses what it lacks, and a held lock can be taken a second time.
    QuorumStandbys {
        /// Their `application_name`s.
        names: Vec<String>,
        /// How many of them a commit waits for (the `n` of `ANY n`).
        waited_for: usize,
    },
    /// Standbys stream from the server but `synchronous_standby_names` is empty: every one
    /// is asynchronous, and a failover loses the last acquisitions answered.
    NoSynchronousStandbyNames {
        /// How many standbys stream from the server.
        standbys: usize,
    },
    /// `synchronous_commit` is `local` or `off` for the store's sessions while standbys
    /// stream from the server: even with `synchronous_standby_names` set, a commit answers
    /// before any standby has it, and a failover loses the last acquisitions answered.
    CommitWaitsForNoStandby {
        /// The sessions' `synchronous_commit`.
        synchronous_commit: String,
    },
    /// Standbys stream from the server, but the store's user may not see whether they are
    /// synchronous: `pg_stat_replication` shows their state only to superusers and members
    /// of `pg_monitor` (to others, its rows' columns are empty, and with no standby it has
    /// no rows at all, for any user).
    HiddenStandbys {
        /// How many standbys stream from the server.
        standbys: usize,
    },
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
    /// The store's user lacks privileges its calls need (on a schema a migration installed,
    /// or on a database that revokes `EXECUTE` from `PUBLIC`): the calls that need them fail.
    MissingPrivileges {
        /// Each as what to grant: `EXECUTE ON FUNCTION tower_lease.lock_acquire_v9(…)`.
        grants: Vec<String>,
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
                 synchronous_commit to on for the store's user (with a synchronous standby, \
                 on, remote_write or remote_apply: local waits for no standby)",
            ),
            PgWarning::AsynchronousStandbys { names } => write!(
                f,
                "the standbys {} are asynchronous (sync_state async or potential): a failover \
                 to one loses the acquisitions it had not received, and a held lock can be \
                 taken a second time; fail over only to a synchronous standby, or name them \
                 in synchronous_standby_names (with synchronous_commit on or remote_apply)",
                quoted(names)
            ),
            PgWarning::QuorumStandbys { names, waited_for } => write!(
                f,
                "the standbys {} are a quorum of which a commit waits for {waited_for} only \
                 (synchronous_standby_names ANY): a failover must promote the one that \
                 received the most WAL (highest pg_last_wal_receive_lsn(), as quorum-aware \
                 failover managers choose); promoting another loses the acquisitions it \
                 lacks, and a held lock can be taken a second time",
                quoted(names)
            ),
            PgWarning::NoSynchronousStandbyNames { standbys } => write!(
                f,
                "{standbys} standby(s) stream from the server but synchronous_standby_names \
                 is empty: every standby is asynchronous, and a failover loses the last \
                 acquisitions answered (a held lock can be taken a second time); set \
                 synchronous_standby_names (e.g. 'FIRST 1 (standby1, standby2)') with \
                 synchronous_commit on or remote_apply"
            ),
            PgWarning::CommitWaitsForNoStandby { synchronous_commit } => write!(
                f,
                "synchronous_commit is {synchronous_commit} while standbys stream from the \
                 server: a commit answers before any standby has it, and a failover loses \
                 the last acquisitions answered; set synchronous_commit to on, remote_write \
                 or remote_apply for the store's user (ALTER ROLE … SET synchronous_commit)"
            ),
            PgWarning::HiddenStandbys { standbys } => write!(
                f,
                "{standbys} standby(s) stream from the server, but the store's user cannot \
                 see whether they are synchronous (pg_stat_replication shows it to \
                 superusers and pg_monitor only): GRANT pg_monitor to the store's user, or \
                 check that pg_stat_replication.sync_state is sync for every standby a \
                 failover may promote"
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
            PgWarning::MissingPrivileges { grants } => write!(
                f,
                "the store's user lacks privileges its calls need; grant it: {}",
                grants.join("; ")
            ),
        }
    }
}

impl PgStore {
    /// Checks the database and the store's setup for what can break the locks' guarantees,
    /// or slow them: a read-only standby, `synchronous_commit = off`, standbys a failover
    /// to which loses acquisitions (asynchronous or potential ones, an empty
    /// `synchronous_standby_names`, `synchronous_commit = local`, more quorum standbys than
    /// a commit waits for; their state needs
    /// `pg_monitor` to see), a pool smaller than the
    /// [expected concurrency](Self::expect_concurrency), no release notifications; and notes
    /// sessions whose default isolation is not read committed. Call it
    /// once at startup and report what it finds; it logs nothing itself.
    pub async fn check(&self) -> Result<Vec<PgWarning>> {
        let row = self.row(SETUP, &[], Acts::Plainly).await?;
        let standby: bool = row.try_get(0).map_err(backend)?;
        let commit: String = row.try_get(1).map_err(backend)?;
        let isolation: String = row.try_get(2).map_err(backend)?;
        let sync_names: String = row.try_get(3).map_err(backend)?;
        let standbys: i64 = row.try_get(4).map_err(backend)?;
        let hidden: i64 = row.try_get(5).map_err(backend)?;
        let asynchronous: Vec<String> = row.try_get(6).map_err(backend)?;
        let quorum: Vec<String> = row.try_get(7).map_err(backend)?;
        let standbys = usize::try_from(standbys).unwrap_or(0);
        let mut found = Vec::new();
        if standby {
            found.push(PgWarning::Standby);
        }
        if commit == "off" {
            found.push(PgWarning::AsynchronousCommit);
        }
        if standbys > 0 {
            if matches!(commit.as_str(), "off" | "local") {
                found.push(PgWarning::CommitWaitsForNoStandby {
                    synchronous_commit: commit,
                });
            }
            if sync_names.trim().is_empty() {
                found.push(PgWarning::NoSynchronousStandbyNames { standbys });
            }
            if hidden > 0 {
                found.push(PgWarning::HiddenStandbys { standbys });
            }
            let waited_for = quorum_size(&sync_names);
            if quorum.len() > waited_for {
                found.push(PgWarning::QuorumStandbys {
                    names: quorum,
                    waited_for,
                });
            }
            if !asynchronous.is_empty() {
                found.push(PgWarning::AsynchronousStandbys {
                    names: asynchronous,
                });
            }
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
        let row = self.row(PRIVILEGES.as_str(), &[], Acts::Plainly).await?;
        let grants: Vec<String> = row.try_get(0).map_err(backend)?;
        if !grants.is_empty() {
            found.push(PgWarning::MissingPrivileges { grants });
        }
        Ok(found)
    }
}

/// The `n` of `synchronous_standby_names = 'ANY n (…)'` (0 for any other form, which has no
/// quorum standbys).
fn quorum_size(sync_names: &str) -> usize {
    let mut words = sync_names.split_whitespace();
    match words.next() {
        Some(first) if first.eq_ignore_ascii_case("any") => words
            .next()
            .and_then(|n| n.split('(').next()?.parse().ok())
            .unwrap_or(0),
        _ => 0,
    }
}

/// `names` as `"a", "b"`.
fn quoted(names: &[String]) -> String {
    let quoted: Vec<String> = names.iter().map(|name| format!("{name:?}")).collect();
    quoted.join(", ")
}

#[cfg(test)]
mod tests {
    use super::quorum_size;

    #[test]
    fn the_quorum_size_is_read_from_any_n_only() {
        assert_eq!(quorum_size("ANY 1 (q1, q2)"), 1);
        assert_eq!(quorum_size("any 2(q1,q2,q3)"), 2);
        assert_eq!(quorum_size("FIRST 1 (s1, s2)"), 0);
        assert_eq!(quorum_size("s1, s2"), 0);
        assert_eq!(quorum_size(""), 0);
    }
}
