//! A part of the conformance suite through the pooler, with the option: one scenario or two
//! of each kind, both stores of the `Env` through it and listening directly, the intent probe
//! and the data loss on the server directly.

use tower_lease::Store;
use tower_lease_testkit::Env;

use crate::{bouncer, pooled_store, support};

/// The test kit's `Env` through the pooler with the option: both stores through it, listening
/// directly; the intent probe and the data loss on the server directly.
async fn pooled_env() -> Env {
    let (server, bouncer) = bouncer().await;
    let url = server.url();
    let store: Store = pooled_store(&bouncer, &server).await.into();
    let elsewhere: Store = pooled_store(&bouncer, &server).await.into();
    let (probe_url, loss_url) = (url.clone(), url);
    Env::new(store)
        .with_elsewhere(elsewhere)
        .with_intent_probe(move |namespace, name| {
            let (url, namespace, name) = (probe_url.clone(), namespace.to_owned(), name.to_vec());
            Box::pin(async move {
                support::client(&url)
                    .await
                    .query_one(
                        "SELECT EXISTS (SELECT 1 FROM tower_lease.rwlocks WHERE namespace = $1 \
                         AND name = $2 AND intent_expires > clock_timestamp())",
                        &[&namespace, &name],
                    )
                    .await
                    .expect("look at the intents")
                    .get(0)
            })
        })
        .with_data_loss(move || {
            let url = loss_url.clone();
            Box::pin(async move {
                support::client(&url)
                    .await
                    .batch_execute(
                        "TRUNCATE tower_lease.locks, tower_lease.rwlocks, tower_lease.readers, \
                         tower_lease.permits, tower_lease.idempotency, tower_lease.claims",
                    )
                    .await
                    .expect("truncate");
            })
        })
        .holding((bouncer, server))
}

macro_rules! through_the_pooler {
    ($($module:ident::$name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                tower_lease_testkit::$module::$name(pooled_env().await).await
            }
        )*
    };
}

through_the_pooler!(
    exclusive::mutual_exclusion,
    exclusive::stale_release_leaves_next_holder_alone,
    exclusive::fences_increase_per_name,
    rw::writer_excludes_everyone,
    rw::readers_block_writer_until_released,
    semaphore::permits_up_to_the_limit,
    semaphore::a_waiter_gets_the_slot_a_release_frees,
    idempotency::complete_then_replay_or_mismatch,
    fairness::waiters_side_by_side_in_one_process_all_hear_their_release,
    fairness::writers_queued_in_one_process_hand_on_promptly,
);
