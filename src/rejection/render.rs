//! The layer's refusals as a value ([`Rejection`]), and how an application renders them
//! itself ([`OnRejection`]).

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Response, StatusCode};

use http_body_util::{BodyExt, Full};

use super::body::{BoxError, RejectionBody};
use super::problem::Problem;
use super::reason::Reason;

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
        self.problem.reason
    }

    /// The status the layer answers with by default: the one [`Reason`]'s table gives the
    /// reason, or the layer's [`busy_status`](crate::LockLayer::busy_status) (or
    /// [`full_status`](crate::SemaphoreLayer::full_status)) when the lock is taken.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The namespace of the layer's lock.
    pub fn namespace(&self) -> &'static str {
        self.namespace
    }

    /// How long a client should wait before trying again, when the layer can tell: when busy
    /// or full, how long holds took lately (never more than the blocking lease has left); one
    /// second when the store is unavailable or the lease was lost.
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
/// Implemented for every `Fn(&Rejection) -> Response<B> + Send + Sync + 'static` whose body
/// `B` is `Bytes` or any `http_body::Body<Data = Bytes>` (`Full<Bytes>`, axum's `Body`), so an
/// axum application renders the layer's refusals with the `IntoResponse` error type it already
/// has:
///
/// ```
/// use axum::response::{IntoResponse, Response};
/// use http::StatusCode;
/// use tower_lease::rejection::{Reason, Rejection};
///
/// // The application's own error type, as its handlers return it.
/// enum AppError { Busy, Other(StatusCode) }
///
/// impl IntoResponse for AppError {
///     fn into_response(self) -> Response {
///         match self {
///             AppError::Busy => (StatusCode::CONFLICT, [("retry-after", "2")], "busy").into_response(),
///             AppError::Other(status) => status.into_response(),
///         }
///     }
/// }
///
/// fn render(rejection: &Rejection) -> Response {
///     match rejection.reason() {
///         Reason::Busy { .. } => AppError::Busy.into_response(),
///         _ => AppError::Other(rejection.status()).into_response(),
///     }
/// }
/// # let _ = tower_lease::LockLayer::new(
/// #     tower_lease::Store::memory(),
/// #     tower_lease::Lock::<str>::new("jobs", std::time::Duration::from_secs(1)),
/// #     tower_lease::extract::path(),
/// # ).on_rejection(render);
/// ```
///
/// [`Rejection::problem_response`] is the layer's own answer, for the cases a hook leaves as
/// they are.
///
/// `M` only tells the two kinds of hook apart (a body that is `Bytes`, or any
/// `http_body::Body`); it is inferred.
pub trait OnRejection<M>: Send + Sync + 'static {
    /// The response for `rejection`.
    fn render(&self, rejection: &Rejection) -> Response<RejectionBody>;
}

/// The [`OnRejection`] marker of a hook whose responses carry a `Bytes` body.
#[derive(Debug)]
#[non_exhaustive]
pub struct BytesBody;

/// The [`OnRejection`] marker of a hook whose responses carry any `http_body::Body`, `B`.
#[derive(Debug)]
#[non_exhaustive]
pub struct AnyBody<B>(PhantomData<fn() -> B>);

impl<F> OnRejection<BytesBody> for F
where
    F: Fn(&Rejection) -> Response<Bytes> + Send + Sync + 'static,
{
    fn render(&self, rejection: &Rejection) -> Response<RejectionBody> {
        self(rejection).map(|bytes| {
            Full::new(bytes)
                .map_err(|never| match never {})
                .boxed_unsync()
        })
    }
}

impl<F, B> OnRejection<AnyBody<B>> for F
where
    F: Fn(&Rejection) -> Response<B> + Send + Sync + 'static,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    fn render(&self, rejection: &Rejection) -> Response<RejectionBody> {
        self(rejection).map(|body| body.map_err(Into::into).boxed_unsync())
    }
}

/// A hook with its marker erased, so the layer can keep it behind one pointer.
trait Render: Send + Sync + 'static {
    fn render(&self, rejection: &Rejection) -> Response<RejectionBody>;
}

struct Hook<H, M>(H, PhantomData<fn() -> M>);

impl<H: OnRejection<M>, M: 'static> Render for Hook<H, M> {
    fn render(&self, rejection: &Rejection) -> Response<RejectionBody> {
        self.0.render(rejection)
    }
}

/// A layer's [`OnRejection`] hook, if it has one.
#[derive(Clone, Default)]
pub(crate) struct Renderer(Option<Arc<dyn Render>>);

impl Renderer {
    pub(crate) fn new<M: 'static>(hook: impl OnRejection<M>) -> Self {
        Self(Some(Arc::new(Hook(hook, PhantomData))))
    }

    /// The hook's response to `rejection`, or `None` when the layer has no hook (and answers
    /// [`Rejection::problem_response`]).
    pub(crate) fn render(&self, rejection: &Rejection) -> Option<Response<RejectionBody>> {
        self.0.as_ref().map(|hook| hook.render(rejection))
    }
}

impl Renderer {
    /// The response to `problem` with `status` as one boxed body, for layers whose bodies are
    /// not the lock layers' `LeaseBody`.
    pub(crate) fn respond_boxed(
        &self,
        problem: Problem,
        status: StatusCode,
        namespace: &'static str,
    ) -> Response<RejectionBody> {
        let rejection = Rejection::new(problem, status, namespace);
        match &self.0 {
            Some(hook) => hook.render(&rejection),
            None => rejection.problem_response().map(|bytes| {
                Full::new(bytes)
                    .map_err(|never| match never {})
                    .boxed_unsync()
            }),
        }
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
