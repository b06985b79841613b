//! Installing the schema `tower_lease` (the `.sql` files beside this one), once per database
//! and version, however many replicas start at once.

use std::time::Duration;

use deadpool_postgres::Pool;
use tower_lease::{Error, Result};

/// The schema's version: raised with every change of a table or function, so a store of a
/// newer version installs its own over an older one.
pub(crate) const VERSION: i32 = 3;

/// The key of the advisory lock the installation holds (the first is the crate's).
const INSTALL_LOCK: &str = "SELECT pg_advisory_xact_lock(1953260907, 0)";

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

/// Installs the schema unless this version (or a newer one) is there.
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
    if installed(&**client).await? >= VERSION {
        return Ok(());
    }
    let tx = client.transaction().await?;
    tx.execute(INSTALL_LOCK, &[]).await?;
    // Another replica may have installed it while we waited for the lock.
    if installed(&*tx).await? >= VERSION {
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

/// The version installed, 0 for none.
async fn installed(
    client: &impl tokio_postgres::GenericClient,
) -> std::result::Result<i32, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT to_regclass('tower_lease.schema_version') IS NOT NULL",
            &[],
        )
        .await?;
    if !row.get::<_, bool>(0) {
        return Ok(0);
    }
    let row = client
        .query_one(
            "SELECT coalesce(max(version), 0) FROM tower_lease.schema_version",
            &[],
        )
        .await?;
    Ok(row.get(0))
}
