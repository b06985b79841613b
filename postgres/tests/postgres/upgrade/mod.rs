//! Upgrades and rollbacks on one database: the previous version's schema (`schema_v8.sql`, as a
//! store of that version installed it) and its calls beside this version's, a newer version
//! that reaches back to this one or does not, the contraction, and what the installer
//! refuses to touch or to wait for.

use crate::support;

use std::time::{Duration, Instant};

use tower_lease::{Lock, Store};
use tower_lease_postgres::{PgStore, SCHEMA_VERSION};

const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(30));

/// The schema as version 8 of the crate installed it: the last before versioned functions.
const SCHEMA_V8: &str = include_str!("schema_v8.sql");

/// A replica of version 8, as its calls reach the server: its unversioned functions.
struct OldReplica(tokio_postgres::Client);

impl OldReplica {
    async fn on(url: &str) -> OldReplica {
        OldReplica(support::client(url).await)
    }

    /// Takes `name` of `jobs` for `secret`: `Ok(acquired)`, or the server's error.
    async fn acquire(&self, name: &str, secret: &str) -> Result<bool, tokio_postgres::Error> {
        let row = self
            .0
            .query_one(
                "SELECT acquired FROM tower_lease.lock_acquire('jobs', $1, $2, 30000, false)",
                &[&name.as_bytes(), &secret.as_bytes()],
            )
            .await?;
        Ok(row.get(0))
    }

    async fn release(&self, name: &str, secret: &str) -> Result<bool, tokio_postgres::Error> {
        let row = self
            .0
            .query_one(
                "SELECT tower_lease.lock_release('jobs', $1, $2)",
                &[&name.as_bytes(), &secret.as_bytes()],
            )
            .await?;
        Ok(row.get(0))
    }
}

