//! The responses the layer makes itself: RFC 9457 `application/problem+json` documents, with
//! the status, type and title [the refusal table](super::reason) gives each reason.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use super::reason::{Reason, ReasonRow};
use crate::name::from_request::NameDefect;

const PROBLEM_JSON: &str = "application/problem+json";

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

    /// The status the layer answers this problem with: the [table](ReasonRow)'s, or `taken`
    /// (the layer's [`busy_status`](crate::LockLayer::busy_status) or
    /// [`full_status`](crate::SemaphoreLayer::full_status)) when the user set one and the
    /// lock is taken.
    pub(crate) fn status(self, taken: Option<StatusCode>) -> StatusCode {
        match (self.reason, taken) {
            (Reason::Busy { .. } | Reason::Full { .. }, Some(status)) => status,
            _ => ReasonRow::of(self.reason).status,
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
        let refusal = ReasonRow::of(self.reason);
        field(&mut json, "type", refusal.problem_type);
        json.push(',');
        field(&mut json, "title", refusal.title);
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
