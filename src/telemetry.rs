//! What the crate reports through the `metrics` facade (feature `metrics`): the one place that
//! names metrics and labels. Without the feature every function here is empty and inlined away.
//!
//! Labels are `namespace`, `mode` and `outcome` or `reason`: never a lock name or a secret, so
//! the number of series stays bounded by the lock definitions of the program.

use std::time::Duration;

use crate::backend::Mode;

/// What an acquisition came to, as the `outcome` label of `tower_lease_acquire_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AcquireOutcome {
    /// The lease was taken.
    Acquired,
    /// Someone else holds the lock.
    Busy,
    /// The name was refused before the store was asked.
    InvalidName,
    /// The request named no lock, and the layer requires one.
    MissingName,
    /// The request's own limit of permits was 0.
    InvalidLimit,
    /// The store failed or timed out, and the caller was refused.
    StoreError,
    /// The store failed and the layer ran the request unlocked (`fail_open`).
    Unlocked,
    /// The lease was taken after waiting for it.
    Waited,
    /// The wait ran out while someone else held the lock.
    TimedOutWaiting,
}

/// What an extension came to, as the `outcome` label of `tower_lease_extend_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ExtendOutcome {
    Ok,
    Lost,
    Error,
}

/// Why a held lease was lost, as the `reason` label of `tower_lease_lost_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LossReason {
    /// The store answered that the lease is no longer ours.
    StoreSaidGone,
    /// No extension was confirmed before the lease would have run out.
    Expired,
    /// `max_hold` stopped the extensions and the lease ran out.
    MaxHold,
}

impl LossReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LossReason::StoreSaidGone => "store_said_gone",
            LossReason::Expired => "expired",
            LossReason::MaxHold => "max_hold",
        }
    }
}

/// What a request with an idempotency key came to, as the `outcome` label of
/// `tower_lease_idempotency_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IdempotencyOutcome {
    /// The first request ran and its response was stored for its retries.
    Stored,
    /// A retry got the stored response; the inner service was not called.
    Replayed,
    /// A retry came while the first request ran, and was refused (or its wait ran out).
    InFlight,
    /// The key was used before for another request.
    Mismatch,
    /// The key was missing (where required) or malformed.
    InvalidKey,
    /// The request ran but nothing replayable was stored: a `5xx` (the key is freed), a lost
    /// lease, a response over the limit or broken off.
    NotStored,
    /// Whether the request took effect is unknown: its response could not be stored within
    /// `complete_within` (`503`, stored later in the background), or, under `at_most_once`,
    /// a retry found the reservation of a holder that died (`409`).
    OutcomeUnknown,
}

impl IdempotencyOutcome {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn as_str(self) -> &'static str {
        match self {
            IdempotencyOutcome::Stored => "stored",
            IdempotencyOutcome::Replayed => "replayed",
            IdempotencyOutcome::InFlight => "in_flight",
            IdempotencyOutcome::Mismatch => "mismatch",
            IdempotencyOutcome::InvalidKey => "invalid_key",
            IdempotencyOutcome::NotStored => "not_stored",
            IdempotencyOutcome::OutcomeUnknown => "outcome_unknown",
        }
    }
}

/// Counts a request with an idempotency key (or one missing where required). Once per request,
/// next to a store round trip, so a plain registry look-up costs nothing that shows.
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn idempotency(namespace: &'static str, outcome: IdempotencyOutcome) {
    #[cfg(feature = "metrics")]
    handles::with(namespace, Mode::Reservation, |handles| {
        if let Some(idempotency) = &handles.idempotency {
            idempotency[outcome as usize].increment(1);
        }
    });
}

