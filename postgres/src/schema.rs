//! The schema (the `.sql` files beside this one, written for the name `tower_lease`): this
//! version's functions installed beside those of the versions already there, once per database
//! and version however many replicas start at once, or checked when the application's
//! migrations install it; and the contraction that drops the older versions' functions.

use std::time::{Duration, Instant};

use deadpool_postgres::{Object, Pool};
use tokio_postgres::IsolationLevel;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tower_lease::{Error, Result};

use crate::naming::Schema;
use crate::version::{CONTRACT, FUNCTIONS, INSTALL, OLDEST_PEER, TABLES, VERSION, VERSIONED_NAMES};

/// The first key of every advisory lock the crate takes, as `tower_lease.lock_class()`
/// (`sql/schema.sql`) answers it. The installation's lock is taken before that function
/// exists, so it is written here too; a test holds the two equal.
const LOCK_CLASS: i32 = 1_953_260_907;

/// The advisory lock the installation holds: the crate's class, and key 0 (no name's key is
/// asked for with it: names take theirs in the functions).
const INSTALL_LOCK: &str = "SELECT pg_catalog.pg_advisory_xact_lock($1, 0)";

/// How long an installation may take, waiting for another replica's included.
const INSTALL_WITHIN: Duration = Duration::from_secs(30);

/// How long one statement of the installation may wait for a lock before the installation
/// gives way and tries again: a DDL statement waiting for a table's lock holds up every call
/// queued behind it, and an application's long transaction may hold that lock for minutes.
const DDL_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '250ms'";

/// The tables whose index the sweep reads (`<table>_sweep_after`, on `sweep_after`).
const SWEPT_TABLES: [&str; 8] = [
    "locks",
    "rwlocks",
    "readers",
    "waiting_readers",
    "permits",
    "idempotency",
    "claims",
    "waited",
];

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The SQL that installs this crate's version of the schema `schema` beside the versions
/// already there (the expand step of an upgrade): what a store runs at connect, for an
/// application's migrations to apply instead (with
/// [`PgStoreBuilder::install_schema`](crate::PgStoreBuilder::install_schema)`(false)`, and
/// [`schema`](crate::PgStoreBuilder::schema) the same name). Apply it in one transaction
/// (sqlx and refinery run each migration in one); it is safe to apply again, and takes the
/// advisory lock the stores' own installation takes, so a store connecting meanwhile waits.
///
/// It makes the schema if missing (a schema made in advance needs no `CREATE` on the
/// database), and the tables and columns that are missing, and installs this version's
/// functions under names that carry its number, leaving those of the version before in
/// place: the replicas of both run side by side while a deploy, or a rollback, goes through.
/// It refuses a schema that holds objects it did not make, and a newer version that does not
/// run beside this one. The functions of versions that cannot run beside this one (more than
/// one version older) are dropped. [`contract_sql`] drops the older versions' functions once
/// no replica runs them.
///
/// Indexes missing from a table that an old version made with rows in it are not built here
/// (a `CREATE INDEX` in a transaction blocks the table's writes): a store builds them
/// `CONCURRENTLY` at connect, or run [`schema_index_sql`] outside a transaction.
///
/// ```
/// // A migration file of the application, e.g. migrations/0003_locks.sql for sqlx:
/// let sql = tower_lease_postgres::schema_sql("tower_lease");
/// assert!(sql.contains("CREATE SCHEMA \"tower_lease\""));
/// ```
///
/// # Panics
///
/// When `schema` is not a schema name the store takes (see
/// [`PgStoreBuilder::schema`](crate::PgStoreBuilder::schema)).
pub fn schema_sql(schema: &str) -> String {
    expand_sql(checked(schema, "schema_sql"))
}

