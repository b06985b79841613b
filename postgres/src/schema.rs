//! Installing the schema `tower_lease` (the `.sql` files beside this one), once per database
//! and version, however many replicas start at once.

use std::time::Duration;

use deadpool_postgres::Pool;
use tower_lease::{Error, Result};

/// The schema's version: raised with every change of the SQL (a test below holds the SQL's
/// hash for this version, and fails until both change together), so a store of a newer version
/// installs its own over an older one, and one of an older version refuses a newer schema.
pub(crate) const VERSION: i32 = 6;

/// The first key of every advisory lock the crate takes, as `tower_lease.lock_class()`
/// (`sql/schema.sql`) answers it. The installation's lock is taken before that function
/// exists, so it is written here too; a test holds the two equal.
const LOCK_CLASS: i32 = 1_953_260_907;

/// The advisory lock the installation holds: the crate's class, and key 0 (no name's key is
/// asked for with it: names take theirs in the functions).
const INSTALL_LOCK: &str = "SELECT pg_catalog.pg_advisory_xact_lock($1, 0)";

/// Every statement of the schema, in order.
const SQL: [&str; 6] = [
    include_str!("sql/schema.sql"),
    include_str!("sql/lock.sql"),
    include_str!("sql/rw.sql"),
    include_str!("sql/permit.sql"),
    include_str!("sql/idempotency.sql"),
    include_str!("sql/many.sql"),
];

/// How long an installation may take, waiting for another replica's included.
const INSTALL_WITHIN: Duration = Duration::from_secs(30);

/// Installs the schema unless this version is there; refuses a newer one, whose functions this
/// version's calls would not match.
pub(crate) async fn install(pool: &Pool) -> Result<()> {
    match tokio::time::timeout(INSTALL_WITHIN, install_now(pool)).await {
        Ok(installed) => installed.map_err(Error::Backend),
        Err(_) => Err(Error::Timeout(INSTALL_WITHIN)),
    }
}

async fn install_now(
    pool: &Pool,
) -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let mut client = pool.get().await?;
    // Most connects find it installed: no lock, no DDL.
    if up_to_date(installed(&**client).await?)? {
        return Ok(());
    }
    let tx = client.transaction().await?;
    tx.execute(INSTALL_LOCK, &[&LOCK_CLASS]).await?;
    // Another replica may have installed it while we waited for the lock.
    if up_to_date(installed(&*tx).await?)? {
        return Ok(());
    }
    for sql in SQL {
        tx.batch_execute(sql).await?;
    }
    tx.execute("DELETE FROM tower_lease.schema_version", &[])
        .await?;
    tx.execute(
        "INSERT INTO tower_lease.schema_version (version) VALUES ($1)",
        &[&VERSION],
    )
    .await?;
    tx.commit().await?;
    tracing::info!(version = VERSION, "installed the tower_lease schema");
    Ok(())
}

/// Whether the schema installed (`installed`, 0 for none) is this version's; an error for a newer
/// one.
fn up_to_date(
    installed: i32,
) -> std::result::Result<bool, Box<dyn std::error::Error + Send + Sync>> {
    if installed > VERSION {
        return Err(format!(
            "the schema tower_lease in this database is at version {installed}, and this \
             tower-lease-postgres installs and speaks version {VERSION}: a newer \
             tower-lease-postgres installed it; run that version (or newer) here too"
        )
        .into());
    }
    Ok(installed == VERSION)
}

/// The version installed, 0 for none.
async fn installed(
    client: &impl tokio_postgres::GenericClient,
) -> std::result::Result<i32, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT pg_catalog.to_regclass('tower_lease.schema_version') IS NOT NULL",
            &[],
        )
        .await?;
    if !row.get::<_, bool>(0) {
        return Ok(0);
    }
    let row = client
        .query_one(
            "SELECT coalesce(pg_catalog.max(version), 0) FROM tower_lease.schema_version",
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
    const SQL_OF_VERSION: (i32, u64) = (6, 0xa9e8_366a_89d1_900b);

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
        assert!(!up_to_date(0).unwrap());
        assert!(!up_to_date(VERSION - 1).unwrap());
        assert!(up_to_date(VERSION).unwrap());
        let refused = up_to_date(VERSION + 1).unwrap_err().to_string();
        assert!(
            refused.contains(&format!("version {}", VERSION + 1)),
            "{refused}"
        );
    }
}
