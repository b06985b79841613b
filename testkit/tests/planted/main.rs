//! Proof that the suite fails broken backends: a copy of the memory store with one bug planted
//! per run ([`Bug`]), every scenario of the suite run on it, and at least one must fail. The
//! copy without a bug passes them all. `testkit/README.md` records which scenarios catch each
//! bug (run with `--nocapture` to print them).

mod store;

use std::time::Duration;

use tower_lease::Store;
use tower_lease_testkit::{Env, scenarios};

use crate::store::{Bug, MemoryStore};

fn env(bug: Bug) -> Env {
    let store = MemoryStore::new(bug);
    let wipe = store.clone();
    Env::new(Store::from_backend(store)).with_data_loss(move || {
        wipe.lose_data();
        Box::pin(async {})
    })
}

/// Runs every scenario on a store with `bug`, each on a thread of its own under tokio's paused
/// clock; answers the scenarios that failed (panicked or ran past a paused 10 minutes).
fn failing(bug: Bug) -> Vec<String> {
    let mut failed = Vec::new();
    for scenario in scenarios() {
        let run = scenario.run;
        let outcome = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .start_paused(true)
                .build()
                .unwrap();
            runtime.block_on(async move {
                tokio::time::timeout(Duration::from_secs(600), run(env(bug))).await
            })
        })
        .join();
        if !matches!(outcome, Ok(Ok(()))) {
            failed.push(format!("{}::{}", scenario.module, scenario.name));
        }
    }
    println!("{bug:?}: caught by {failed:?}");
    failed
}

#[test]
fn without_a_bug_every_scenario_passes() {
    let failed = failing(Bug::None);
    assert!(failed.is_empty(), "the unbroken copy failed {failed:?}");
}

macro_rules! caught {
    ($($test:ident: $bug:ident,)*) => {
        $(
            #[test]
            fn $test() {
                let failed = failing(Bug::$bug);
                assert!(!failed.is_empty(), "no scenario caught {:?}", Bug::$bug);
            }
        )*
    };
}

caught! {
    readers_retry_min: ReadersRetryMin,
    permits_retry_max: PermitsRetryMax,
    extend_revives: ExtendRevives,
    release_expired_true: ReleaseExpiredTrue,
    counter_fence: CounterFence,
    no_write_intent: NoWriteIntent,
    no_writer_waiting_flag: NoWriterWaitingFlag,
    release_ignores_secret: ReleaseIgnoresSecret,
    intent_kept_after_write: IntentKeptAfterWrite,
    reservation_overwrite: ReservationOverwrite,
    extend_ignores_secret: ExtendIgnoresSecret,
    in_use_counts_expired: InUseCountsExpired,
    begin_once_no_marker: BeginOnceNoMarker,
    stranger_completes: StrangerCompletes,
}