/// The SQL that drops the functions and types of every version of the schema `schema` older
/// than this crate's (the contract step of an upgrade), once every replica runs this version:
/// the tables and this version's functions stay. Run it after a deploy has finished and you
/// no longer mean to roll back, as [`PgStore::contract`](crate::PgStore::contract) does. A
/// rollback after it still works: the older version installs its functions again at connect
/// (or by its `schema_sql`). Refused (an error raised) where this version is not installed.
///
/// ```
/// let sql = tower_lease_postgres::contract_sql("tower_lease");
/// assert!(sql.contains("DROP FUNCTION"));
/// ```
///
/// # Panics
///
/// As [`schema_sql`].
pub fn contract_sql(schema: &str) -> String {
    contracting_sql(checked(schema, "contract_sql"))
}

/// The statements that build, `CONCURRENTLY`, the indexes of the schema `schema` that tables
/// made by an old version lack: for a migration tool, run each outside a transaction after
/// [`schema_sql`] (a store builds them itself at connect). Each is safe to run again. Should a
/// build fail, it leaves an invalid index: drop it (`DROP INDEX CONCURRENTLY`) and run again.
///
/// ```
/// let statements = tower_lease_postgres::schema_index_sql("tower_lease");
/// assert!(statements.iter().all(|s| s.contains("CONCURRENTLY")));
/// ```
///
/// # Panics
///
/// As [`schema_sql`].
pub fn schema_index_sql(schema: &str) -> Vec<String> {
    let schema = checked(schema, "schema_index_sql");
    SWEPT_TABLES
        .iter()
        .map(|table| index_statement(schema, table))
        .collect()
}

fn checked(schema: &str, function: &str) -> Schema {
    match Schema::new(schema) {
        Ok(schema) => schema,
        Err(why) => panic!("tower_lease_postgres::{function}: {why}"),
    }
}

/// The concurrent build of `table`'s sweep index.
fn index_statement(schema: Schema, table: &str) -> String {
    format!(
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS {table}_sweep_after ON {}.{table} (sweep_after)",
        schema.quoted()
    )
}

/// `contract.sql` for the versions whose number is `versions` (`< 9`, `= 9`).
fn contract_versions(schema: Schema, versions: &str) -> String {
    let legacy: Vec<String> = {
        let mut names: Vec<&str> = VERSIONED_NAMES.iter().copied().collect();
        names.sort_unstable();
        names.iter().map(|name| format!("'{name}'")).collect()
    };
    schema.rewrite(&CONTRACT.replace("{versions}", versions).replace(
        "{legacy_names}",
        &format!("ARRAY[{}]::text[]", legacy.join(", ")),
    ))
}

/// The installation's SQL: the newer versions' checks first, the version's row last.
fn expand_sql(schema: Schema) -> String {
    let numbered = |sql: &str| {
        sql.replace("{version}", &VERSION.to_string())
            .replace("{oldest_peer}", &OLDEST_PEER.to_string())
    };
    let mut sql = format!(
        "-- tower-lease-postgres, schema version {VERSION} (runs beside version \
         {OLDEST_PEER} and newer)\n\
         SELECT pg_catalog.pg_advisory_xact_lock({LOCK_CLASS}, 0);\n"
    );
    sql.push_str(&schema.rewrite(&numbered(INSTALL)));
    // The versions that cannot run beside this one, and this version's own objects should a
    // row have gone missing: what follows creates them afresh.
    sql.push_str(&contract_versions(schema, &format!("< {OLDEST_PEER}")));
    sql.push_str(&contract_versions(schema, &format!("= {VERSION}")));
    sql.push_str(&schema.rewrite(TABLES));
    for file in FUNCTIONS {
        sql.push_str(&schema.rewrite(&numbered(file)));
        sql.push('\n');
    }
    sql.push_str(&schema.rewrite(&format!(
        "INSERT INTO tower_lease.schema_version (version, oldest_peer) \
         VALUES ({VERSION}, {OLDEST_PEER});\n"
    )));
    sql
}

