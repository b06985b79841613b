//! The conformance suite of [`tower-lease`](tower_lease): the scenarios every lease store must
//! pass, for a [`Backend`](tower_lease::backend::Backend) of your own as for the built-in ones.
//!
//! Each scenario is an `async fn(Env)` in the module of what it tests ([`exclusive`], [`rw`],
//! [`semaphore`], [`fairness`], [`writer_preferred`], [`intent_window`], [`input`], [`idempotency`],
//! [`fences`], [`wakeups`] and [`shared_reads`] (notifications across two stores), and
//! [`differential`], which compares random sequences of calls with the memory store's
//! answers); its doc says what it checks. Each fails if it runs past [`DEADLINE`], or at once
//! when one of its direct backend calls ([`Env::backend`]) has not answered within
//! [`CALL_DEADLINE`]: a hanging backend fails the whole run within seconds ([`SuiteRun`]). [`conformance!`] declares one
//! `#[tokio::test]` per scenario, each on a fresh [`Env`]; [`scenarios`] lists them for running
//! them some other way. The scenarios talk to the store
//! through [`Store`] and [`Backend`](tower_lease::backend::Backend) alone, in real time (their TTLs
//! are at most seconds) or under tokio's paused clock for a store that keeps time with
//! [`tokio::time::Instant`].
//!
//! A backend of your own, here one that hands every call to the memory store:
//!
//! ```
//! use tower_lease::Store;
//! use tower_lease::backend::{Acquisition, Backend, BoxFuture, Extended, LeaseRef, LockRef};
//! use tower_lease::store::MemoryStore;
//! use tower_lease_testkit::Env;
//!
//! #[derive(Default)]
//! struct Delegating(MemoryStore);
//!
//! impl Backend for Delegating {
//!     fn acquire<'a>(
//!         &'a self,
//!         lease: LeaseRef<'a>,
//!     ) -> BoxFuture<'a, tower_lease::Result<Acquisition>> {
//!         self.0.acquire(lease)
//!     }
//!     fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, tower_lease::Result<Extended>> {
//!         self.0.extend(lease)
//!     }
//!     fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, tower_lease::Result<bool>> {
//!         self.0.release(lease)
//!     }
//!     fn withdraw_intent<'a>(
//!         &'a self,
//!         lease: LeaseRef<'a>,
//!     ) -> BoxFuture<'a, tower_lease::Result<bool>> {
//!         self.0.withdraw_intent(lease)
//!     }
//!     fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, tower_lease::Result<u32>> {
//!         self.0.in_use(lock)
//!     }
//! }
//!
//! fn env() -> Env {
//!     Env::new(Store::from_backend(Delegating::default()))
//! }
//!
//! // In a test target (`tests/conformance.rs`): one test per scenario. `paused:` runs them
//! // under tokio's paused clock, which the memory store follows.
//! tower_lease_testkit::conformance!(paused: env());
//! # fn main() {}
//! ```
//!
//! The idempotency scenarios also call the four `idempotency_*` methods, which this example
//! leaves to their defaults (an error: no idempotency keys), so they fail on it; and
//! [`Env::with_data_loss`] lets the fence scenarios wipe the backend. `tests/delegating.rs` in
//! this crate runs the example with both; `tests/planted` runs every scenario on copies of the
//! memory store with bugs planted, each caught (`README.md` says by which scenarios).
//! The crate's own tests run the suite on `Store::memory()`, on a `redis-server` and on a Redis Cluster.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![forbid(unsafe_code)]

mod calls;
mod env;

pub mod differential;
pub mod exclusive;
pub mod fairness;
pub mod fences;
pub mod idempotency;
pub mod input;
pub mod intent_window;
pub mod rw;
pub mod semaphore;
pub mod shared_reads;
pub mod wakeups;
pub mod writer_preferred;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tower_lease::Store;
use tower_lease::backend::{Extended, LeaseRef, LockRef, Mode, Secret};

pub use self::calls::{CALL_DEADLINE, Calls, SuiteRun};
pub use self::env::{DataLoss, Env, IntentProbe};

/// Stores and clocks count whole milliseconds; comparisons allow that much rounding.
pub const ROUNDING: Duration = Duration::from_millis(3);

/// The longest a scenario may run: [`conformance!`] and [`Scenario::run`] fail one that has
/// not finished by then, so a backend whose call never answers fails the scenario that made
/// it with a clear message instead of hanging the suite. The slowest scenarios take about 15 s
/// on a network store; under tokio's paused clock (`conformance!(paused: …)`) the deadline is
/// in the paused clock's time, which jumps ahead while everything waits, so a hang there fails
/// at once (in real time) and the scenarios, whose leases last seconds, are far within it.
pub const DEADLINE: Duration = Duration::from_secs(120);

