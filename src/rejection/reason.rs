//! The one table of the layers' refusals: for each [`Reason`], the status it is answered
//! with, its problem `type` and its title. Every layer and [`IdempotencyLayer`] answer from
//! it, and the table in [`Reason`]'s docs (`reasons.md`) is checked against it by the tests
//! below; the only status a user chooses is the one for a taken lock (`busy_status`,
//! `full_status`).
//!
//! [`IdempotencyLayer`]: crate::IdempotencyLayer

use std::time::Duration;

use http::StatusCode;

/// Why the layer refused a request.
///
/// Each reason's status, problem `type` and title, as the layer answers it (an
/// [`on_rejection`](crate::LockLayer::on_rejection) hook may answer otherwise):
///
#[doc = include_str!("reasons.md")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// Someone else holds the lock.
    Busy {
        /// How long the request may expect to wait: the 90th percentile of the holds this
        /// layer saw lately, never more than the holder's remaining lease (which is all there
        /// is before any hold was seen). A holder keeps extending its lease while it works, so
        /// the lease alone would say about a TTL for a job of milliseconds. A hint, not a
        /// promise that the lock is free then.
        retry_after: Duration,
    },
    /// Every permit of the [`SemaphoreLayer`](crate::SemaphoreLayer)'s semaphore is taken.
    Full {
        /// How long the request may expect to wait, as for [`Busy`](Self::Busy): the holds
        /// seen lately, never more than the earliest live permit's remaining lease.
        retry_after: Duration,
        /// The limit this request was refused at.
        limit: u32,
    },
    /// The [`SemaphoreLayer`](crate::SemaphoreLayer)'s per-request
    /// [`permits`](crate::SemaphoreLayer::permits) gave this request a limit of 0.
    InvalidLimit,
    /// The request names a lock the layer refuses to take: empty, too long, or (without
    /// [`binary_names`](crate::LockLayer::binary_names)) not text.
    InvalidName,
    /// The request names no lock, and the layer [requires](crate::LockLayer::require_name) one.
    MissingName,
    /// The store failed or did not answer in time, and the layer fails closed.
    StoreUnavailable,
    /// The store took the lease, but fewer replicas acknowledged it than the store
    /// [waits for](crate::RedisStore::wait_for_replicas); the lease was given up.
    NotReplicated,
    /// The lease was lost while the inner service ran; its outcome is unknown.
    LeaseLost,
    /// The inner service panicked while it ran under an
    /// [`IdempotencyLayer`](crate::IdempotencyLayer)'s reservation; nothing was stored and
    /// the key was freed (an [at-most-once](crate::Idempotency::at_most_once) key keeps its
    /// marker).
    HandlerFailed,
    /// The request body is longer than the layer
    /// [buffers](crate::LockLayer::buffer_body).
    BodyTooLarge {
        /// The most bytes the layer reads.
        limit: usize,
    },
    /// The request body did not arrive within the layer's
    /// [`body_timeout`](crate::LockLayer::body_timeout).
    BodyTimeout {
        /// How long the layer waited.
        after: Duration,
    },
    /// The request body broke off or was malformed while the layer
    /// [buffered](crate::LockLayer::buffer_body) it.
    BodyUnreadable,
    /// The `Idempotency-Key` header of a request to an
    /// [`IdempotencyLayer`](crate::IdempotencyLayer) is not a valid key.
    IdempotencyKeyInvalid,
    /// The request carries no `Idempotency-Key`, and the
    /// [`IdempotencyLayer`](crate::IdempotencyLayer) [requires](crate::IdempotencyLayer::require_key) one.
    IdempotencyKeyMissing,
    /// A request with the same idempotency key is running.
    IdempotencyInFlight {
        /// How long its reservation has left (a hint: its heartbeat keeps extending it).
        retry_after: Duration,
    },
    /// The idempotency key was used before for a request with another method, path or body.
    IdempotencyKeyReused,
    /// The first request with this idempotency key completed, but its response was not
    /// stored (over [`max_response`](crate::IdempotencyLayer::max_response), or broken off),
    /// so it is neither replayed nor run again.
    IdempotencyNotStored {
        /// The status the first request completed with.
        status: StatusCode,
    },
    /// Whether the request with this idempotency key took effect is not known (yet).
    IdempotencyOutcomeUnknown {
        /// `Some` (`503`): the request ran, and its response is still being stored; a retry
        /// then replays it. `None` (`409`): its holder died before it completed, under
        /// [`at_most_once`](crate::Idempotency::at_most_once), so it is never run again.
        retry_after: Option<Duration>,
    },
}