/// The contraction's SQL: refused unless this version is installed.
fn contracting_sql(schema: Schema) -> String {
    let mut sql = format!(
        "-- tower-lease-postgres: drops the versions of the schema older than {VERSION}\n\
         SELECT pg_catalog.pg_advisory_xact_lock({LOCK_CLASS}, 0);\n"
    );
    sql.push_str(&schema.rewrite(&format!(
        "DO $$\nBEGIN\n    IF pg_catalog.to_regclass('tower_lease.schema_version') IS NULL \
         OR NOT EXISTS (\n        SELECT FROM tower_lease.schema_version v WHERE v.version = \
         {VERSION}) THEN\n        RAISE EXCEPTION 'version {VERSION} of the schema % is not \
         installed: nothing would be left to call', 'tower_lease';\n    END IF;\nEND\n$$;\n"
    )));
    sql.push_str(&contract_versions(schema, &format!("< {VERSION}")));
    sql
}

/// What a database holds of the schema's versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Installed {
    /// Whether this version's functions are there.
    own: bool,
    /// The newest version there, 0 for none.
    newest: i32,
    /// The oldest version the newest one runs beside.
    newest_reaches: i32,
}

impl Installed {
    /// Whether this version runs on what is installed: `Ok(true)` as it is, `Ok(false)` once
    /// its functions are installed, or why it cannot (with `install`: whether it may install).
    fn ready(self, schema: Schema, install: bool) -> std::result::Result<bool, BoxError> {
        let name = schema.name();
        let Installed {
            own,
            newest,
            newest_reaches,
        } = self;
        if newest > VERSION && newest_reaches > VERSION {
            return Err(format!(
                "the schema {name} in this database is at version {newest}, which runs beside \
                 versions {newest_reaches} and newer, and this tower-lease-postgres speaks \
                 version {VERSION}: a newer tower-lease-postgres installed it; run version \
                 {newest_reaches} of the schema (or newer) here too"
            )
            .into());
        }
        if own {
            return Ok(true);
        }
        if install {
            return Ok(false);
        }
        let what = match newest {
            0 => "is not installed in this database".to_owned(),
            _ => format!(
                "in this database has no functions of version {VERSION}, which this \
                 tower-lease-postgres speaks (the newest installed is {newest})"
            ),
        };
        Err(format!(
            "the schema {name} {what}: apply tower_lease_postgres::schema_sql(\"{name}\") \
             (version {VERSION}) with your migrations, or build the store with \
             install_schema(true) and a user that may create in the schema"
        )
        .into())
    }
}

/// Installs this version beside the others unless it is there (with `install`), or checks
/// that it is (without); refuses a newer version that does not run beside this one.
pub(crate) async fn install(pool: &Pool, schema: Schema, install: bool) -> Result<()> {
    let deadline = Instant::now() + INSTALL_WITHIN;
    let installing = async {
        let mut client = pool.get().await?;
        if installed(&**client, schema).await?.ready(schema, install)? {
            return Ok(());
        }
        install_now(&mut client, schema, deadline).await?;
        build_indexes(client, schema).await
    };
    match tokio::time::timeout_at(deadline.into(), installing).await {
        Ok(installed) => installed.map_err(|error| Error::Backend(said(error))),
        Err(_) => Err(Error::Timeout(INSTALL_WITHIN)),
    }
}

/// The installation, tried again after a jittered pause while a statement of it gives way to
/// a lock another transaction holds.
async fn install_now(
    client: &mut Object,
    schema: Schema,
    deadline: Instant,
) -> std::result::Result<(), BoxError> {
    let mut tries: u32 = 0;
    loop {
        match install_once(client, schema).await {
            Err(error)
                if error.code() == Some(&SqlState::LOCK_NOT_AVAILABLE)
                    && Instant::now() < deadline =>
            {
                tries += 1;
                tracing::debug!(tries, "the schema's installation gave way to a lock");
                tokio::time::sleep(jitter(tries)).await;
            }
            done => return Ok(done?),
        }
    }
}