/// The versions the schema's rows name, in order.
async fn versions(client: &tokio_postgres::Client) -> Vec<i32> {
    client
        .query(
            "SELECT version FROM tower_lease.schema_version ORDER BY version",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Whether a function of the schema named `name` exists.
async fn function_exists(client: &tokio_postgres::Client, name: &str) -> bool {
    client
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_proc WHERE proname = $1 \
             AND pronamespace = 'tower_lease'::regnamespace)",
            &[&name],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_previous_versions_replicas_keep_their_calls_while_this_one_installs() {
    let server = support::server().await;
    let url = server.url();
    let admin = support::client(&url).await;
    admin.batch_execute(SCHEMA_V8).await.unwrap();
    let old = OldReplica::on(&url).await;
    assert!(old.acquire("a", "old").await.unwrap());

    // The first replica of this version starts.
    let new: Store = support::pg_store(&server).await.into();
    assert_eq!(versions(&admin).await, [8, SCHEMA_VERSION]);

    // The old replica's calls still run, on the same leases as the new one's.
    assert!(
        JOBS.try_lock(&new, "a").await.unwrap().is_none(),
        "held by the old replica"
    );
    assert!(old.release("a", "old").await.expect("the old release runs"));
    let token = JOBS.try_lock(&new, "a").await.unwrap().expect("free");
    assert!(
        !old.acquire("a", "old-2")
            .await
            .expect("the old acquisition runs")
    );
    assert!(token.release().await.unwrap());
    assert!(old.acquire("a", "old-2").await.unwrap());
    assert!(JOBS.try_lock(&new, "a").await.unwrap().is_none());

    // The view `leases` is the newest's, and shows the old replica's lease.
    let seen: i64 = admin
        .query_one(
            "SELECT count(*) FROM tower_lease.leases WHERE namespace = 'jobs' AND name = 'a'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(seen, 1);

    // A second replica of this version finds it installed; the old one restarting refuses
    // the newer schema (its own check, from before versions ran side by side), and its
    // functions are still there for the replicas of it that run.
    let _again: Store = support::pg_store(&server).await.into();
    assert_eq!(versions(&admin).await, [8, SCHEMA_VERSION]);
    assert!(function_exists(&admin, "lock_acquire").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_contraction_drops_only_the_older_versions_functions() {
    let server = support::server().await;
    let url = server.url();
    let admin = support::client(&url).await;
    admin.batch_execute(SCHEMA_V8).await.unwrap();
    let old = OldReplica::on(&url).await;
    assert!(old.acquire("held", "old").await.unwrap());
    let pg = support::pg_store(&server).await;
    let store: Store = pg.clone().into();

    pg.contract().await.expect("contracts");
    assert_eq!(versions(&admin).await, [SCHEMA_VERSION]);
    assert!(!function_exists(&admin, "lock_acquire").await);
    assert!(function_exists(&admin, &format!("lock_acquire_v{SCHEMA_VERSION}")).await);
    let gone = old
        .acquire("other", "old")
        .await
        .expect_err("its functions are gone");
    let said = gone.as_db_error().map(|e| e.message().to_owned());
    assert!(
        said.as_ref().is_some_and(|s| s.contains("does not exist")),
        "{said:?}"
    );
    // The leases stay: the old replica's lease still holds its name until it ends.
    assert!(JOBS.try_lock(&store, "held").await.unwrap().is_none());
    let token = JOBS.try_lock(&store, "other").await.unwrap().expect("free");
    assert!(token.release().await.unwrap());
    // Twice is no harm.
    pg.contract().await.expect("contracts again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_version_that_reaches_back_keeps_this_one_running_and_one_that_does_not_refuses_it()
{
    let server = support::server().await;
    let url = server.url();
    let admin = support::client(&url).await;
    let first: Store = support::pg_store(&server).await.into();
    let held = JOBS.try_lock(&first, "x").await.unwrap().expect("free");

    // A newer version installed beside this one, and contracted this one's functions away
    // (as its contract step would): a rollback to this version installs them again, and
    // leaves the tables and the newer version's view alone.
    let next = SCHEMA_VERSION + 1;
    admin
        .batch_execute(&format!(
            "INSERT INTO tower_lease.schema_version (version, oldest_peer) \
             VALUES ({next}, {SCHEMA_VERSION});
             DELETE FROM tower_lease.schema_version WHERE version = {SCHEMA_VERSION};
             DROP VIEW tower_lease.leases;
             CREATE VIEW tower_lease.leases AS SELECT 'newer'::text AS kind;
             DROP FUNCTION tower_lease.lock_acquire_v{SCHEMA_VERSION};"
        ))
        .await
        .unwrap();
    let rolled_back: Store = support::pg_store(&server).await.into();
    assert_eq!(versions(&admin).await, [SCHEMA_VERSION, next]);
    assert!(
        JOBS.try_lock(&rolled_back, "x").await.unwrap().is_none(),
        "still held"
    );
    assert!(held.release().await.unwrap());
    let token = JOBS
        .try_lock(&rolled_back, "x")
        .await
        .unwrap()
        .expect("free");
    assert!(token.release().await.unwrap());
    let kind: String = admin
        .query_one("SELECT kind FROM tower_lease.leases", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(kind, "newer", "the newest version's view stays");

    // A newer version that does not run beside this one: refused, naming both.
    admin
        .batch_execute(&format!(
            "UPDATE tower_lease.schema_version SET oldest_peer = {next} WHERE version = {next}"
        ))
        .await
        .unwrap();
    let refused = PgStore::connect(&url).await.expect_err("refused");
    let said = refused.to_string();
    assert!(
        said.contains(&format!("version {next}")) && said.contains(&SCHEMA_VERSION.to_string()),
        "the refusal says which versions met: {said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_holding_what_the_store_did_not_make_is_refused_and_left_alone() {
    let server = support::server().await;
    let url = server.url();
    let admin = support::client(&url).await;
    admin
        .batch_execute(
            "CREATE SCHEMA shop; CREATE TABLE shop.locks (id integer); \
             CREATE FUNCTION shop.price() RETURNS integer LANGUAGE sql AS 'SELECT 1'",
        )
        .await
        .unwrap();
    let refused = PgStore::builder()
        .schema("shop")
        .connect(&url)
        .await
        .expect_err("not its schema");
    let said = refused.to_string();
    assert!(
        said.contains("did not make") && said.contains("locks"),
        "{said}"
    );
    let columns: i64 = admin
        .query_one(
            "SELECT count(*) FROM information_schema.columns \
             WHERE table_schema = 'shop' AND table_name = 'locks'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(columns, 1, "the application's table is untouched");
    assert!(
        admin.query_one("SELECT shop.price()", &[]).await.is_ok(),
        "the application's function stays"
    );

    let public = PgStore::builder().schema("public").connect(&url).await;
    let said = public.expect_err("public is everyone's").to_string();
    assert!(said.contains("public"), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_made_in_advance_needs_no_create_on_the_database() {
    let server = support::server().await;
    let url = server.url();
    let admin = support::client(&url).await;
    admin
        .batch_execute(
            "CREATE ROLE locker LOGIN; REVOKE CREATE ON SCHEMA public FROM PUBLIC; \
             REVOKE CREATE ON DATABASE postgres FROM PUBLIC; \
             CREATE SCHEMA tower_lease AUTHORIZATION locker",
        )
        .await
        .unwrap();
    let locker_url = url.replace("postgres://postgres@", "postgres://locker@");
    let store: Store = PgStore::connect(&locker_url)
        .await
        .expect("installs in the schema made for it")
        .into();
    let token = JOBS.try_lock(&store, "x").await.unwrap().expect("free");
    assert!(token.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_installation_waits_for_no_table_lock_of_an_application() {
    let server = support::server().await;
    let url = server.url();
    let admin = support::client(&url).await;
    // A version older than the oldest this one runs beside: its functions go.
    admin.batch_execute(SCHEMA_V8).await.unwrap();
    admin
        .batch_execute("UPDATE tower_lease.schema_version SET version = 7")
        .await
        .unwrap();
    // An application's long transaction that read the tables.
    let app = support::client(&url).await;
    app.batch_execute(
        "BEGIN; SELECT count(*) FROM tower_lease.locks; SELECT count(*) FROM tower_lease.claims",
    )
    .await
    .unwrap();
    let started = Instant::now();
    let store: Store = tokio::time::timeout(Duration::from_secs(10), support::pg_store(&server))
        .await
        .expect("installs beside the open transaction")
        .into();
    let took = started.elapsed();
    let token = JOBS.try_lock(&store, "x").await.unwrap().expect("free");
    assert!(token.release().await.unwrap());
    assert!(took < Duration::from_secs(5), "installed in {took:?}");
    assert_eq!(versions(&admin).await, [SCHEMA_VERSION]);
    assert!(
        !function_exists(&admin, "lock_acquire").await,
        "version 7's functions go"
    );
    app.batch_execute("COMMIT").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_column_is_added_once_the_applications_lock_is_gone() {
    let server = support::server().await;
    let url = server.url();
    let admin = support::client(&url).await;
    admin.batch_execute(SCHEMA_V8).await.unwrap();
    admin
        .batch_execute(
            "ALTER TABLE tower_lease.claims DROP COLUMN claimed_at; \
             DROP INDEX tower_lease.waited_sweep_after",
        )
        .await
        .unwrap();
    let old = OldReplica::on(&url).await;
    // The application holds the table for 1.5 s: the ALTER gives way and tries again, and
    // the calls on the other tables never queue behind it.
    let app = support::client(&url).await;
    app.batch_execute("BEGIN; SELECT count(*) FROM tower_lease.claims")
        .await
        .unwrap();
    let installing = tokio::spawn({
        let url = url.clone();
        async move { PgStore::connect(&url).await }
    });
    let mut slowest = Duration::ZERO;
    let until = Instant::now() + Duration::from_millis(1_500);
    let mut n = 0;
    while Instant::now() < until {
        let sent = Instant::now();
        let name = format!("n{n}");
        assert!(old.acquire(&name, "old").await.unwrap());
        assert!(old.release(&name, "old").await.unwrap());
        slowest = slowest.max(sent.elapsed());
        n += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !installing.is_finished(),
        "the column waits for the application's lock"
    );
    app.batch_execute("COMMIT").await.unwrap();
    let store: Store = tokio::time::timeout(Duration::from_secs(10), installing)
        .await
        .expect("installs once the lock is gone")
        .unwrap()
        .expect("installs")
        .into();
    assert!(
        slowest < Duration::from_millis(500),
        "an old call took {slowest:?}"
    );
    let column: bool = admin
        .query_one(
            "SELECT EXISTS (SELECT FROM information_schema.columns WHERE table_schema = \
             'tower_lease' AND table_name = 'claims' AND column_name = 'claimed_at')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(column);
    let index: bool = admin
        .query_one(
            "SELECT to_regclass('tower_lease.waited_sweep_after') IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(index, "the missing index is built");
    let token = JOBS.try_lock(&store, "x").await.unwrap().expect("free");
    assert!(token.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_names_each_grant_the_stores_user_lacks() {
    let server = support::server().await;
    let url = server.url();
    let mut admin = support::client(&url).await;
    admin
        .batch_execute(
            "CREATE ROLE locker LOGIN; REVOKE CREATE ON SCHEMA public FROM PUBLIC; \
             ALTER DEFAULT PRIVILEGES REVOKE EXECUTE ON FUNCTIONS FROM PUBLIC",
        )
        .await
        .unwrap();
    let tx = admin.transaction().await.unwrap();
    tx.batch_execute(&tower_lease_postgres::schema_sql("tower_lease"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    // The README's grants, but for EXECUTE (which this database no longer gives to PUBLIC),
    // and none on the table `claims`.
    admin
        .batch_execute(
            "GRANT USAGE ON SCHEMA tower_lease TO locker; \
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA tower_lease TO locker; \
             REVOKE ALL ON tower_lease.claims FROM locker",
        )
        .await
        .unwrap();
    let locker_url = url.replace("postgres://postgres@", "postgres://locker@");
    let store = PgStore::builder()
        .install_schema(false)
        .connect(&locker_url)
        .await
        .expect("connects");
    let grants = store
        .check()
        .await
        .unwrap()
        .into_iter()
        .find_map(|warning| match warning {
            tower_lease_postgres::PgWarning::MissingPrivileges { grants } => Some(grants),
            _ => None,
        })
        .expect("the missing privileges are named");
    let lock_acquire = format!("EXECUTE ON FUNCTION tower_lease.lock_acquire_v{SCHEMA_VERSION}(");
    assert!(
        grants.iter().any(|g| g.starts_with(&lock_acquire)),
        "{grants:?}"
    );
    assert!(
        grants
            .iter()
            .any(|g| g == "SELECT, INSERT, UPDATE, DELETE ON TABLE tower_lease.claims"),
        "{grants:?}"
    );
    assert!(
        !grants.iter().any(|g| g.contains("tower_lease.locks")),
        "{grants:?}"
    );

    // With the README's grants, EXECUTE included: nothing to name, and the calls run.
    admin
        .batch_execute(
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA tower_lease TO locker; \
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA tower_lease TO locker",
        )
        .await
        .unwrap();
    let warnings = store.check().await.unwrap();
    assert!(
        !warnings
            .iter()
            .any(|w| matches!(w, tower_lease_postgres::PgWarning::MissingPrivileges { .. })),
        "{warnings:?}"
    );
    let store: Store = store.into();
    let token = JOBS.try_lock(&store, "x").await.unwrap().expect("free");
    assert!(token.release().await.unwrap());
}
