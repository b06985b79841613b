//! What a [`Backend`](super::Backend) needs for [`IdempotencyLayer`](crate::IdempotencyLayer):
//! the answer of a key's first look ([`Begin`]), what a completed request leaves
//! ([`Completion`]), and the error of a backend that keeps no idempotency records.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;

use crate::Error;

/// The length of a request fingerprint, in bytes.
pub const FINGERPRINT_LEN: usize = 16;

/// What [`Backend::idempotency_begin`](super::Backend::idempotency_begin) found under a key,
/// decided in one atomic step.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Begin {
    /// The key was free: the reservation is the caller's now, a [`Mode::Reservation`]
    /// lease held with its secret for one TTL, which the caller extends and releases like any
    /// other lease.
    ///
    /// A store where handlers claim keys in their own transactions (`tower-lease-postgres`)
    /// answers it too for a key claimed without a stored response: the claim's effect
    /// committed, the handler runs again under this reservation, learns from its claim that
    /// it ran, and answers from its own record. The layer runs the request either way, so a
    /// backend without claims answers as before.
    ///
    /// [`Mode::Reservation`]: super::Mode::Reservation
    Reserved {
        /// For a fenced reservation: a fence larger than every fence issued before for this
        /// key; `None` when unfenced.
        fence: Option<u64>,
    },
    /// Another request holds the reservation.
    InFlight {
        /// How long its lease has left.
        retry_after: Duration,
    },
    /// A request with the same fingerprint completed: its stored response, as the caller
    /// handed it to [`idempotency_complete`](super::Backend::idempotency_complete).
    Completed {
        /// The stored response, opaque to the backend.
        response: Bytes,
        /// How long the record has left.
        expires_in: Duration,
    },
    /// A request with another fingerprint completed under this key.
    Mismatch,
    /// An [at-most-once](crate::Idempotency::at_most_once) key whose holder died: its
    /// reservation ran out without a completion, so whether the request took effect is
    /// unknown, and it is not run again while the marker lives.
    OutcomeUnknown {
        /// How long the marker has left.
        expires_in: Duration,
    },
}

/// What a request that completed under its reservation leaves for its retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Completion<'a> {
    /// The fingerprint the retries must match.
    pub fingerprint: &'a [u8; FINGERPRINT_LEN],
    /// The stored response, opaque to the backend.
    pub response: &'a [u8],
    /// How long the record is kept, in whole milliseconds.
    pub retention: Duration,
}

impl<'a> Completion<'a> {
    /// A completion for a direct [`Backend`](super::Backend) call.
    pub fn new(
        fingerprint: &'a [u8; FINGERPRINT_LEN],
        response: &'a [u8],
        retention: Duration,
    ) -> Self {
        Self {
            fingerprint,
            response,
            retention,
        }
    }
}

/// The error of a backend that does not implement the idempotency calls.
struct Unsupported;

impl fmt::Debug for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Unsupported")
    }
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("this lock store backend does not support idempotency keys")
    }
}

impl std::error::Error for Unsupported {}

/// The error the default idempotency calls of a [`Backend`](super::Backend) answer.
pub(crate) fn unsupported() -> Error {
    Error::Backend(Box::new(Unsupported))
}
