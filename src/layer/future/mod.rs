//! [`ResponseFuture`]: acquire, run the inner service, release.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::layer::body::LeaseBody;
use crate::layer::hold::guard::{Guarded, LeaseGuard};
use crate::layer::hold::release_wait::poll_release;
use crate::layer::options::config::Config;
use crate::layer::request_body::timeout_body::TimeoutBody;
use crate::lease::finish_on_drop::FinishOnDrop;
use crate::rejection::Problem;

mod state;

use self::state::{State, StateProj, Step, acquired, locked, poll_locked};

pin_project! {
    /// The response future of [`LeaseService`](super::LeaseService).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<TimeoutBody<B>>>,
    {
        #[pin]
        state: State<S, B>,
        config: Arc<Config>,
        // `tower_lease.request`, entered while polled; none for a request without a lock.
        span: tracing::Span,
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<TimeoutBody<B>>>,
{
    /// Acquires with `acquire`, then calls the readied `inner` with `req`. `full_at` is the
    /// limit of a permit's acquisition, whose refusal says "full" rather than "busy";
    /// `retry_within` the longest `Retry-After` a refusal may say.
    pub(crate) fn acquiring(
        acquire: FinishOnDrop<Guarded>,
        config: Arc<Config>,
        inner: S,
        req: Request<B>,
        (full_at, retry_within): (Option<u32>, Option<Duration>),
        span: tracing::Span,
    ) -> Self {
        let state = State::Acquiring {
            acquire,
            call: Some((inner, req)),
            full_at,
            retry_within,
        };
        Self {
            state,
            config,
            span,
        }
    }

    /// Runs the request under `guard`, a lease it already has (a read that joined a held
    /// share): `inner` is called now.
    pub(crate) fn locked(
        guard: LeaseGuard,
        config: Arc<Config>,
        inner: &mut S,
        req: Request<B>,
        span: tracing::Span,
    ) -> Self
    where
        B: http_body::Body,
    {
        let state = span.in_scope(|| locked(guard, &config, inner, req));
        Self {
            state,
            config,
            span,
        }
    }

    /// Refuses the request without asking the store.
    pub(crate) fn refused(problem: Problem, config: Arc<Config>, span: tracing::Span) -> Self {
        let state = State::Refusing { problem };
        Self {
            state,
            config,
            span,
        }
    }

    /// Runs the request without a lease.
    pub(crate) fn unlocked(inner: S::Future, config: Arc<Config>) -> Self {
        let state = State::Unlocked { inner };
        let span = tracing::Span::none();
        Self {
            state,
            config,
            span,
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<TimeoutBody<B>>, Response = Response<ResBody>>,
    B: http_body::Body,
    ResBody: http_body::Body,
{
    type Output = Result<Response<LeaseBody<ResBody>>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            let _entered = this.span.enter();
            let config: &Config = this.config;
            let namespace = config.definition.namespace;
            let next = match this.state.as_mut().project() {
                StateProj::Acquiring {
                    acquire,
                    call,
                    full_at,
                    retry_within,
                } => {
                    let attempt = ready!(Pin::new(acquire).poll(cx));
                    let in_state = "taken once, on leaving the Acquiring state";
                    let (inner, req) = call.take().expect(in_state);
                    // Acquiring → Locked, Refusing or Unlocked.
                    acquired(attempt, inner, req, *full_at, *retry_within, config)
                }
                StateProj::Unlocked { inner } => {
                    let response = ready!(inner.poll(cx));
                    // Unlocked → Done.
                    this.state.set(State::Done);
                    return Poll::Ready(response.map(|res| res.map(LeaseBody::inner)));
                }
                StateProj::Locked {
                    inner,
                    guard,
                    body_late,
                    since,
                } => match ready!(poll_locked(inner, guard, body_late, *since, config, cx)) {
                    // Locked → Releasing or ReleasingToRefuse.
                    Step::Next(next) => next,
                    // Locked → Done: the body holds the lease from here on.
                    Step::Answer(response) => {
                        this.state.set(State::Done);
                        return Poll::Ready(response);
                    }
                },
                StateProj::Releasing {
                    release,
                    wait,
                    response,
                } => {
                    ready!(poll_release(release, wait, cx, namespace));
                    let response = response.take().expect("passed on once");
                    // Releasing → Done; a release still in flight finishes in the background.
                    this.state.set(State::Done);
                    return Poll::Ready(response.map(|res| res.map(LeaseBody::inner)));
                }
                StateProj::ReleasingToRefuse {
                    release,
                    wait,
                    problem,
                } => {
                    ready!(poll_release(release, wait, cx, namespace));
                    let response = config.refuse(*problem);
                    // ReleasingToRefuse → Done.
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(response));
                }
                StateProj::Refusing { problem } => {
                    let response = config.refuse(*problem);
                    // Refusing → Done.
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(response));
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            };
            this.state.set(next);
        }
    }
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<TimeoutBody<B>>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
