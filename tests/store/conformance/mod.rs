//! The conformance suite of `tower-lease-testkit`, every behaviour of the core, run against a
//! real `redis-server` (started per test on a free loopback port) and a local Redis Cluster
//! (`tests/memory` runs it on `Store::memory()`). Tests that look at Redis itself (key names,
//! PTTL, SCRIPT FLUSH) run there only, in `redis_only`.

mod redis_only;

use tower_lease::store::KeyRole;
use tower_lease_testkit::Env;

/// The suite's `Env` on a store of `env`: for Redis with a second, notified store on the same
/// servers, a look at the write-intent keys and `FLUSHALL` as its data loss, and the servers
/// kept running for the test.
async fn testkit_env(env: tower_lease_harness::Backing) -> Env {
    testkit_env_on(env.store.clone(), env).await
}

/// [`testkit_env`] on `store`, one of `env`'s.
async fn testkit_env_on(store: tower_lease::Store, env: tower_lease_harness::Backing) -> Env {
    let mut kit = Env::new(store);
    if let Some(elsewhere) = env.notified().await {
        kit = kit.with_elsewhere(elsewhere);
    }
    if env.is_redis() {
        let raw = env.raw().clone();
        kit = kit.with_intent_probe(move |namespace, name| {
            let (raw, key) = (raw.clone(), raw.key(KeyRole::WriteIntent, namespace, name));
            Box::pin(async move { raw.exists(&key).await })
        });
        let raw = env.raw().clone();
        kit = kit.with_data_loss(move || {
            let raw = raw.clone();
            Box::pin(async move {
                let () = raw.query(&redis::cmd("FLUSHALL")).await;
            })
        });
    }
    kit.holding(env)
}

mod on_redis {
    tower_lease_testkit::conformance!(
        crate::conformance::testkit_env(
            tower_lease_harness::Backing::redis(tower_lease_harness::Setup::Core).await
        )
        .await
    );
}

/// Both stores as `connect_cluster` makes them: they publish alike (sharded on Redis 7), so
/// each hears the other's releases.
#[cfg(feature = "cluster")]
mod on_cluster {
    tower_lease_testkit::conformance!({
        let env = tower_lease_harness::Backing::cluster(tower_lease_harness::Setup::Core).await;
        let store = env.notified().await.expect("a cluster store");
        crate::conformance::testkit_env_on(store, env).await
    });
}
