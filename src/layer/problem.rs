//! The responses the layer makes itself: RFC 9457 `application/problem+json` documents.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use super::extract::NameDefect;

const PROBLEM_JSON: &str = "application/problem+json";

/// Why the layer refused a request.
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

/// A refusal as the layer renders it: its [`Reason`], and for a bad name what is wrong with
/// it (the detail the public reason leaves out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Problem {
    pub(crate) reason: Reason,
    name_defect: Option<NameDefect>,
}

impl From<Reason> for Problem {
    fn from(reason: Reason) -> Self {
        Self {
            reason,
            name_defect: None,
        }
    }
}

impl Problem {
    /// A name the layer refuses to lock, and why.
    pub(crate) fn invalid_name(defect: NameDefect) -> Self {
        Self {
            reason: Reason::InvalidName,
            name_defect: Some(defect),
        }
    }

    /// The status the layer answers this problem with: `refused` (the layer's `busy_status`, or
    /// a semaphore's `full_status`) when the lock is taken, and for the rest the one status
    /// each problem has.
    pub(crate) fn status(self, refused: StatusCode) -> StatusCode {
        match self.reason {
            Reason::Busy { .. } | Reason::Full { .. } => refused,
            Reason::InvalidLimit
            | Reason::InvalidName
            | Reason::MissingName
            | Reason::BodyUnreadable => StatusCode::BAD_REQUEST,
            Reason::StoreUnavailable | Reason::NotReplicated | Reason::LeaseLost => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Reason::HandlerFailed => StatusCode::INTERNAL_SERVER_ERROR,
            Reason::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Reason::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Reason::IdempotencyKeyInvalid | Reason::IdempotencyKeyMissing => {
                StatusCode::BAD_REQUEST
            }
            Reason::IdempotencyInFlight { .. } => StatusCode::CONFLICT,
            Reason::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Reason::IdempotencyNotStored { .. } => StatusCode::GONE,
            Reason::IdempotencyOutcomeUnknown {
                retry_after: Some(_),
            } => StatusCode::SERVICE_UNAVAILABLE,
            Reason::IdempotencyOutcomeUnknown { retry_after: None } => StatusCode::CONFLICT,
        }
    }

