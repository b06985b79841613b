//! The heartbeat's batches: many replicas extending their full batches at once on a server of
//! default settings never exhaust its shared lock table (`max_locks_per_transaction` × the
//! connections): every lease is extended, and each answer is its own lease's, in order.

use crate::support;

use std::time::Duration;

use tower_lease::backend::{Backend, Extended, LeaseRef, LockRef, Mode, Secret};
use tower_lease_postgres::PgStore;
use tower_lease_postgres::deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tower_lease_postgres::tokio_postgres::NoTls;

/// Replicas, each with a heartbeat batch of the most leases the core sends at once.
const REPLICAS: usize = 48;
const BATCH: usize = 512;
/// Every this many leases of a batch, one held with another secret: answered gone, in place.
const STRANGER_EVERY: usize = 7;
const TTL: Duration = Duration::from_secs(3600);

fn one_connection(url: &str) -> Pool {
    let manager = Manager::from_config(
        url.parse().expect("a URL"),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    Pool::builder(manager).max_size(1).build().unwrap()
}

fn name(replica: usize, lease: usize) -> Vec<u8> {
    format!("r{replica}-{lease}").into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_extending_full_batches_at_once_never_exhaust_the_lock_table() {
    let server = support::server().await;
    let url = server.url();
    let mut stores = Vec::new();
    for _ in 0..REPLICAS {
        let store = PgStore::from_pool(one_connection(&url)).await.unwrap();
        stores.push(store.timeout(Duration::from_secs(30)));
    }
    // Each replica's permits, one name each, live for a minute: taken directly, at once.
    let secrets: Vec<Vec<Secret>> = (0..REPLICAS)
        .map(|_| (0..BATCH).map(|_| Secret::random()).collect())
        .collect();
    let seed = support::client(&url).await;
    for (replica, secrets) in secrets.iter().enumerate() {
        let names: Vec<Vec<u8>> = (0..BATCH).map(|lease| name(replica, lease)).collect();
        let secrets: Vec<&[u8]> = secrets.iter().map(|s| &s.as_bytes()[..]).collect();
        seed.execute(
            "INSERT INTO tower_lease.permits (namespace, name, secret, expires) \
             SELECT 'beats', n, s, clock_timestamp() + interval '1 minute' \
             FROM unnest($1::bytea[], $2::bytea[]) AS u(n, s)",
            &[&names, &secrets],
        )
        .await
        .expect("seed the permits");
    }
    let names: Vec<Vec<Vec<u8>>> = (0..REPLICAS)
        .map(|replica| (0..BATCH).map(|lease| name(replica, lease)).collect())
        .collect();
    let stranger = Secret::random();
    let batches: Vec<Vec<LeaseRef<'_>>> = (0..REPLICAS)
        .map(|replica| {
            (0..BATCH)
                .map(|lease| {
                    let lock = LockRef::new("beats", &names[replica][lease], TTL).permits(1);
                    let secret = match lease % STRANGER_EVERY {
                        0 => &stranger,
                        _ => &secrets[replica][lease],
                    };
                    LeaseRef::new(lock, Mode::Permit, secret)
                })
                .collect()
        })
        .collect();

    // Three heartbeats of every replica at once.
    for beat in 0..3 {
        let beats = stores
            .iter()
            .zip(&batches)
            .map(|(store, batch)| Backend::extend_many(store, batch));
        let answers = futures_util::future::join_all(beats).await;
        for (replica, answers) in answers.iter().enumerate() {
            assert_eq!(answers.len(), BATCH);
            for (lease, answer) in answers.iter().enumerate() {
                match (lease % STRANGER_EVERY, answer) {
                    (0, Ok(Extended::Gone)) => {}
                    (0, other) => panic!(
                        "beat {beat}, replica {replica}, lease {lease} (another's): {other:?}"
                    ),
                    (_, Ok(Extended::Held)) => {}
                    (_, Err(e)) => panic!(
                        "beat {beat}, replica {replica}, lease {lease}: {e} ({:?})",
                        std::error::Error::source(e).map(|s| s.to_string())
                    ),
                    (_, other) => {
                        panic!("beat {beat}, replica {replica}, lease {lease}: {other:?}")
                    }
                }
            }
        }
    }
    // Every permit runs for its TTL now, an hour, not the minute it was seeded with, but those
    // held with another secret.
    let strangers = (REPLICAS * BATCH.div_ceil(STRANGER_EVERY)) as i64;
    let short: i64 = seed
        .query_one(
            "SELECT count(*) FROM tower_lease.permits \
             WHERE expires < clock_timestamp() + interval '30 minutes'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(short, strangers, "permits not extended");
}
