//! What the crate reports through the `metrics` facade (feature `metrics`): the one place that
//! names metrics and labels. Without the feature every function here is empty and inlined away.
//!
//! Labels are `namespace`, `mode` and `outcome` or `reason`: never a lock name or a secret, so
//! the number of series stays bounded by the lock definitions of the program.

use std::time::Duration;

use crate::store::Mode;

/// What an acquisition came to, as the `outcome` label of `tower_lease_acquire_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AcquireOutcome {
    /// The lease was taken.
    Acquired,
    /// Someone else holds the lock.
    Held,
    /// The name was refused before the store was asked.
    InvalidName,
    /// The store failed or missed its deadline, and the caller was refused.
    StoreError,
    /// The store failed and the layer ran the request unlocked (`fail_open`).
    Unlocked,
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
    DeadlinePassed,
    /// `max_hold` stopped the extensions and the lease ran out.
    MaxHold,
}

impl LossReason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LossReason::StoreSaidGone => "store_said_gone",
            LossReason::DeadlinePassed => "deadline_passed",
            LossReason::MaxHold => "max_hold",
        }
    }
}

#[cfg(feature = "metrics")]
fn mode(mode: Mode) -> &'static str {
    mode.as_str()
}

/// Gives each metric its unit and help text, once per process, so exporters print them.
#[cfg(feature = "metrics")]
fn describe() {
    static DESCRIBED: std::sync::Once = std::sync::Once::new();
    DESCRIBED.call_once(|| {
        use metrics::Unit;
        metrics::describe_counter!(
            "tower_lease_acquire_total",
            "Lock acquisitions by outcome: acquired, held, invalid_name, store_error, unlocked"
        );
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
            "tower_lease_lost_total",
            "Leases lost while held, by reason: store_said_gone, deadline_passed, max_hold"
        );
    });
}

/// Counts an acquisition in `namespace` and `mode`, and times the store call when there was
/// one.
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn acquire(
    namespace: &'static str,
    mode: Mode,
    outcome: AcquireOutcome,
    store_call: Option<Duration>,
) {
    #[cfg(feature = "metrics")]
    {
        describe();
        let outcome = match outcome {
            AcquireOutcome::Acquired => "acquired",
            AcquireOutcome::Held => "held",
            AcquireOutcome::InvalidName => "invalid_name",
            AcquireOutcome::StoreError => "store_error",
            AcquireOutcome::Unlocked => "unlocked",
        };
        let mode = self::mode(mode);
        metrics::counter!(
            "tower_lease_acquire_total",
            "namespace" => namespace, "mode" => mode, "outcome" => outcome
        )
        .increment(1);
        if let Some(took) = store_call {
            metrics::histogram!("tower_lease_acquire_seconds", "namespace" => namespace, "mode" => mode)
                .record(took);
        }
    }
}

/// A lease this process now holds.
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn lease_taken(namespace: &'static str, mode: Mode) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("tower_lease_held", "namespace" => namespace, "mode" => self::mode(mode))
        .increment(1.0);
}

/// A lease this process held for `held_for` is over (released, lost or dropped).
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables, dead_code))]
pub(crate) fn lease_ended(namespace: &'static str, mode: Mode, held_for: Duration) {
    #[cfg(feature = "metrics")]
    {
        let mode = self::mode(mode);
        metrics::gauge!("tower_lease_held", "namespace" => namespace, "mode" => mode)
            .decrement(1.0);
        metrics::histogram!("tower_lease_hold_seconds", "namespace" => namespace, "mode" => mode)
            .record(held_for);
    }
}

/// Counts an extension of a lease in `namespace` and `mode`.
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn extend(namespace: &'static str, mode: Mode, outcome: ExtendOutcome) {
    #[cfg(feature = "metrics")]
    {
        let outcome = match outcome {
            ExtendOutcome::Ok => "ok",
            ExtendOutcome::Lost => "lost",
            ExtendOutcome::Error => "error",
        };
        metrics::counter!(
            "tower_lease_extend_total",
            "namespace" => namespace, "mode" => self::mode(mode), "outcome" => outcome
        )
        .increment(1);
    }
}

/// Counts a lease the layer's heartbeat declared lost.
#[inline]
#[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
pub(crate) fn lost(namespace: &'static str, mode: Mode, reason: LossReason) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "tower_lease_lost_total",
        "namespace" => namespace, "mode" => self::mode(mode), "reason" => reason.as_str()
    )
    .increment(1);
}