/// 100–600 ms, different in each process and try.
fn jitter(tries: u32) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    let spread = (nanos ^ std::process::id().rotate_left(tries)) % 500;
    Duration::from_millis(100 + u64::from(spread))
}

/// A transaction that changes the schema: at read committed whatever the session's default (the
/// statements after the advisory lock's wait read what the change before it committed), and
/// bounded by `INSTALL_WITHIN`, not by the calls' bound the store's sessions have.
async fn schema_transaction(
    client: &mut Object,
) -> std::result::Result<deadpool_postgres::Transaction<'_>, tokio_postgres::Error> {
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await?;
    tx.batch_execute("SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0")
        .await?;
    Ok(tx)
}

async fn install_once(
    client: &mut Object,
    schema: Schema,
) -> std::result::Result<(), tokio_postgres::Error> {
    let tx = schema_transaction(client).await?;
    // The DDL after the wait for another replica's installation gives way to any table lock.
    tx.query_typed(INSTALL_LOCK, &[(&LOCK_CLASS, Type::INT4)])
        .await?;
    // Another replica may have installed it while we waited for the lock.
    if installed(&*tx, schema).await?.own {
        return Ok(());
    }
    tx.batch_execute(DDL_LOCK_TIMEOUT).await?;
    tx.batch_execute(&expand_sql(schema)).await?;
    tx.commit().await?;
    tracing::info!(
        version = VERSION,
        schema = schema.name(),
        "installed the schema's version"
    );
    Ok(())
}