/// Gives each metric its unit and help text, once per process, so exporters print them.
#[cfg(feature = "metrics")]
fn describe() {
    static DESCRIBED: std::sync::Once = std::sync::Once::new();
    DESCRIBED.call_once(|| {
        use metrics::Unit;
        metrics::describe_counter!(
            "tower_lease_acquire_total",
            "Lock acquisitions by outcome: acquired, busy, waited, timed_out_waiting, invalid_name, missing_name, invalid_limit, store_error, unlocked"
        );
        metrics::describe_histogram!(
            "tower_lease_wait_seconds",
            Unit::Seconds,
            "Time spent in bounded waits for a lock"
        );
        metrics::describe_gauge!("tower_lease_waiters", "Bounded waits under way in this process");
        metrics::describe_histogram!(
            "tower_lease_acquire_seconds",
            Unit::Seconds,
            "Time the store took to answer an acquisition"
        );
        metrics::describe_gauge!("tower_lease_held", "Leases this process holds now");
        metrics::describe_histogram!(
            "tower_lease_hold_seconds",
            Unit::Seconds,
            "Time from acquiring a lease to its end (release, loss or drop)"
        );
        metrics::describe_counter!(
            "tower_lease_extend_total",
            "Lease extensions by outcome: ok, lost, error"
        );
        metrics::describe_counter!(
            "tower_lease_idempotency_total",
            "Requests with an idempotency key by outcome: stored, replayed, in_flight, mismatch, invalid_key, not_stored, outcome_unknown"
        );
        metrics::describe_counter!(
            "tower_lease_lost_total",
            "Leases lost while held, by reason: store_said_gone, expired, max_hold"
        );
    });
}

/// The metric handles of one namespace and mode, registered once per thread: looking a metric
/// up by name and labels on every lock cycle would cost more than an in-memory cycle itself.
///
/// A handle registered before the application installs its recorder goes nowhere, so install
/// the recorder before the first lock is taken (as exporters ask anyway).
#[cfg(feature = "metrics")]
mod handles {
    use std::cell::RefCell;

    use metrics::{Counter, Gauge, Histogram};

    use super::{AcquireOutcome, ExtendOutcome, IdempotencyOutcome, LossReason};
    use crate::backend::Mode;

    pub(super) struct Handles {
        pub(super) acquire: [Counter; 9],
        pub(super) wait_seconds: Histogram,
        pub(super) waiters: Gauge,
        pub(super) acquire_seconds: Histogram,
        pub(super) held: Gauge,
        pub(super) hold_seconds: Histogram,
        pub(super) extend: [Counter; 3],
        pub(super) lost: [Counter; 3],
        /// `tower_lease_idempotency_total` by outcome: only an idempotency key's namespace,
        /// whose leases are reservations, has it.
        pub(super) idempotency: Option<[Counter; 7]>,
    }

    impl AcquireOutcome {
        /// In declaration order, so `outcome as usize` indexes it.
        const ALL: [AcquireOutcome; 9] = [
            AcquireOutcome::Acquired,
            AcquireOutcome::Busy,
            AcquireOutcome::InvalidName,
            AcquireOutcome::MissingName,
            AcquireOutcome::InvalidLimit,
            AcquireOutcome::StoreError,
            AcquireOutcome::Unlocked,
            AcquireOutcome::Waited,
            AcquireOutcome::TimedOutWaiting,
        ];