/// Runs the scenario `name` (its `module::function`), failing it (a panic) if it has not
/// finished within [`DEADLINE`].
pub async fn within_deadline(name: &str, scenario: impl Future<Output = ()>) {
    if tokio::time::timeout(DEADLINE, scenario).await.is_err() {
        panic!(
            "{name} did not finish within {DEADLINE:?}: the backend hangs (a call that never \
             answers) or is far too slow"
        );
    }
}

/// [`within_deadline`], as part of `run`: failed at once if an earlier scenario of `run` found
/// a call that never answers (see [`SuiteRun`]).
pub async fn within_run(run: &'static SuiteRun, name: &str, scenario: impl Future<Output = ()>) {
    calls::as_part_of(run, within_deadline(name, scenario)).await
}

/// A scenario's future, as [`Scenario::run`] answers it.
pub type ScenarioFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One scenario of the suite, for running it programmatically (as [`conformance!`] does, one
/// test each): it passes when its future completes, and fails by panicking.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    /// The module it is in (`"exclusive"`, `"idempotency"`, ...).
    pub module: &'static str,
    /// Its name, the name of its function.
    pub name: &'static str,
    /// Runs it on an [`Env`], within [`DEADLINE`].
    pub run: fn(Env) -> ScenarioFuture,
}

impl Scenario {
    /// Runs it on `env` as part of `run`: within [`DEADLINE`], and failed at once if an earlier
    /// scenario of `run` found a backend call that never answers.
    pub fn run_in(&self, run: &'static SuiteRun, env: Env) -> ScenarioFuture {
        let scenario = (self.run)(env);
        Box::pin(calls::as_part_of(run, scenario))
    }
}

/// Every scenario of the suite, in the order [`conformance!`] declares them.
pub fn scenarios() -> Vec<Scenario> {
    crate::__scenarios!(@table)
}

/// Asserts that a stranger, without the holder's secret, can neither release nor extend the
/// `mode` lease of `lock`.
pub async fn assert_strangers_refused(store: &Store, lock: LockRef<'_>, mode: Mode) {
    let stranger = Secret::random();
    let backend = Calls::new(store.backend());
    let lease = LeaseRef::new(lock, mode, &stranger);
    assert!(
        !backend.release(lease).await.unwrap(),
        "a stranger released a {mode:?} lease"
    );
    assert!(
        backend.extend(lease).await.unwrap() == Extended::Gone,
        "a stranger extended a {mode:?} lease"
    );
}

