//! Proof that the suite fails broken backends: a copy of the memory store with one bug planted
//! per run ([`Bug`]), every scenario of the suite run on it, and at least one must fail. The
//! copy without a bug passes them all. `testkit/README.md` records which scenarios catch each
//! bug (run with `--nocapture` to print them).

mod store;

use std::time::{Duration, Instant};

use tower_lease::Store;
use tower_lease_testkit::{Env, SuiteRun, scenarios};

use crate::store::{Bug, MemoryStore};

/// The suite's `Env` on a store with `bug`, and a second store on the same backend (its
/// notifications shared through an in-process bus) as another process.
fn env(bug: Bug) -> Env {
    let store = MemoryStore::new(bug);
    let wipe = store.clone();
    Env::new(Store::from_backend(store.clone()))
        .with_elsewhere(Store::from_backend(store))
        .with_data_loss(move || {
            wipe.lose_data();
            Box::pin(async {})
        })
}

/// Runs every scenario on a store with `bug`, each on a thread of its own under tokio's paused
/// clock; answers the scenarios that failed (panicked, also past the kit's deadline).
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
            // `run` fails a scenario past the kit's deadline (`Hangs` relies on it).
            runtime.block_on(async move { run(env(bug)).await })
        })
        .join();
        if outcome.is_err() {
            failed.push(format!("{}::{}", scenario.module, scenario.name));
        }
    }
    println!("{bug:?}: caught by {failed:?}");
    failed
}

/// Runs every scenario on a store with `bug` in real time, one after another as parts of one
/// `run`; answers each failed scenario's panic message, and how long they all took.
fn failing_in_real_time(bug: Bug, run: &'static SuiteRun) -> (Vec<(String, String)>, Duration) {
    let started = Instant::now();
    let mut failed = Vec::new();
    for scenario in scenarios() {
        let outcome = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move { scenario.run_in(run, env(bug)).await })
        })
        .join();
        if let Err(panic) = outcome {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            failed.push((format!("{}::{}", scenario.module, scenario.name), message));
        }
    }
    (failed, started.elapsed())
}

/// A backend whose calls hang fails the whole suite within 30 s, in real time: the first call
/// that never answers fails its scenario within the kit's call deadline, naming the call, and
/// every scenario after it at once.
fn a_hanging_backend_fails_the_suite_fast(bug: Bug, run: &'static SuiteRun, call: &str) {
    let (failed, took) = failing_in_real_time(bug, run);
    let all = scenarios().len();
    assert!(
        took < Duration::from_secs(30),
        "{bug:?}: the suite took {took:?}"
    );
    let (first, why) = failed.first().expect("no scenario failed");
    assert!(why.contains(call), "{bug:?}: {first} failed with {why:?}");
    assert!(
        failed[1..]
            .iter()
            .all(|(_, why)| why.contains("not run") && why.contains(call)),
        "{bug:?}: the scenarios after {first}: {failed:?}"
    );
    println!(
        "{bug:?}: {first} failed ({why}), and {} more, in {took:?}",
        failed.len() - 1
    );
    assert!(failed.len() >= all / 2, "{bug:?}: only {failed:?} failed");
}

#[test]
fn an_acquisition_that_never_answers_fails_the_suite_within_30_s() {
    static RUN: SuiteRun = SuiteRun::new();
    a_hanging_backend_fails_the_suite_fast(
        Bug::AcquireHangs,
        &RUN,
        "Backend::acquire of the Exclusive lease",
    );
}

#[test]
fn a_pool_that_leaks_its_connections_fails_the_suite_within_30_s() {
    static RUN: SuiteRun = SuiteRun::new();
    a_hanging_backend_fails_the_suite_fast(Bug::LeaksConnections, &RUN, "did not answer within");
}

#[test]
fn without_a_bug_every_scenario_passes() {
    let failed = failing(Bug::None);
    assert!(failed.is_empty(), "the unbroken copy failed {failed:?}");
}

macro_rules! caught {
    ($($test:ident: $bug:ident => [$($scenario:literal),* $(,)?],)*) => {
        $(
            #[test]
            fn $test() {
                let failed = failing(Bug::$bug);
                assert!(!failed.is_empty(), "no scenario caught {:?}", Bug::$bug);
                // The scenarios `README.md` records for it.
                let recorded: &[&str] = &[$($scenario),*];
                for scenario in recorded {
                    assert!(
                        failed.iter().any(|f| f.as_str() == *scenario),
                        "{scenario} no longer catches {:?}: caught by {failed:?}",
                        Bug::$bug
                    );
                }
            }
        )*
    };
}

