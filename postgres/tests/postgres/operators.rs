//! What an operator sees of a store: its connections by `application_name`, the live leases
//! in the view `leases`, a sweep that finds ended rows by index rather than by scanning, and
//! the sweep's cadence.

use crate::support;

use std::time::Duration;

use tower_lease::{Lock, RwLock, Semaphore, Store};
use tower_lease_postgres::PgStore;

const INVOICES: Lock<str> = Lock::new("invoices", Duration::from_secs(30)).fenced();
const DOCS: RwLock<str> = RwLock::new("docs", Duration::from_secs(30)).fenced();
const EXPORTS: Semaphore<str> = Semaphore::new("exports", 2, Duration::from_secs(30));

/// The `application_name` of every client session but the caller's.
async fn application_names(client: &tokio_postgres::Client) -> Vec<String> {
    client
        .query(
            "SELECT coalesce(application_name, '') FROM pg_stat_activity \
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid() ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect()
}

/// Waits until the store's listener is connected, so its session is counted.
async fn listening(store: &Store) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !store.check().await.unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "no listener");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A lock taken and given back: the pool has opened a connection besides the installer's.
    let token = INVOICES.try_lock(store, "warm").await.unwrap().unwrap();
    token.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_connection_of_a_store_names_its_application() {
    let server = support::server().await;
    let url = server.url();
    let store: Store = support::pg_store(&server).await.into();
    listening(&store).await;
    let client = support::client(&url).await;
    let names = application_names(&client).await;
    assert!(names.len() >= 2, "the pool's and the listener's: {names:?}");
    assert!(
        names.iter().all(|name| name == "tower-lease"),
        "the default name on every connection: {names:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leases_view_lists_each_live_lease() {
    let server = support::server().await;
    let url = server.url();
    let store: Store = support::pg_store(&server).await.into();
    let lock = INVOICES.try_lock(&store, "inv-7").await.unwrap().unwrap();
    let write = DOCS.try_write(&store, "readme").await.unwrap().unwrap();
    let read = DOCS.try_read(&store, "guide").await.unwrap().unwrap();
    let permit = EXPORTS.try_acquire(&store, "csv").await.unwrap().unwrap();
    let ended = INVOICES.try_lock(&store, "inv-8").await.unwrap().unwrap();
    assert!(ended.release().await.unwrap());

    let client = support::client(&url).await;
    let rows = client
        .query(
            "SELECT kind, namespace, name, holder, expires > now() AS live, fence \
             FROM tower_lease.leases ORDER BY kind, name",
            &[],
        )
        .await
        .expect("the view tower_lease.leases");
    let seen: Vec<(String, String, String, String, bool, Option<i64>)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect();
    let fence = |token: Option<u64>| token.map(|fence| fence as i64);
    let expected = [
        ("lock", "invoices", "inv-7", fence(lock.fence())),
        ("permit", "exports", "csv", None),
        // No write yet: no fence issued on the name.
        ("read", "docs", "guide", None),
        ("write", "docs", "readme", fence(write.fence())),
    ];
    assert_eq!(seen.len(), expected.len(), "the live leases only: {seen:?}");
    for ((kind, namespace, name, holder, live, found), (k, ns, n, f)) in seen.iter().zip(expected) {
        assert_eq!(
            (kind.as_str(), namespace.as_str(), name.as_str()),
            (k, ns, n)
        );
        assert!(*live, "{kind} {name}: live");
        assert!(
            holder.starts_with("tower-lease"),
            "{kind} {name}: the holder's application: {holder:?}"
        );
        assert_eq!(*found, f, "{kind} {name}: its fence");
    }
    assert!(lock.release().await.unwrap());
    assert!(write.release().await.unwrap());
    assert!(read.release().await.unwrap());
    assert!(permit.release().await.unwrap());
    let left: i64 = client
        .query_one("SELECT count(*) FROM tower_lease.leases", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "released leases leave the view");
}

/// How many sequential scans of `tower_lease.<table>` the current transaction made.
async fn seq_scans(tx: &tokio_postgres::Transaction<'_>, table: &str) -> i64 {
    tx.query_one(
        "SELECT seq_scan FROM pg_stat_xact_user_tables \
         WHERE schemaname = 'tower_lease' AND relname = $1",
        &[&table],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_finds_ended_rows_by_index() {
    let server = support::server().await;
    let url = server.url();
    let _store = support::pg_store(&server).await;
    let mut client = support::client(&url).await;
    // Many live rows, which a first sweep has seen; then a few ended ones: a scan reads them
    // all, an index the ended ones.
    let rows = |namespace: &str, from_now: &str| {
        format!(
            "INSERT INTO tower_lease.locks (namespace, name, secret, expires) \
               SELECT '{namespace}', int4send(i), 'x', now() + interval '{from_now}' \
               FROM generate_series(1, 20000) i;
             INSERT INTO tower_lease.permits (namespace, name, secret, expires) \
               SELECT '{namespace}', int4send(i), 'x', now() + interval '{from_now}' \
               FROM generate_series(1, 20000) i;"
        )
    };
    client.batch_execute(&rows("live", "1 hour")).await.unwrap();
    client
        .batch_execute(&support::versioned("SELECT tower_lease.sweep(100000)"))
        .await
        .unwrap();
    let ended = rows("ended", "-1 hour").replace("20000", "10");
    client.batch_execute(&ended).await.unwrap();
    client
        .batch_execute("ANALYZE tower_lease.locks, tower_lease.permits")
        .await
        .unwrap();
    let tx = client.transaction().await.unwrap();
    // Past the five calls after which a session may plan a statement for any parameter.
    for sweep in 0..8 {
        let gone: i32 = tx
            .query_one(&support::versioned("SELECT tower_lease.sweep(100)"), &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(gone, if sweep == 0 { 10 } else { 0 }, "the ended rows");
    }

    for table in ["locks", "permits"] {
        assert_eq!(seq_scans(&tx, table).await, 0, "{table}: swept by index");
    }
    tx.commit().await.unwrap();
    let left: i64 = client
        .query_one(
            "SELECT (SELECT count(*) FROM tower_lease.locks) \
                  + (SELECT count(*) FROM tower_lease.permits)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 40000, "the live rows stay");
}

/// An ended `Lock` row the calls on its name would not delete: only a sweep does.
async fn plant_an_ended_row(client: &tokio_postgres::Client) {
    client
        .batch_execute(
            "INSERT INTO tower_lease.locks (namespace, name, secret, expires) \
             VALUES ('planted', 'x', 'x', now() - interval '1 minute')",
        )
        .await
        .unwrap();
}

async fn planted(client: &tokio_postgres::Client) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM tower_lease.locks WHERE namespace = 'planted'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Takes and gives back a lock: an acquisition, after which the store may sweep.
async fn acquire(store: &Store, name: &str) {
    let token = INVOICES.try_lock(store, name).await.unwrap().unwrap();
    token.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_comes_as_often_as_told() {
    let server = support::server().await;
    let url = server.url();
    let client = support::client(&url).await;
    let often: Store = PgStore::builder()
        .sweep_every(Duration::from_millis(100))
        .connect(&url)
        .await
        .unwrap()
        .into();
    let seldom: Store = PgStore::builder()
        .sweep_every(Duration::from_secs(3600))
        .connect(&url)
        .await
        .unwrap()
        .into();

    // Each store's first acquisition sweeps; the next within its cadence does not.
    acquire(&seldom, "a").await;
    acquire(&often, "a").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    plant_an_ended_row(&client).await;
    acquire(&seldom, "b").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(planted(&client).await, 1, "an hourly sweep waits its hour");
    acquire(&often, "b").await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while planted(&client).await != 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "a sweep every 100 ms came"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_and_the_name_are_the_builders() {
    let server = support::server().await;
    let url = server.url();
    let store = PgStore::builder()
        .max_connections(3)
        .application_name("shop-eu-1")
        .connect(&url)
        .await
        .unwrap()
        .expect_concurrency(8);
    assert_eq!(store.pool().status().max_size, 3);
    assert!(
        store
            .check()
            .await
            .unwrap()
            .contains(&tower_lease_postgres::PgWarning::SmallPool {
                pool: 3,
                expected: 8
            })
    );
    let store: Store = store.into();
    listening_but_small(&store).await;
    let names = application_names(&support::client(&url).await).await;
    assert!(
        !names.is_empty() && names.iter().all(|name| name == "shop-eu-1"),
        "{names:?}"
    );

    // A name in the URL counts unless the builder gives one.
    let named = format!("{url}?application_name=from-url");
    let store: Store = PgStore::connect(&named).await.unwrap().into();
    acquire(&store, "u").await;
    let names = application_names(&support::client(&url).await).await;
    assert!(names.iter().any(|name| name == "from-url"), "{names:?}");
}

/// As [`listening`], for a store whose check also warns of its small pool.
async fn listening_but_small(store: &Store) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while store.check().await.unwrap().len() > 1 {
        assert!(tokio::time::Instant::now() < deadline, "no listener");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    acquire(store, "warm").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locks_calls_change_no_indexed_column() {
    let server = support::server().await;
    let url = server.url();
    let _store = support::pg_store(&server).await;
    let mut client = support::client(&url).await;
    // A fenced lock's row stays between its leases (its fence counter lives), so each
    // acquisition and release after the first updates it: in place, the sweep's index left be.
    let tx = client.transaction().await.unwrap();
    for _ in 0..10 {
        tx.batch_execute(&support::versioned(
            "SELECT tower_lease.lock_acquire('hot', 'x', 'holder', 10000, true);
             SELECT tower_lease.lock_extend('hot', 'x', 'holder', 10000);
             SELECT tower_lease.lock_release('hot', 'x', 'holder');",
        ))
        .await
        .unwrap();
    }
    let row = tx
        .query_one(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables \
             WHERE schemaname = 'tower_lease' AND relname = 'locks'",
            &[],
        )
        .await
        .unwrap();
    let (updates, in_place): (i64, i64) = (row.get(0), row.get(1));
    assert_eq!(
        updates, 29,
        "9 acquisitions, 10 extensions and 10 releases update"
    );
    assert_eq!(in_place, updates, "every update a HOT one");
    tx.commit().await.unwrap();
}