        fn as_str(self) -> &'static str {
            match self {
                AcquireOutcome::Acquired => "acquired",
                AcquireOutcome::Busy => "busy",
                AcquireOutcome::InvalidName => "invalid_name",
                AcquireOutcome::MissingName => "missing_name",
                AcquireOutcome::InvalidLimit => "invalid_limit",
                AcquireOutcome::StoreError => "store_error",
                AcquireOutcome::Unlocked => "unlocked",
                AcquireOutcome::Waited => "waited",
                AcquireOutcome::TimedOutWaiting => "timed_out_waiting",
            }
        }
    }

    impl ExtendOutcome {
        const ALL: [ExtendOutcome; 3] =
            [ExtendOutcome::Ok, ExtendOutcome::Lost, ExtendOutcome::Error];

        fn as_str(self) -> &'static str {
            match self {
                ExtendOutcome::Ok => "ok",
                ExtendOutcome::Lost => "lost",
                ExtendOutcome::Error => "error",
            }
        }
    }

    impl IdempotencyOutcome {
        /// In declaration order, so `outcome as usize` indexes it.
        const ALL: [IdempotencyOutcome; 7] = [
            IdempotencyOutcome::Stored,
            IdempotencyOutcome::Replayed,
            IdempotencyOutcome::InFlight,
            IdempotencyOutcome::Mismatch,
            IdempotencyOutcome::InvalidKey,
            IdempotencyOutcome::NotStored,
            IdempotencyOutcome::OutcomeUnknown,
        ];
    }

    impl LossReason {
        const ALL: [LossReason; 3] = [
            LossReason::StoreSaidGone,
            LossReason::Expired,
            LossReason::MaxHold,
        ];
    }

    impl Handles {
        fn register(namespace: &'static str, mode: Mode) -> Self {
            super::describe();
            let reservation = mode == Mode::Reservation;
            let mode = mode.as_str();
            let labels = [("namespace", namespace), ("mode", mode)];
            Handles {
                acquire: AcquireOutcome::ALL.map(|outcome| {
                    let labels = [labels[0], labels[1], ("outcome", outcome.as_str())];
                    metrics::counter!("tower_lease_acquire_total", &labels)
                }),
                acquire_seconds: metrics::histogram!("tower_lease_acquire_seconds", &labels),
                wait_seconds: metrics::histogram!("tower_lease_wait_seconds", &labels),
                waiters: metrics::gauge!("tower_lease_waiters", &labels),
                held: metrics::gauge!("tower_lease_held", &labels),
                hold_seconds: metrics::histogram!("tower_lease_hold_seconds", &labels),
                extend: ExtendOutcome::ALL.map(|outcome| {
                    let labels = [labels[0], labels[1], ("outcome", outcome.as_str())];
                    metrics::counter!("tower_lease_extend_total", &labels)
                }),
                lost: LossReason::ALL.map(|reason| {
                    let labels = [labels[0], labels[1], ("reason", reason.as_str())];
                    metrics::counter!("tower_lease_lost_total", &labels)
                }),
                idempotency: reservation.then(|| {
                    IdempotencyOutcome::ALL.map(|outcome| {
                        let labels = [labels[0], ("outcome", outcome.as_str())];
                        metrics::counter!("tower_lease_idempotency_total", &labels)
                    })
                }),
            }
        }
    }

    /// (namespace address, namespace length, mode) → handles. A program has a handful of lock
    /// definitions, so a short list beats a map.
    type Cache = Vec<((usize, usize, Mode), Handles)>;

    thread_local! {
        static CACHE: RefCell<Cache> = const { RefCell::new(Vec::new()) };
    }

    /// Runs `f` with the handles of `namespace` and `mode`.
    pub(super) fn with(namespace: &'static str, mode: Mode, f: impl FnOnce(&Handles)) {
        let id = (namespace.as_ptr() as usize, namespace.len(), mode);
        let mut f = Some(f);
        let cached = CACHE.try_with(|cache| {
            let mut cache = cache.borrow_mut();
            let at = match cache.iter().position(|(key, _)| *key == id) {
                Some(at) => at,
                None => {
                    cache.push((id, Handles::register(namespace, mode)));
                    cache.len() - 1
                }
            };
            (f.take().expect("called once"))(&cache[at].1);
        });
        // A thread that is shutting down has no cache left: register on the spot.
        if cached.is_err()
            && let Some(f) = f
        {
            f(&Handles::register(namespace, mode));
        }
    }
}

/// A moment, read from a clock only when the `metrics` feature needs it: a calibrated TSC read
/// (`quanta`), cheaper than the system clock on the hot path. Without the feature it is empty.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Moment(#[cfg(feature = "metrics")] quanta::Instant);