/// What a refusal is answered with, by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ReasonRow {
    /// The status, unless the layer was given its own for a taken lock.
    pub(crate) status: StatusCode,
    /// The problem `type` URI: a stable identifier clients can match on. It is not meant to be
    /// dereferenced, so it names no host.
    pub(crate) problem_type: &'static str,
    pub(crate) title: &'static str,
}

impl ReasonRow {
    /// The table.
    pub(crate) const fn of(reason: Reason) -> ReasonRow {
        match reason {
            Reason::Busy { .. } => ReasonRow {
                status: StatusCode::CONFLICT,
                problem_type: "urn:tower-lease:lock-busy",
                title: "The resource is locked by another request",
            },
            Reason::Full { .. } => ReasonRow {
                status: StatusCode::TOO_MANY_REQUESTS,
                problem_type: "urn:tower-lease:concurrency-limit",
                title: "Too many requests for this resource are running",
            },
            Reason::InvalidLimit => ReasonRow {
                status: StatusCode::BAD_REQUEST,
                problem_type: "urn:tower-lease:invalid-concurrency-limit",
                title: "The request is allowed no concurrent requests",
            },
            Reason::InvalidName => ReasonRow {
                status: StatusCode::BAD_REQUEST,
                problem_type: "urn:tower-lease:invalid-lock-name",
                title: "The request names a resource that cannot be locked",
            },
            Reason::MissingName => ReasonRow {
                status: StatusCode::BAD_REQUEST,
                problem_type: "urn:tower-lease:missing-lock-name",
                title: "The request does not name the resource to lock",
            },
            Reason::StoreUnavailable => ReasonRow {
                status: StatusCode::SERVICE_UNAVAILABLE,
                problem_type: "urn:tower-lease:lock-store-unavailable",
                title: "The lock service is unavailable",
            },
            Reason::NotReplicated => ReasonRow {
                status: StatusCode::SERVICE_UNAVAILABLE,
                problem_type: "urn:tower-lease:not-replicated",
                title: "The lock could not be replicated",
            },
            Reason::LeaseLost => ReasonRow {
                status: StatusCode::SERVICE_UNAVAILABLE,
                problem_type: "urn:tower-lease:lease-lost",
                title: "The lock was lost while the request was being served",
            },
            Reason::HandlerFailed => ReasonRow {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                problem_type: "urn:tower-lease:handler-failed",
                title: "The request's handler failed",
            },
            Reason::BodyTooLarge { .. } => ReasonRow {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                problem_type: "urn:tower-lease:body-too-large",
                title: "The request body is too large",
            },
            Reason::BodyTimeout { .. } => ReasonRow {
                status: StatusCode::REQUEST_TIMEOUT,
                problem_type: "urn:tower-lease:body-timeout",
                title: "The request body did not arrive in time",
            },
            Reason::BodyUnreadable => ReasonRow {
                status: StatusCode::BAD_REQUEST,
                problem_type: "urn:tower-lease:body-unreadable",
                title: "The request body could not be read",
            },
            Reason::IdempotencyKeyInvalid => ReasonRow {
                status: StatusCode::BAD_REQUEST,
                problem_type: "urn:tower-lease:idempotency-key-invalid",
                title: "The Idempotency-Key header is invalid",
            },
            Reason::IdempotencyKeyMissing => ReasonRow {
                status: StatusCode::BAD_REQUEST,
                problem_type: "urn:tower-lease:idempotency-key-missing",
                title: "The request needs an Idempotency-Key header",
            },
            Reason::IdempotencyInFlight { .. } => ReasonRow {
                status: StatusCode::CONFLICT,
                problem_type: "urn:tower-lease:idempotency-in-flight",
                title: "A request with this idempotency key is running",
            },
            Reason::IdempotencyKeyReused => ReasonRow {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                problem_type: "urn:tower-lease:idempotency-key-reused",
                title: "The idempotency key was used for another request",
            },
            Reason::IdempotencyNotStored { .. } => ReasonRow {
                status: StatusCode::GONE,
                problem_type: "urn:tower-lease:idempotency-not-stored",
                title: "The request with this idempotency key completed, but its response was not kept",
            },
            Reason::IdempotencyOutcomeUnknown { retry_after } => ReasonRow {
                status: match retry_after {
                    Some(_) => StatusCode::SERVICE_UNAVAILABLE,
                    None => StatusCode::CONFLICT,
                },
                problem_type: "urn:tower-lease:idempotency-outcome-unknown",
                title: "The outcome of the request with this idempotency key is unknown",
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One of each reason; the match keeps it whole when a reason is added.
    fn every_reason() -> Vec<(&'static str, Reason)> {
        let all = [
            Reason::Busy {
                retry_after: Duration::ZERO,
            },
            Reason::Full {
                retry_after: Duration::ZERO,
                limit: 1,
            },
            Reason::InvalidLimit,
            Reason::InvalidName,
            Reason::MissingName,
            Reason::StoreUnavailable,
            Reason::NotReplicated,
            Reason::LeaseLost,
            Reason::HandlerFailed,
            Reason::BodyTooLarge { limit: 1 },
            Reason::BodyTimeout {
                after: Duration::ZERO,
            },
            Reason::BodyUnreadable,
            Reason::IdempotencyKeyInvalid,
            Reason::IdempotencyKeyMissing,
            Reason::IdempotencyInFlight {
                retry_after: Duration::ZERO,
            },
            Reason::IdempotencyKeyReused,
            Reason::IdempotencyNotStored {
                status: StatusCode::OK,
            },
            Reason::IdempotencyOutcomeUnknown { retry_after: None },
        ];
        all.into_iter()
            .map(|reason| {
                let name = match reason {
                    Reason::Busy { .. } => "Busy",
                    Reason::Full { .. } => "Full",
                    Reason::InvalidLimit => "InvalidLimit",
                    Reason::InvalidName => "InvalidName",
                    Reason::MissingName => "MissingName",
                    Reason::StoreUnavailable => "StoreUnavailable",
                    Reason::NotReplicated => "NotReplicated",
                    Reason::LeaseLost => "LeaseLost",
                    Reason::HandlerFailed => "HandlerFailed",
                    Reason::BodyTooLarge { .. } => "BodyTooLarge",
                    Reason::BodyTimeout { .. } => "BodyTimeout",
                    Reason::BodyUnreadable => "BodyUnreadable",
                    Reason::IdempotencyKeyInvalid => "IdempotencyKeyInvalid",
                    Reason::IdempotencyKeyMissing => "IdempotencyKeyMissing",
                    Reason::IdempotencyInFlight { .. } => "IdempotencyInFlight",
                    Reason::IdempotencyKeyReused => "IdempotencyKeyReused",
                    Reason::IdempotencyNotStored { .. } => "IdempotencyNotStored",
                    Reason::IdempotencyOutcomeUnknown { .. } => "IdempotencyOutcomeUnknown",
                };
                (name, reason)
            })
            .collect()
    }

    /// The statuses `reason` may be answered with by default (both of an outcome unknown).
    fn statuses(reason: Reason) -> Vec<u16> {
        match reason {
            Reason::IdempotencyOutcomeUnknown { .. } => vec![503, 409],
            _ => vec![ReasonRow::of(reason).status.as_u16()],
        }
    }

    #[test]
    fn the_documented_table_is_the_code() {
        let doc = include_str!("reasons.md");
        let rows: Vec<&str> = doc.lines().skip(2).collect();
        let reasons = every_reason();
        assert_eq!(rows.len(), reasons.len(), "one row per reason");
        for (name, reason) in reasons {
            let refusal = ReasonRow::of(reason);
            let row = rows
                .iter()
                .find(|row| row.starts_with(&format!("| [`{name}`]")))
                .unwrap_or_else(|| panic!("no row for {name}"));
            let cells: Vec<&str> = row.split(" | ").collect();
            for status in statuses(reason) {
                assert!(cells[1].contains(&format!("`{status}`")), "{name}: {row}");
            }
            assert_eq!(cells[2], format!("`{}`", refusal.problem_type), "{name}");
            assert_eq!(cells[3].trim_end_matches(" |"), refusal.title, "{name}");
        }
    }

    /// The HTTP contract tables of the layer and of `IdempotencyLayer` say, beside each problem
    /// type, a status the table gives it.
    #[test]
    fn the_contract_tables_agree_with_the_table() {
        let docs = [
            include_str!("../layer/mod.rs"),
            include_str!("../idempotency/mod.rs"),
        ];
        let reasons = every_reason();
        let mut checked = 0;
        for line in docs.iter().flat_map(|doc| doc.lines()) {
            if !line.starts_with("//! |") {
                continue;
            }
            for (name, reason) in &reasons {
                let problem_type = ReasonRow::of(*reason).problem_type;
                if !line.contains(&format!("{problem_type}`")) {
                    continue;
                }
                let said = statuses(*reason)
                    .iter()
                    .any(|status| line.contains(&format!("`{status}")));
                assert!(said, "{name}: the row does not say its status: {line}");
                checked += 1;
            }
        }
        assert!(checked >= 15, "only {checked} rows checked");
    }
}