/// Builds the sweep's indexes that tables made by an old version lack, `CONCURRENTLY` (so
/// outside a transaction, and on a session of its own: its settings do not go back to the
/// pool).
async fn build_indexes(client: Object, schema: Schema) -> std::result::Result<(), BoxError> {
    let quoted = schema.quoted();
    let mut missing = Vec::new();
    for table in SWEPT_TABLES {
        let row = client
            .query_typed_one(
                &format!(
                    "SELECT pg_catalog.to_regclass('{quoted}.{table}') IS NOT NULL \
                     AND NOT EXISTS (SELECT FROM pg_catalog.pg_index i WHERE i.indexrelid = \
                     pg_catalog.to_regclass('{quoted}.{table}_sweep_after') AND i.indisvalid)"
                ),
                &[],
            )
            .await?;
        if row.get::<_, bool>(0) {
            missing.push(table);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let client = Object::take(client);
    client
        .batch_execute("SET statement_timeout = 0; SET lock_timeout = 0")
        .await?;
    for table in missing {
        client
            .batch_execute(&format!(
                "DROP INDEX CONCURRENTLY IF EXISTS {quoted}.{table}_sweep_after"
            ))
            .await?;
        client
            .batch_execute(&index_statement(schema, table))
            .await?;
        tracing::info!(table, "built the sweep's index");
    }
    Ok(())
}

/// What the database holds of the schema's versions. Its statements, as the installation's,
/// are sent unnamed (no statement is prepared), so they run through a transaction pooler too;
/// `oldest_peer` is read through `to_jsonb`, since the version table of older versions lacks
/// it.
async fn installed(
    client: &impl tokio_postgres::GenericClient,
    schema: Schema,
) -> std::result::Result<Installed, tokio_postgres::Error> {
    let row = client
        .query_typed_one(
            schema.statement(
                "SELECT pg_catalog.to_regclass('tower_lease.schema_version') IS NOT NULL",
            ),
            &[],
        )
        .await?;
    if !row.get::<_, bool>(0) {
        return Ok(Installed {
            own: false,
            newest: 0,
            newest_reaches: 0,
        });
    }
    let row = client
        .query_typed_one(
            &schema.rewrite(&format!(
                "SELECT coalesce(pg_catalog.bool_or(v.version = {VERSION}), false), \
                 coalesce(pg_catalog.max(v.version), 0), \
                 coalesce((SELECT coalesce((pg_catalog.to_jsonb(n) ->> 'oldest_peer')::integer, \
                 n.version) FROM tower_lease.schema_version n ORDER BY n.version DESC LIMIT 1), 0) \
                 FROM tower_lease.schema_version v"
            )),
            &[],
        )
        .await?;
    Ok(Installed {
        own: row.get(0),
        newest: row.get(1),
        newest_reaches: row.get(2),
    })
}

/// `error` with what the server said in its text: a refusal the SQL raises reads as `db error`
/// otherwise.
fn said(error: BoxError) -> BoxError {
    match error
        .downcast_ref::<tokio_postgres::Error>()
        .and_then(tokio_postgres::Error::as_db_error)
    {
        Some(db) => format!("the schema's installation failed: {}", db.message()).into(),
        None => error,
    }
}

/// Contracts the schema: see [`contract_sql`].
pub(crate) async fn contract(pool: &Pool, schema: Schema) -> Result<()> {
    let contracting = async {
        let mut client = pool.get().await?;
        let tx = schema_transaction(&mut client).await?;
        tx.batch_execute(&contracting_sql(schema)).await?;
        tx.commit().await?;
        tracing::info!(
            version = VERSION,
            schema = schema.name(),
            "contracted the schema"
        );
        Ok::<_, BoxError>(())
    };
    match tokio::time::timeout(INSTALL_WITHIN, contracting).await {
        Ok(done) => done.map_err(|error| Error::Backend(said(error))),
        Err(_) => Err(Error::Timeout(INSTALL_WITHIN)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SQL of this version, as a 64-bit FNV-1a hash of every statement installed: a change
    /// of the SQL fails this test until [`VERSION`] is raised with it.
    const SQL_OF_VERSION: (i32, u64) = (9, 0xcf1a_3cf0_805a_ce60);

    fn fnv1a(texts: &[&str]) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in texts.iter().flat_map(|text| text.bytes()) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        hash
    }

    #[test]
    fn the_version_changes_with_the_sql() {
        let hash = fnv1a(&[INSTALL, CONTRACT, TABLES]) ^ fnv1a(&FUNCTIONS);
        assert_eq!(
            (VERSION, hash),
            SQL_OF_VERSION,
            "the SQL hashes to {hash:#x} at VERSION {VERSION}: SQL that changed needs a raised \
             VERSION, and both in SQL_OF_VERSION"
        );
    }

    #[test]
    fn the_lock_class_is_the_sql_one() {
        let defined = format!(
            "CREATE FUNCTION tower_lease.lock_class()\n\
             RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$\n    SELECT {LOCK_CLASS}\n$$;"
        );
        assert!(
            FUNCTIONS[0].contains(&defined),
            "schema.sql defines lock_class() as {defined:?}"
        );
    }

    #[test]
    fn a_newer_version_is_refused_unless_it_runs_beside_this_one() {
        let schema = Schema::default();
        let at = |own, newest, newest_reaches| Installed {
            own,
            newest,
            newest_reaches,
        };
        assert!(!at(false, 0, 0).ready(schema, true).unwrap());
        assert!(at(false, 0, 0).ready(schema, false).is_err());
        assert!(
            !at(false, VERSION - 1, VERSION - 1)
                .ready(schema, true)
                .unwrap()
        );
        assert!(at(true, VERSION, OLDEST_PEER).ready(schema, false).unwrap());
        // A rollback: the newer version reaches back to this one.
        assert!(at(true, VERSION + 1, VERSION).ready(schema, false).unwrap());
        assert!(!at(false, VERSION + 1, VERSION).ready(schema, true).unwrap());
        let refused = at(true, VERSION + 1, VERSION + 1)
            .ready(schema, true)
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains(&format!("version {}", VERSION + 1)),
            "{refused}"
        );
    }
}
