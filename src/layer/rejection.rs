//! The layer's refusals as a value ([`Rejection`]), and how an application renders them
//! itself ([`OnRejection`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};

use super::body::LeaseBody;
use super::problem::Problem;

/// A request the layer answered itself instead of running the inner service.
///
/// An [`OnRejection`] hook receives it to render the response; [`problem_response`] is what
/// the layer answers when there is no hook.
///
/// [`problem_response`]: Self::problem_response
#[derive(Clone, Debug)]
pub struct Rejection {
    problem: Problem,
    status: StatusCode,
    namespace: &'static str,
}

/// Why the layer refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// Someone else holds the lock.
    Busy {
        /// How long the holder's lease has left. Under the layer's heartbeat a holder keeps
        /// extending, so this is about a TTL for as long as the holder works: a hint, not a
        /// promise that the lock is free then.
        retry_after: Duration,
    },
    /// Every permit of the [`SemaphoreLayer`](crate::SemaphoreLayer)'s semaphore is taken.
    Full {
        /// How long until the earliest live permit's lease ends (a hint under the holders'
        /// heartbeats, as for [`Busy`](Self::Busy)).
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
    /// The lease was lost while the inner service ran; its outcome is unknown.
    LeaseLost,
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
}

impl Rejection {
    pub(crate) fn new(problem: Problem, status: StatusCode, namespace: &'static str) -> Self {
        Self {
            problem,
            status,
            namespace,
        }
    }

    /// Why the request was refused.
    pub fn reason(&self) -> Reason {
        match self.problem {
            Problem::Busy { retry_after } => Reason::Busy { retry_after },
            Problem::Full { retry_after, limit } => Reason::Full { retry_after, limit },
            Problem::InvalidLimit => Reason::InvalidLimit,
            Problem::InvalidName(_) => Reason::InvalidName,
            Problem::MissingName => Reason::MissingName,
            Problem::Unavailable => Reason::StoreUnavailable,
            Problem::Lost => Reason::LeaseLost,
            Problem::BodyTooLarge { limit } => Reason::BodyTooLarge { limit },
            Problem::BodyTimeout { after } => Reason::BodyTimeout { after },
            Problem::BodyUnreadable => Reason::BodyUnreadable,
        }
    }

    /// The status the layer answers with by default: the layer's
    /// [`held_status`](crate::LockLayer::held_status) when busy (or
    /// [`full_status`](crate::SemaphoreLayer::full_status) when full), `400` for names and a
    /// limit of 0, `503` when
    /// the store is unavailable or the lease was lost, `413`, `408` and `400` for bodies.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The namespace of the layer's lock.
    pub fn namespace(&self) -> &'static str {
        self.namespace
    }

    /// How long a client should wait before trying again, when the layer can tell: the
    /// holder's remaining lease when busy, the earliest permit's when full, one second when the
    /// store is unavailable.
    pub fn retry_after(&self) -> Option<Duration> {
        self.problem.retry_after()
    }

    /// The layer's default answer: an RFC 9457 `application/problem+json` document with
    /// [`status`](Self::status), and `Retry-After` in whole seconds (rounded up, at least 1)
    /// where [`retry_after`](Self::retry_after) says one.
    pub fn problem_response(&self) -> Response<Bytes> {
        self.problem.response(self.status, self.namespace)
    }
}

/// Renders the layer's refusals: set with
/// [`on_rejection`](crate::LockLayer::on_rejection) to answer in an application's own error
/// format or with its own `Retry-After` policy.
///
/// Implemented for every `Fn(&Rejection) -> Response<Bytes> + Send + Sync + 'static`.
///
/// ```
/// use bytes::Bytes;
/// use http::{Response, header};
/// use tower_lease::layer::{Reason, Rejection};
///
/// fn render(rejection: &Rejection) -> Response<Bytes> {
///     match rejection.reason() {
///         Reason::Busy { .. } => Response::builder()
///             .status(rejection.status())
///             .header(header::CONTENT_TYPE, "application/json")
///             .header(header::RETRY_AFTER, "2")
///             .body(Bytes::from_static(br#"{"error":"busy"}"#))
///             .unwrap(),
///         // Everything else as the layer would answer.
///         _ => rejection.problem_response(),
///     }
/// }
/// ```
pub trait OnRejection: Send + Sync + 'static {
    /// The response for `rejection`.
    fn render(&self, rejection: &Rejection) -> Response<Bytes>;
}

impl<F> OnRejection for F
where
    F: Fn(&Rejection) -> Response<Bytes> + Send + Sync + 'static,
{
    fn render(&self, rejection: &Rejection) -> Response<Bytes> {
        self(rejection)
    }
}

/// A layer's [`OnRejection`] hook, if it has one.
#[derive(Clone, Default)]
pub(crate) struct Renderer(Option<Arc<dyn OnRejection>>);

impl Renderer {
    pub(crate) fn new(hook: impl OnRejection) -> Self {
        Self(Some(Arc::new(hook)))
    }

    /// The response to `problem` with `status`, for a lock in `namespace`.
    pub(crate) fn respond<B: http_body::Body>(
        &self,
        problem: Problem,
        status: StatusCode,
        namespace: &'static str,
    ) -> Response<LeaseBody<B>> {
        let rejection = Rejection::new(problem, status, namespace);
        let response = match &self.0 {
            Some(hook) => hook.render(&rejection),
            None => rejection.problem_response(),
        };
        response.map(LeaseBody::problem)
    }
}

impl fmt::Debug for Renderer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hook = if self.0.is_some() {
            "custom"
        } else {
            "problem+json"
        };
        f.debug_tuple("Renderer").field(&hook).finish()
    }
}