    /// The problem `type` URI: stable identifiers clients can match on. They are not meant to
    /// be dereferenced, so they name no host.
    fn type_uri(self) -> &'static str {
        match self.reason {
            Reason::Busy { .. } => "urn:tower-lease:lock-busy",
            Reason::Full { .. } => "urn:tower-lease:concurrency-limit",
            Reason::InvalidLimit => "urn:tower-lease:invalid-concurrency-limit",
            Reason::InvalidName => "urn:tower-lease:invalid-lock-name",
            Reason::MissingName => "urn:tower-lease:missing-lock-name",
            Reason::StoreUnavailable => "urn:tower-lease:lock-store-unavailable",
            Reason::NotReplicated => "urn:tower-lease:not-replicated",
            Reason::LeaseLost => "urn:tower-lease:lease-lost",
            Reason::HandlerFailed => "urn:tower-lease:handler-failed",
            Reason::BodyTooLarge { .. } => "urn:tower-lease:body-too-large",
            Reason::BodyTimeout { .. } => "urn:tower-lease:body-timeout",
            Reason::BodyUnreadable => "urn:tower-lease:body-unreadable",
            Reason::IdempotencyKeyInvalid => "urn:tower-lease:idempotency-key-invalid",
            Reason::IdempotencyKeyMissing => "urn:tower-lease:idempotency-key-missing",
            Reason::IdempotencyInFlight { .. } => "urn:tower-lease:idempotency-in-flight",
            Reason::IdempotencyKeyReused => "urn:tower-lease:idempotency-key-reused",
            Reason::IdempotencyNotStored { .. } => "urn:tower-lease:idempotency-not-stored",
            Reason::IdempotencyOutcomeUnknown { .. } => {
                "urn:tower-lease:idempotency-outcome-unknown"
            }
        }
    }

    fn title(self) -> &'static str {
        match self.reason {
            Reason::Busy { .. } => "The resource is locked by another request",
            Reason::Full { .. } => "Too many requests for this resource are running",
            Reason::InvalidLimit => "The request is allowed no concurrent requests",
            Reason::InvalidName => "The request names a resource that cannot be locked",
            Reason::MissingName => "The request does not name the resource to lock",
            Reason::StoreUnavailable => "The lock service is unavailable",
            Reason::NotReplicated => "The lock could not be replicated",
            Reason::LeaseLost => "The lock was lost while the request was being served",
            Reason::HandlerFailed => "The request's handler failed",
            Reason::BodyTooLarge { .. } => "The request body is too large",
            Reason::BodyTimeout { .. } => "The request body did not arrive in time",
            Reason::BodyUnreadable => "The request body could not be read",
            Reason::IdempotencyKeyInvalid => "The Idempotency-Key header is invalid",
            Reason::IdempotencyKeyMissing => "The request needs an Idempotency-Key header",
            Reason::IdempotencyInFlight { .. } => "A request with this idempotency key is running",
            Reason::IdempotencyKeyReused => "The idempotency key was used for another request",
            Reason::IdempotencyNotStored { .. } => {
                "The request with this idempotency key completed, but its response was not kept"
            }
            Reason::IdempotencyOutcomeUnknown { .. } => {
                "The outcome of the request with this idempotency key is unknown"
            }
        }
    }

    fn detail(self, namespace: &str) -> String {
        match self.reason {
            Reason::Busy { retry_after } => format!(
                "Another request holds the {namespace} lock for this resource; \
                 retry in {} s.",
                retry_after_secs(retry_after)
            ),
            Reason::Full { retry_after, limit } => format!(
                "All {limit} permits of {namespace} for this resource are in use; retry in {} s.",
                retry_after_secs(retry_after)
            ),
            Reason::InvalidLimit => format!(
                "The {namespace} limit for this request is 0 concurrent requests, so it can \
                 never run."
            ),
            Reason::InvalidName => match self.name_defect {
                Some(NameDefect::Length(len)) => format!(
                    "Lock names in {namespace} must be 1 to {} bytes long, this one is {len} \
                     bytes.",
                    crate::MAX_NAME_LEN
                ),
                Some(defect) => format!(
                    "Lock names in {namespace} must be UTF-8 text without control characters \
                     or braces; this one {}.",
                    defect.what()
                ),
                None => format!("The request names a {namespace} lock that cannot be taken."),
            },
            Reason::MissingName => format!(
                "Requests here must name the {namespace} resource they act on, and this one \
                 does not."
            ),
            Reason::StoreUnavailable => format!(
                "The {namespace} lock could not be taken because the lock store failed or \
                 did not answer in time; retry shortly."
            ),
            Reason::NotReplicated => format!(
                "The {namespace} lock reached fewer Redis replicas than it must to survive a \
                 failover, so it was given up; retry shortly."
            ),
            Reason::LeaseLost => format!(
                "The {namespace} lease ran out before the request finished, so its outcome \
                 is unknown; check the resource before retrying."
            ),
            Reason::HandlerFailed => format!(
                "The {namespace} request's handler failed before it answered; nothing was \
                 stored for its idempotency key."
            ),
            Reason::BodyTooLarge { limit } => format!(
                "Requests that take the {namespace} lock may carry at most {limit} bytes of body."
            ),
            Reason::BodyTimeout { after } => format!(
                "The body of a request that takes the {namespace} lock must arrive within {} ms.",
                after.as_millis()
            ),
            Reason::BodyUnreadable => format!(
                "The body of this request to the {namespace} lock broke off or was malformed."
            ),
            Reason::IdempotencyKeyInvalid => format!(
                "Idempotency keys in {namespace} are a structured-field string or token of 1 to \
                 255 printable ASCII characters."
            ),
            Reason::IdempotencyKeyMissing => {
                format!("Requests to {namespace} must carry an Idempotency-Key header.")
            }
            Reason::IdempotencyInFlight { retry_after } => format!(
                "The first {namespace} request with this key is still running; retry in {} s \
                 for its response.",
                retry_after_secs(retry_after)
            ),
            Reason::IdempotencyKeyReused => format!(
                "This {namespace} idempotency key belongs to a request with another method, \
                 path or body; use a new key for a new request."
            ),
            Reason::IdempotencyNotStored { status } => format!(
                "The first {namespace} request with this key completed with status {}, \
                 but its response was too large or streamed, so it is not replayed and the \
                 request is not run again.",
                status.as_u16()
            ),
            Reason::IdempotencyOutcomeUnknown {
                retry_after: Some(retry_after),
            } => format!(
                "The first {namespace} request with this key ran, but its response could not \
                 be stored yet; retry in {} s for it.",
                retry_after_secs(retry_after)
            ),
            Reason::IdempotencyOutcomeUnknown { retry_after: None } => format!(
                "The first {namespace} request with this key stopped before it completed, so \
                 whether it took effect is unknown, and it is not run again; check the \
                 resource before sending it with a new key."
            ),
        }
    }

    /// How long a client should wait before trying again, when the layer can tell.
    pub(crate) fn retry_after(self) -> Option<Duration> {
        match self.reason {
            Reason::Busy { retry_after }
            | Reason::Full { retry_after, .. }
            | Reason::IdempotencyInFlight { retry_after } => Some(retry_after),
            Reason::IdempotencyOutcomeUnknown { retry_after } => retry_after,
            // The store is usually back (or failed over) within a second; a client that waits
            // longer gains nothing. A lost lease was given back: the name is free (a retry
            // still runs the request again, which the client must know is safe).
            Reason::StoreUnavailable | Reason::NotReplicated | Reason::LeaseLost => {
                Some(Duration::from_secs(1))
            }
            _ => None,
        }
    }

    /// The problem+json response for this problem with `status`, for a lock in `namespace`.
    pub(crate) fn response(self, status: StatusCode, namespace: &str) -> Response<Bytes> {
        let mut json = String::with_capacity(256);
        json.push('{');
        field(&mut json, "type", self.type_uri());
        json.push(',');
        field(&mut json, "title", self.title());
        let _ = write!(json, ",\"status\":{},", status.as_u16());
        field(&mut json, "detail", &self.detail(namespace));
        json.push(',');
        field(&mut json, "namespace", namespace);
        json.push('}');

        let mut response = Response::new(Bytes::from(json));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(retry_after) = self.retry_after() {
            headers.insert(
                RETRY_AFTER,
                HeaderValue::from(retry_after_secs(retry_after)),
            );
        }
        response
    }
}

/// `Retry-After` counts whole seconds: round up so a client that obeys it never retries while
/// the lease it waits for is still running, and never say 0, which invites a busy loop.
pub(crate) fn retry_after_secs(retry_after: Duration) -> u64 {
    let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    secs.max(1)
}

fn field(json: &mut String, key: &str, value: &str) {
    string(json, key);
    json.push(':');
    string(json, value);
}

/// Writes `value` as a JSON string (RFC 8259 §7).
fn string(json: &mut String, value: &str) {
    json.push('"');
    for c in value.chars() {
        match c {
            '"' => json.push_str("\\\""),
            '\\' => json.push_str("\\\\"),
            '\n' => json.push_str("\\n"),
            '\r' => json.push_str("\\r"),
            '\t' => json.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(json, "\\u{:04x}", u32::from(c));
            }
            c => json.push(c),
        }
    }
    json.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_at_least_one_second() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(30)), 30);
    }

    #[test]
    fn strings_are_escaped() {
        let mut json = String::new();
        string(&mut json, "a\"b\\c\n\u{1}é");
        assert_eq!(json, r#""a\"b\\c\n\u0001é""#);
    }
}