/// Calls `attempt` every `every` until it answers `Some`, for at most `limit` (at least once);
/// answers the value and the instant the successful attempt started.
pub async fn poll<T, F, Fut>(
    every: Duration,
    limit: Duration,
    mut attempt: F,
) -> Option<(T, Instant)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        let sent = Instant::now();
        if let Some(value) = attempt().await {
            return Some((value, sent));
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// Counts the holders inside a critical section, and the most that were inside at once.
#[derive(Clone, Debug, Default)]
pub struct Holders {
    inside: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Holders {
    /// Counts one more holder inside until the guard drops.
    #[must_use = "the holder is inside until the guard drops"]
    pub fn enter(&self) -> Inside {
        let (inside, now) = Inside::enter(&self.inside);
        self.most.fetch_max(now, Ordering::SeqCst);
        inside
    }

    /// The most holders that were inside at the same time.
    pub fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

/// One inside a count (a [`Holders`] holder, a handler); leaves when dropped, so a handler
/// dropped midway (its client gone) leaves too.
#[derive(Debug)]
pub struct Inside(Arc<AtomicUsize>);

impl Inside {
    /// Counts one more in `count` until the guard drops; answers the guard and how many are
    /// inside now.
    #[must_use = "it is inside until the guard drops"]
    pub fn enter(count: &Arc<AtomicUsize>) -> (Inside, usize) {
        let now = count.fetch_add(1, Ordering::SeqCst) + 1;
        (Inside(count.clone()), now)
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Declares one `#[tokio::test]` per scenario of the suite, each on the [`Env`] that `$env`
/// makes (evaluated afresh per test, inside modules one level below the call: name what it
/// calls by a path that resolves there, such as `super::env()` or a crate path; the generated
/// modules import the caller's items with `use super::*`).
///
/// - `conformance!(env())`: on tokio's multi-threaded runtime, in real time, for a store
///   across the network;
/// - `conformance!(paused: env())`: on the current-thread runtime with the clock paused, for a
///   store that keeps time with [`tokio::time::Instant`] (the memory store).
///
/// `$env` is evaluated inside each async test, so it may `.await` (`make_env().await`).
///
/// The calling crate needs `tokio` with the `macros` and `rt-multi-thread` features (and
/// `test-util` for `paused:`) among its dev-dependencies.
#[macro_export]
macro_rules! conformance {
    (paused: $env:expr) => {
        $crate::__conformance!(@all [tokio::test(start_paused = true)] $env);
    };
    ($env:expr) => {
        $crate::__conformance!(@all [tokio::test(flavor = "multi_thread", worker_threads = 2)] $env);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __scenarios {
    ($($prefix:tt)*) => {
        $crate::__conformance! { $($prefix)* ;
            differential: [
                lock_sequences_answer_as_the_memory_store,
                permit_sequences_answer_as_the_memory_store,
                reservation_sequences_answer_as_the_memory_store,
            ],
            exclusive: [
                mutual_exclusion,
                only_the_holder_releases_or_extends,
                stale_release_leaves_next_holder_alone,
                extend_after_expiry_does_not_reacquire,
                extend_keeps_the_lease,
                abandoned_lease_frees_itself_after_ttl,
                retry_after_is_the_holders_remaining_lease,
                fences_increase_per_name,
            ],
            fairness: [
                a_waiting_writer_is_not_starved_by_overlapping_reads,
                a_retrying_writer_is_not_starved_by_overlapping_reads,
                a_writer_that_obeys_retry_after_is_not_starved,
                reads_that_came_after_a_waiting_writer_go_after_it_and_before_the_next,
                a_read_phase_nobody_comes_to_ends_by_itself,
                waiters_side_by_side_in_one_process_all_hear_their_release,
                waiting_writers_go_in_the_order_their_waits_began,
                a_waiting_write_sent_again_after_it_got_in_answers_acquired,
                writers_queued_in_one_process_hand_on_promptly,
            ],
            fences: [
                fences_of_a_fresh_name_follow_the_clock,
                fences_keep_growing_across_data_loss,
            ],
            idempotency: [
                begin_reserves_then_answers_in_flight,
                complete_then_replay_or_mismatch,
                a_stranger_cannot_touch_a_live_reservation,
                a_released_or_freed_reservation_frees_the_key,
                a_reservation_ends_with_its_lease,
                at_most_once_marks_the_key,
                fenced_reservations_take_growing_fences,
            ],
            input: [
                names_out_of_range_are_errors,
                binary_names_lock_independently,
                kinds_on_one_name_are_independent,
            ],
            intent_window: [
                a_waiting_writer_that_gives_up_leaves_no_intent,
                a_dropped_waiting_writer_leaves_no_intent,
                an_immediate_writers_intent_ends_within_the_window,
                a_waiting_writer_keeps_its_intent_while_readers_stay,
            ],
            rw: [
                readers_share,
                writer_excludes_everyone,
                readers_block_writer_until_released,
                crashed_reader_stops_blocking_after_ttl,
                reader_and_writer_tokens_are_holder_only,
                retry_after_for_read_and_write,
                write_fences_increase_and_readers_see_the_generation,
                a_reader_released_after_its_lease_ran_out_answers_false,
            ],
            semaphore: [
                permits_up_to_the_limit,
                retry_after_is_the_earliest_live_permit,
                an_abandoned_permit_frees_its_slot_after_its_ttl,
                extend_after_expiry_fails_and_takes_no_slot,
                extend_keeps_a_permit_past_its_first_ttl,
                permits_are_holder_only,
                each_call_checks_its_own_limit,
                a_waiter_gets_the_slot_a_release_frees,
                bad_input_is_a_clear_error,
                a_permit_released_after_its_lease_ran_out_answers_false,
            ],
            shared_reads: [
                a_writer_elsewhere_closes_the_shared_reads_promptly,
            ],
            wakeups: [
                a_locks_release_wakes_its_waiter,
                a_reads_release_wakes_the_waiting_writer,
                a_writes_release_wakes_the_waiting_readers,
                a_permits_release_wakes_its_waiter,
            ],
            writer_preferred: [
                a_refused_writer_holds_new_readers_off_until_the_readers_leave,
                an_abandoned_intent_ends_by_itself,
                without_the_preference_readers_keep_coming_in,
                a_readers_extension_reports_a_waiting_writer,
            ],
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance {
    (@all $attr:tt $env:expr) => {
        /// What this run of the suite has seen hang.
        static __TOWER_LEASE_TESTKIT_RUN: $crate::SuiteRun = $crate::SuiteRun::new();
        $crate::__scenarios!(@tests $attr $env);
    };
    (@tests $attr:tt $env:expr ; $($module:ident: [$($name:ident),* $(,)?]),* $(,)?) => {
        $( $crate::__conformance!(@module $attr $env; $module: [$($name),*]); )*
    };
    (@table ; $($module:ident: [$($name:ident),* $(,)?]),* $(,)?) => {
        vec![$($(
            $crate::Scenario {
                module: stringify!($module),
                name: stringify!($name),
                run: |env| Box::pin($crate::within_deadline(
                    concat!(stringify!($module), "::", stringify!($name)),
                    $crate::$module::$name(env),
                )),
            },
        )*)*]
    };
    (@module [$attr:meta] $env:expr; $module:ident: [$($name:ident),* $(,)?]) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;

            $(
                #[$attr]
                async fn $name() {
                    $crate::within_run(
                        &super::__TOWER_LEASE_TESTKIT_RUN,
                        concat!(stringify!($module), "::", stringify!($name)),
                        async { $crate::$module::$name($env).await },
                    )
                    .await
                }
            )*
        }
    };
}
