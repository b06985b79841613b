//! A part of the conformance suite through the pooler, with the option: one scenario or two
//! of each kind, both stores of the `Env` through it and listening directly, the intent probe
//! and the data loss on the server directly.

use tower_lease::Store;
use tower_lease_testkit::Env;

use super::{bouncer, pooled_store};
use crate::support;

/// The test kit's `Env` through the pooler with the option: both stores through it, listening
/// directly; the intent probe and the data loss on the server directly.
async fn pooled_env() -> Env {
    let (server, bouncer) = bouncer().await;
    let store: Store = pooled_store(&bouncer, &server).await.into();
    let elsewhere: Store = pooled_store(&bouncer, &server).await.into();
    support::env_on(&server.url(), store, elsewhere).holding((bouncer, server))
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
