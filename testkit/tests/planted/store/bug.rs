//! [`Bug`]: the bug planted in a store.

/// The bug planted in a store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Bug {
    /// None: the memory store as it is.
    #[default]
    None,
    /// A writer refused by several readers is told the earliest reader's end, not the last's.
    ReadersRetryMin,
    /// A refused permit is told the latest permit's end, not the earliest's.
    PermitsRetryMax,
    /// `extend` of an exclusive lease that ran out re-takes it.
    ExtendRevives,
    /// `release` of a lease that ran out answers `true`.
    ReleaseExpiredTrue,
    /// Fences are a plain counter, `last + 1`, not `max(last + 1, clock µs)`.
    CounterFence,
    /// The fairness ignored: a refused writer leaves no write intent.
    NoWriteIntent,
    /// A refused write attempt that does not wait leaves its intent for a waiting writer's
    /// window (`LockRef::write_intent`), which ends before its writer, told to retry after a
    /// second, comes back.
    OneShotIntentShort,
    /// A reader's extension never answers `HeldWriterWaiting`.
    NoWriterWaitingFlag,
    /// `release` of an exclusive lease ignores the secret.
    ReleaseIgnoresSecret,
    /// The write intent stays after the writer got in.
    IntentKeptAfterWrite,
    /// A stranger's `idempotency_begin` takes over a live reservation.
    ReservationOverwrite,
    /// `extend` of an exclusive lease ignores the secret.
    ExtendIgnoresSecret,
    /// `in_use` counts permits that ran out.
    InUseCountsExpired,
    /// `idempotency_begin_once` leaves no at-most-once marker.
    BeginOnceNoMarker,
    /// A stranger's `idempotency_complete` stores its record over a live reservation.
    StrangerCompletes,
    /// A phase-fair write's release begins no read phase: the readers that waited for it wait
    /// for the next writer too.
    NoReadPhase,
    /// `notify_to` answers `true` but delivers nothing.
    NotifiesNothing,
    /// A release is not announced (withdrawn intents and write intents are).
    NoReleaseNotice,
    /// A release is announced before it is made: a waiter woken by it is refused, and waits
    /// for its next poll.
    NoticeBeforeRelease,
    /// An `RwLock`'s releases are announced as a `Lock`'s (`Mode::Exclusive`), so its waiters
    /// are not woken.
    WrongModeNotice,
    /// Write intents are not announced, so another process's shared reads keep admitting
    /// readers until their heartbeat hears of the writer.
    NoIntentNotice,
    /// A `Lock` and an `RwLock` of the same namespace and name share state: a writer or
    /// readers of one refuse the other.
    KindsShareState,
    /// `in_use` never answers.
    Hangs,
    /// An exclusive acquisition never answers.
    AcquireHangs,
    /// Every call takes one of a few connections, and an acquisition that took a lease never
    /// gives its connection back: once they are gone, every call waits for one forever.
    LeaksConnections,
}