caught! {
    readers_retry_min: ReadersRetryMin => ["rw::retry_after_for_read_and_write"],
    permits_retry_max: PermitsRetryMax => ["semaphore::retry_after_is_the_earliest_live_permit"],
    extend_revives: ExtendRevives => ["exclusive::extend_after_expiry_does_not_reacquire"],
    release_expired_true: ReleaseExpiredTrue => [
        "rw::a_reader_released_after_its_lease_ran_out_answers_false",
        "differential::lock_sequences_answer_as_the_memory_store",
        "differential::permit_sequences_answer_as_the_memory_store",
    ],
    counter_fence: CounterFence => [
        "fences::fences_of_a_fresh_name_follow_the_clock",
        "fences::fences_keep_growing_across_data_loss",
    ],
    one_shot_intent_short: OneShotIntentShort => [
        "fairness::a_writer_that_obeys_retry_after_is_not_starved",
        "intent_window::an_immediate_writers_intent_ends_within_the_window",
    ],
    no_write_intent: NoWriteIntent => [
        "writer_preferred::a_refused_writer_holds_new_readers_off_until_the_readers_leave",
        "writer_preferred::an_abandoned_intent_ends_by_itself",
        "writer_preferred::a_readers_extension_reports_a_waiting_writer",
        "intent_window::an_immediate_writers_intent_ends_within_the_window",
        "intent_window::a_waiting_writer_keeps_its_intent_while_readers_stay",
    ],
    no_writer_waiting_flag: NoWriterWaitingFlag => [
        "writer_preferred::a_readers_extension_reports_a_waiting_writer",
    ],
    release_ignores_secret: ReleaseIgnoresSecret => [
        "exclusive::only_the_holder_releases_or_extends",
        "exclusive::stale_release_leaves_next_holder_alone",
        "differential::lock_sequences_answer_as_the_memory_store",
    ],
    intent_kept_after_write: IntentKeptAfterWrite => [
        "writer_preferred::a_refused_writer_holds_new_readers_off_until_the_readers_leave",
    ],
    reservation_overwrite: ReservationOverwrite => [
        "idempotency::begin_reserves_then_answers_in_flight",
        "idempotency::a_stranger_cannot_touch_a_live_reservation",
        "differential::reservation_sequences_answer_as_the_memory_store",
    ],
    extend_ignores_secret: ExtendIgnoresSecret => [
        "exclusive::only_the_holder_releases_or_extends",
        "differential::lock_sequences_answer_as_the_memory_store",
    ],
    in_use_counts_expired: InUseCountsExpired => [
        "semaphore::an_abandoned_permit_frees_its_slot_after_its_ttl",
        "differential::permit_sequences_answer_as_the_memory_store",
    ],
    no_read_phase: NoReadPhase => [
        "fairness::reads_that_came_after_a_waiting_writer_go_after_it_and_before_the_next",
    ],
    begin_once_no_marker: BeginOnceNoMarker => ["idempotency::at_most_once_marks_the_key"],
    stranger_completes: StrangerCompletes => [
        "idempotency::a_stranger_cannot_touch_a_live_reservation",
        "idempotency::a_reservation_ends_with_its_lease",
        "differential::reservation_sequences_answer_as_the_memory_store",
    ],
    notifies_nothing: NotifiesNothing => [
        "wakeups::a_locks_release_wakes_its_waiter",
        "wakeups::a_reads_release_wakes_the_waiting_writer",
        "wakeups::a_writes_release_wakes_the_waiting_readers",
        "wakeups::a_permits_release_wakes_its_waiter",
        "shared_reads::a_writer_elsewhere_closes_the_shared_reads_promptly",
    ],
    no_release_notice: NoReleaseNotice => [
        "wakeups::a_locks_release_wakes_its_waiter",
        "wakeups::a_reads_release_wakes_the_waiting_writer",
        "wakeups::a_writes_release_wakes_the_waiting_readers",
        "wakeups::a_permits_release_wakes_its_waiter",
    ],
    notice_before_release: NoticeBeforeRelease => [
        "wakeups::a_locks_release_wakes_its_waiter",
        "wakeups::a_reads_release_wakes_the_waiting_writer",
        "wakeups::a_writes_release_wakes_the_waiting_readers",
        "wakeups::a_permits_release_wakes_its_waiter",
    ],
    wrong_mode_notice: WrongModeNotice => [
        "wakeups::a_reads_release_wakes_the_waiting_writer",
        "wakeups::a_writes_release_wakes_the_waiting_readers",
    ],
    no_intent_notice: NoIntentNotice => [
        "shared_reads::a_writer_elsewhere_closes_the_shared_reads_promptly",
    ],
    kinds_share_state: KindsShareState => [
        "input::kinds_on_one_name_are_independent",
        "input::binary_names_lock_independently",
    ],
    hangs: Hangs => ["differential::permit_sequences_answer_as_the_memory_store"],
    acquire_hangs: AcquireHangs => ["differential::lock_sequences_answer_as_the_memory_store"],
    leaks_connections: LeaksConnections => [
        "differential::lock_sequences_answer_as_the_memory_store",
    ],
}
