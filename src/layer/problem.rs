//! The responses the layer makes itself: RFC 9457 `application/problem+json` documents.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Response, StatusCode};

use super::extract::NameDefect;

const PROBLEM_JSON: &str = "application/problem+json";

/// Why the layer answered instead of the inner service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Problem {
    /// Someone else holds the lock; their lease has `retry_after` left.
    Busy { retry_after: Duration },
    /// Every permit of the semaphore is taken; the earliest ends in `retry_after`.
    Full { retry_after: Duration, limit: u32 },
    /// The layer's per-request permits gave a limit of 0.
    InvalidLimit,
    /// The extractor produced a name the layer refuses to lock.
    InvalidName(NameDefect),
    /// The extractor found no name, and the layer requires one.
    MissingName,
    /// The store failed or did not answer in time, and the layer fails closed.
    Unavailable,
    /// The store took the lease, but fewer replicas acknowledged it than the store waits for.
    NotReplicated,
    /// The lease ran out (or was taken away) while the request was being served.
    Lost,
    /// The request body is longer than the layer buffers.
    BodyTooLarge { limit: usize },
    /// The request body did not arrive in time to be buffered.
    BodyTimeout { after: Duration },
    /// The request body broke off or was malformed while being buffered.
    BodyUnreadable,
}

impl Problem {
    /// The status the layer answers this problem with: `refused` (the layer's `held_status`, or
    /// a semaphore's `full_status`) when the lock is taken, and for the rest the one status
    /// each problem has.
    pub(crate) fn status(self, refused: StatusCode) -> StatusCode {
        match self {
            Problem::Busy { .. } | Problem::Full { .. } => refused,
            Problem::InvalidLimit
            | Problem::InvalidName(_)
            | Problem::MissingName
            | Problem::BodyUnreadable => StatusCode::BAD_REQUEST,
            Problem::Unavailable | Problem::NotReplicated | Problem::Lost => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Problem::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Problem::BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
        }
    }

    /// The problem `type` URI: stable identifiers clients can match on. They are not meant to
    /// be dereferenced, so they name no host.
    fn type_uri(self) -> &'static str {
        match self {
            Problem::Busy { .. } => "urn:tower-lease:lock-held",
            Problem::Full { .. } => "urn:tower-lease:concurrency-limit",
            Problem::InvalidLimit => "urn:tower-lease:invalid-concurrency-limit",
            Problem::InvalidName(_) => "urn:tower-lease:invalid-lock-name",
            Problem::MissingName => "urn:tower-lease:missing-lock-name",
            Problem::Unavailable => "urn:tower-lease:lock-store-unavailable",
            Problem::NotReplicated => "urn:tower-lease:not-replicated",
            Problem::Lost => "urn:tower-lease:lease-lost",
            Problem::BodyTooLarge { .. } => "urn:tower-lease:body-too-large",
            Problem::BodyTimeout { .. } => "urn:tower-lease:body-timeout",
            Problem::BodyUnreadable => "urn:tower-lease:body-unreadable",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Problem::Busy { .. } => "The resource is locked by another request",
            Problem::Full { .. } => "Too many requests for this resource are running",
            Problem::InvalidLimit => "The request is allowed no concurrent requests",
            Problem::InvalidName(_) => "The request names a resource that cannot be locked",
            Problem::MissingName => "The request does not name the resource to lock",
            Problem::Unavailable => "The lock service is unavailable",
            Problem::NotReplicated => "The lock could not be replicated",
            Problem::Lost => "The lock was lost while the request was being served",
            Problem::BodyTooLarge { .. } => "The request body is too large",
            Problem::BodyTimeout { .. } => "The request body did not arrive in time",
            Problem::BodyUnreadable => "The request body could not be read",
        }
    }

    fn detail(self, namespace: &str) -> String {
        match self {
            Problem::Busy { retry_after } => format!(
                "Another request holds the {namespace} lock for this resource; \
                 retry in {} s.",
                retry_after_secs(retry_after)
            ),
            Problem::Full { retry_after, limit } => format!(
                "All {limit} permits of {namespace} for this resource are in use; retry in {} s.",
                retry_after_secs(retry_after)
            ),
            Problem::InvalidLimit => format!(
                "The {namespace} limit for this request is 0 concurrent requests, so it can \
                 never run."
            ),
            Problem::InvalidName(NameDefect::Length(len)) => format!(
                "Lock names in {namespace} must be 1 to {} bytes long, this one is {len} bytes.",
                crate::MAX_NAME_LEN
            ),
            Problem::InvalidName(defect) => format!(
                "Lock names in {namespace} must be UTF-8 text without control characters or \
                 braces; this one {}.",
                defect.what()
            ),
            Problem::MissingName => format!(
                "Requests here must name the {namespace} resource they act on, and this one \
                 does not."
            ),
            Problem::Unavailable => format!(
                "The {namespace} lock could not be taken because the lock store failed or \
                 did not answer in time; retry shortly."
            ),
            Problem::NotReplicated => format!(
                "The {namespace} lock reached fewer Redis replicas than it must to survive a \
                 failover, so it was given up; retry shortly."
            ),
            Problem::Lost => format!(
                "The {namespace} lease ran out before the request finished, so its outcome \
                 is unknown; check the resource before retrying."
            ),
            Problem::BodyTooLarge { limit } => format!(
                "Requests that take the {namespace} lock may carry at most {limit} bytes of body."
            ),
            Problem::BodyTimeout { after } => format!(
                "The body of a request that takes the {namespace} lock must arrive within {} ms.",
                after.as_millis()
            ),
            Problem::BodyUnreadable => format!(
                "The body of this request to the {namespace} lock broke off or was malformed."
            ),
        }
    }

    /// How long a client should wait before trying again, when the layer can tell.
    pub(crate) fn retry_after(self) -> Option<Duration> {
        match self {
            Problem::Busy { retry_after } | Problem::Full { retry_after, .. } => Some(retry_after),
            // The store is usually back (or failed over) within a second; a client that waits
            // longer gains nothing.
            Problem::Unavailable | Problem::NotReplicated => Some(Duration::from_secs(1)),
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
