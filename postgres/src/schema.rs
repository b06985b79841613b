//! The schema (the `.sql` files beside this one, written for the name `tower_lease`): its SQL
//! for a schema name, installed once per database and version however many replicas start at
//! once, or checked when the application's migrations install it.

use std::time::Duration;

use deadpool_postgres::{Object, Pool};
use tokio_postgres::IsolationLevel;
use tokio_postgres::types::Type;
use tower_lease::{Error, Result};

use crate::naming::Schema;

/// The schema's version: raised with every change of the SQL (a test below holds the SQL's
/// hash for this version, and fails until both change together), so a store of a newer version
/// installs its own over an older one, and one of an older version refuses a newer schema.
pub(crate) const VERSION: i32 = 8;

/// The first key of every advisory lock the crate takes, as `tower_lease.lock_class()`
/// (`sql/schema.sql`) answers it. The installation's lock is taken before that function
/// exists, so it is written here too; a test holds the two equal.
const LOCK_CLASS: i32 = 1_953_260_907;

/// The advisory lock the installation holds: the crate's class, and key 0 (no name's key is
/// asked for with it: names take theirs in the functions).
const INSTALL_LOCK: &str = "SELECT pg_catalog.pg_advisory_xact_lock($1, 0)";

/// Every statement of the schema, in order.
const SQL: [&str; 8] = [
    include_str!("sql/schema.sql"),
    include_str!("sql/lock.sql"),
    include_str!("sql/rw.sql"),
    include_str!("sql/permit.sql"),
    include_str!("sql/idempotency.sql"),
    include_str!("sql/many.sql"),
    include_str!("sql/sweep.sql"),
    include_str!("sql/leases.sql"),
];

/// How long an installation may take, waiting for another replica's included.
const INSTALL_WITHIN: Duration = Duration::from_secs(30);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The SQL that installs the schema `schema` at this crate's version, or brings an older one
/// up to it: what a store installs at connect, for an application's migrations to apply
/// instead (with [`PgStoreBuilder::install_schema`](crate::PgStoreBuilder::install_schema)
/// `(false)`, and [`schema`](crate::PgStoreBuilder::schema) the same name). Apply it in one
/// transaction (sqlx and refinery run each migration in one) as a user that may create the
/// schema; it is safe to apply again. Its statements take the advisory lock the stores' own
/// installation takes, so a store connecting meanwhile waits for it.
///
/// Each release of `tower-lease-postgres` whose SQL changed has a version of its own (the
/// stores refuse a schema of another version with an error naming both): add a migration with
/// this SQL when you upgrade the crate, and deploy it before the replicas of the new version.
///
/// ```
/// // A migration file of the application, e.g. migrations/0003_locks.sql for sqlx:
/// let sql = tower_lease_postgres::schema_sql("tower_lease");
/// assert!(sql.contains("CREATE SCHEMA IF NOT EXISTS \"tower_lease\""));
/// ```
///
/// # Panics
///
/// When `schema` is not a schema name the store takes (see
/// [`PgStoreBuilder::schema`](crate::PgStoreBuilder::schema)).
pub fn schema_sql(schema: &str) -> String {
    match Schema::new(schema) {
        Ok(schema) => sql_of(schema),
        Err(why) => panic!("tower_lease_postgres::schema_sql: {why}"),
    }
}

/// Refuses a schema of a newer version (`{version}`: this one), so that a migration tool
/// applying this version's SQL does not take a database back a version. Nested, so the version
/// table is read only where it exists.
const REFUSE_NEWER: &str = r#"DO $$
BEGIN
    IF pg_catalog.to_regclass('tower_lease.schema_version') IS NOT NULL THEN
        IF (SELECT pg_catalog.max(version) FROM tower_lease.schema_version) > {version} THEN
            RAISE EXCEPTION 'the schema {schema} is at a newer version than {version}, %',
                'which this SQL installs: a newer tower-lease-postgres installed it';
        END IF;
    END IF;
END
$$;
"#;

/// Every statement of the schema: the refusal of a newer one first, the version row last.
fn sql_of(schema: Schema) -> String {
    let mut sql = format!(
        "-- tower-lease-postgres, schema version {VERSION}\n\
         SELECT pg_catalog.pg_advisory_xact_lock({LOCK_CLASS}, 0);\n"
    );
    let refuse_newer = REFUSE_NEWER
        .replace("{version}", &VERSION.to_string())
        .replace("{schema}", schema.name());
    sql.push_str(&schema.rewrite(&refuse_newer));
    for file in SQL {
        sql.push_str(&schema.rewrite(file));
        sql.push('\n');
    }
    sql.push_str(&schema.rewrite(&format!(
        "DELETE FROM tower_lease.schema_version;\n\
         INSERT INTO tower_lease.schema_version (version) VALUES ({VERSION});\n"
    )));
    sql
}