impl Moment {
    #[inline]
    pub(crate) fn now() -> Self {
        Moment(
            #[cfg(feature = "metrics")]
            quanta::Instant::now(),
        )
    }

    #[cfg(feature = "metrics")]
    fn since(self, earlier: Moment) -> Duration {
        self.0.saturating_duration_since(earlier.0)
    }
}

/// Counts an acquisition refused before the store was asked.
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn refused(namespace: &'static str, mode: Mode, outcome: AcquireOutcome) {
    #[cfg(feature = "metrics")]
    handles::with(namespace, mode, |handles| {
        handles.acquire[outcome as usize].increment(1);
    });
}

/// Counts an acquisition whose store call left the count to its caller, which knew its
/// outcome only later (a read that would have waited after a refusal, and did not).
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn acquisition(namespace: &'static str, mode: Mode, outcome: AcquireOutcome) {
    #[cfg(feature = "metrics")]
    handles::with(namespace, mode, |handles| {
        handles.acquire[outcome as usize].increment(1);
    });
}

/// Counts a read request that joined a shared read lease, or waited for the acquisition of one
/// (`outcome` is what it got), without a store round trip of its own.
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn shared(namespace: &'static str, mode: Mode, outcome: AcquireOutcome) {
    #[cfg(feature = "metrics")]
    handles::with(namespace, mode, |handles| {
        handles.acquire[outcome as usize].increment(1);
    });
}

/// Counts the end of a bounded wait: the lease taken, the wait run out, or the store failed;
/// `waited` is how long it waited, `None` when the first attempt answered (no wait to record).
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn waited(
    namespace: &'static str,
    mode: Mode,
    outcome: AcquireOutcome,
    waited: Option<Duration>,
) {
    #[cfg(feature = "metrics")]
    handles::with(namespace, mode, |handles| {
        handles.acquire[outcome as usize].increment(1);
        if let Some(waited) = waited {
            handles.wait_seconds.record(waited);
        }
    });
}

/// A waiter came (`1.0`) or went (`-1.0`).
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn waiters(namespace: &'static str, mode: Mode, change: f64) {
    #[cfg(feature = "metrics")]
    handles::with(namespace, mode, |handles| handles.waiters.increment(change));
}

/// Counts an acquisition the store answered (sent at `sent`, answered at `answered`) unless the
/// caller counts it (`outcome` is `None`), and the lease this process now holds when it was
/// `acquired`: one look-up for the three.
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn store_answered(
    namespace: &'static str,
    mode: Mode,
    outcome: Option<AcquireOutcome>,
    acquired: bool,
    sent: Moment,
    answered: Moment,
) {
    #[cfg(feature = "metrics")]
    handles::with(namespace, mode, |handles| {
        if let Some(outcome) = outcome {
            handles.acquire[outcome as usize].increment(1);
        }
        handles.acquire_seconds.record(answered.since(sent));
        if acquired {
            handles.held.increment(1.0);
        }
    });
}

/// A lease this process took at `taken` is over (released, lost or dropped).
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables, dead_code))]
pub(crate) fn lease_ended(namespace: &'static str, mode: Mode, taken: Moment) {
    #[cfg(feature = "metrics")]
    handles::with(namespace, mode, |handles| {
        handles.held.decrement(1.0);
        handles.hold_seconds.record(Moment::now().since(taken));
    });
}

/// Counts an extension of a lease in `namespace` and `mode`.
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn extend(namespace: &'static str, mode: Mode, outcome: ExtendOutcome) {
    #[cfg(feature = "metrics")]
    handles::with(namespace, mode, |handles| {
        handles.extend[outcome as usize].increment(1);
    });
}

/// Counts a lease the store's heartbeat declared lost.
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn lost(namespace: &'static str, mode: Mode, reason: LossReason) {
    #[cfg(feature = "metrics")]
    handles::with(namespace, mode, |handles| {
        handles.lost[reason as usize].increment(1);
    });
}