/// Installs the schema unless this version is there (with `install`), or checks that it is
/// (without); refuses a newer one, whose functions this version's calls would not match.
pub(crate) async fn install(pool: &Pool, schema: Schema, install: bool) -> Result<()> {
    let installing = async {
        let mut client = pool.get().await?;
        if !install {
            return at_this_version(schema, installed(&**client, schema).await?, false);
        }
        install_now(&mut client, schema).await
    };
    match tokio::time::timeout(INSTALL_WITHIN, installing).await {
        Ok(installed) => installed.map_err(Error::Backend),
        Err(_) => Err(Error::Timeout(INSTALL_WITHIN)),
    }
}

async fn install_now(client: &mut Object, schema: Schema) -> std::result::Result<(), BoxError> {
    // Most connects find it installed: no lock, no DDL.
    if up_to_date(schema, installed(&***client, schema).await?)? {
        return Ok(());
    }
    // At read committed whatever the session's default: the statements after the lock's wait
    // read what the installation before it committed.
    let tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await?;
    // Bounded by `INSTALL_WITHIN`, not by the calls' bound the store's sessions have: the
    // lock may wait for another replica's installation.
    tx.batch_execute("SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0")
        .await?;
    tx.query_typed(INSTALL_LOCK, &[(&LOCK_CLASS, Type::INT4)])
        .await?;
    // Another replica may have installed it while we waited for the lock.
    if up_to_date(schema, installed(&*tx, schema).await?)? {
        return Ok(());
    }
    tx.batch_execute(&sql_of(schema)).await?;
    tx.commit().await?;
    tracing::info!(
        version = VERSION,
        schema = schema.name(),
        "installed the schema"
    );
    Ok(())
}

/// Whether the schema installed (`installed`, 0 for none) is this version's; an error for a newer
/// one.
fn up_to_date(schema: Schema, installed: i32) -> std::result::Result<bool, BoxError> {
    if installed > VERSION {
        at_this_version(schema, installed, true)?;
    }
    Ok(installed == VERSION)
}

/// `Ok` when the schema installed (`installed`, 0 for none) is this version's; else what to do,
/// for a store that installs (`install`) or not.
fn at_this_version(
    schema: Schema,
    installed: i32,
    install: bool,
) -> std::result::Result<(), BoxError> {
    let name = schema.name();
    let why = match installed {
        _ if installed == VERSION => return Ok(()),
        0 => format!(
            "the schema {name} is not installed in this database: apply \
             tower_lease_postgres::schema_sql(\"{name}\") (version {VERSION}) with your \
             migrations, or build the store with install_schema(true) and a user that may \
             create the schema"
        ),
        _ if installed > VERSION => format!(
            "the schema {name} in this database is at version {installed}, and this \
             tower-lease-postgres installs and speaks version {VERSION}: a newer \
             tower-lease-postgres installed it; run that version (or newer) here too"
        ),
        _ if install => unreachable!("an older schema is installed over"),
        _ => format!(
            "the schema {name} in this database is at version {installed}, older than the \
             version {VERSION} this tower-lease-postgres speaks: apply this version's \
             tower_lease_postgres::schema_sql(\"{name}\") with your migrations, or build \
             the store with install_schema(true)"
        ),
    };
    Err(why.into())
}

/// The version installed, 0 for none. Its statements, as the installation's, are sent
/// unnamed (no statement is prepared), so they run through a transaction pooler too.
async fn installed(
    client: &impl tokio_postgres::GenericClient,
    schema: Schema,
) -> std::result::Result<i32, tokio_postgres::Error> {
    let row = client
        .query_typed_one(
            schema.statement(
                "SELECT pg_catalog.to_regclass('tower_lease.schema_version') IS NOT NULL",
            ),
            &[],
        )
        .await?;
    if !row.get::<_, bool>(0) {
        return Ok(0);
    }
    let row = client
        .query_typed_one(
            schema.statement(
                "SELECT coalesce(pg_catalog.max(version), 0) FROM tower_lease.schema_version",
            ),
            &[],
        )
        .await?;
    Ok(row.get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SQL of this version, as a 64-bit FNV-1a hash of every statement installed: a change
    /// of the SQL fails this test until [`VERSION`] is raised with it.
    const SQL_OF_VERSION: (i32, u64) = (8, 0xb038_c3c6_ac14_0195);

    fn fnv1a(texts: &[&str]) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in texts.iter().flat_map(|text| text.bytes()) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        hash
    }

    #[test]
    fn the_version_changes_with_the_sql() {
        let hash = fnv1a(&SQL);
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
            SQL[0].contains(&defined),
            "schema.sql defines lock_class() as {defined:?}"
        );
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let schema = Schema::default();
        assert!(!up_to_date(schema, 0).unwrap());
        assert!(!up_to_date(schema, VERSION - 1).unwrap());
        assert!(up_to_date(schema, VERSION).unwrap());
        let refused = up_to_date(schema, VERSION + 1).unwrap_err().to_string();
        assert!(
            refused.contains(&format!("version {}", VERSION + 1)),
            "{refused}"
        );
    }
}
