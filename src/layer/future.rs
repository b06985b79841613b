//! [`ResponseFuture`]: acquire, run the inner service, release.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tokio_util::sync::WaitForCancellationFutureOwned;
use tower_service::Service;

use super::body::{Hold, LeaseBody};
use super::layer::Config;
use super::lease::{LeaseGuard, LeaseLost};
use super::problem::{NameDefect, Problem};
use crate::store::BoxFuture;
use crate::token::{Attempt, Holding};
use crate::{Error, Result};

/// The acquisition in flight, with the instant its command was sent.
pub(crate) type Acquire = BoxFuture<'static, (Instant, Result<Attempt<Holding>>)>;

/// A store call in flight that is finished in a spawned task if the request is dropped first.
///
/// Once a command has left, the store acts on it whether or not anyone waits for the answer: a
/// request cancelled while its acquisition is in flight would leave a lease nobody holds, and one
/// cancelled while its release is in flight might never send it. Either way the lock would stay
/// taken for a whole TTL. So a dropped call runs on to its end, and a lease it took is given back.
pub(crate) struct InFlight<T: Send + 'static> {
    call: Option<BoxFuture<'static, T>>,
    // A call never polled has sent nothing and can simply be dropped.
    polled: bool,
    settle: fn(T) -> Option<BoxFuture<'static, ()>>,
}

impl<T: Send + 'static> InFlight<T> {
    /// `settle` says what to do with the answer of a call nobody waits for any more.
    fn new(call: BoxFuture<'static, T>, settle: fn(T) -> Option<BoxFuture<'static, ()>>) -> Self {
        Self {
            call: Some(call),
            polled: false,
            settle,
        }
    }
}

fn acquisition(acquire: Acquire) -> InFlight<(Instant, Result<Attempt<Holding>>)> {
    InFlight::new(acquire, |(_, attempt)| match attempt {
        Ok(Attempt::Acquired(held)) => Some(Box::pin(async move {
            if let Err(error) = held.release().await {
                tracing::warn!(namespace = held.namespace(), %error, "releasing the lease of a cancelled request failed; it stays held until its TTL runs out");
            }
        })),
        _ => None,
    })
}

/// A release that is finished in a spawned task if dropped before the store answers.
pub(crate) fn in_flight_release(release: BoxFuture<'static, ()>) -> InFlight<()> {
    InFlight::new(release, |()| None)
}

impl<T: Send + 'static> Future for InFlight<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        self.polled = true;
        let call = self
            .call
            .as_mut()
            .expect("InFlight polled after completion");
        let answer = ready!(call.as_mut().poll(cx));
        self.call = None;
        Poll::Ready(answer)
    }
}

impl<T: Send + 'static> Drop for InFlight<T> {
    fn drop(&mut self) {
        let Some(call) = self.call.take().filter(|_| self.polled) else {
            return;
        };
        // Outside a runtime the call cannot go on; the TTL frees whatever it took.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let settle = self.settle;
            runtime.spawn(async move {
                if let Some(follow_up) = settle(call.await) {
                    follow_up.await;
                }
            });
        }
    }
}

pin_project! {
    /// The response future of [`LockService`](super::LockService).
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<B>>,
    {
        #[pin]
        state: State<S, B>,
        config: Arc<Config>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<B>>,
    {
        // Waiting for the store; the readied inner service and the request wait with it.
        Acquiring {
            acquire: InFlight<(Instant, Result<Attempt<Holding>>)>,
            call: Option<(S, Request<B>)>,
        },
        // The inner service runs; `guard` is `None` for a request that runs unlocked.
        Running {
            #[pin]
            inner: S::Future,
            guard: Option<LeaseGuard>,
            // Set under `LeaseLost::Abort`: resolves when the heartbeat gives the lease up.
            lost: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
        },
        // Waiting for the store to confirm the release, then answering with the inner service's
        // result, or with 503 when `result` is `None` (the lease was lost).
        Releasing {
            release: InFlight<()>,
            result: Option<Result<S::Response, S::Error>>,
        },
        // The layer answers by itself.
        Respond {
            problem: Problem,
            status: StatusCode,
        },
        Done,
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    pub(crate) fn acquiring(
        acquire: Acquire,
        config: Arc<Config>,
        inner: S,
        req: Request<B>,
    ) -> Self {
        Self {
            state: State::Acquiring {
                acquire: acquisition(acquire),
                call: Some((inner, req)),
            },
            config,
        }
    }

    /// Refuses the request without asking the store.
    pub(crate) fn refused(problem: Problem, status: StatusCode, config: Arc<Config>) -> Self {
        Self {
            state: State::Respond { problem, status },
            config,
        }
    }

    pub(crate) fn unlocked(inner: S::Future, config: Arc<Config>) -> Self {
        Self {
            state: State::Running {
                inner,
                guard: None,
                lost: None,
            },
            config,
        }
    }
}

impl<S, B, ResBody> Future for ResponseFuture<S, B>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    ResBody: http_body::Body,
{
    type Output = Result<Response<LeaseBody<ResBody>>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let this = self.as_mut().project();
            let config = &**this.config;
            let namespace = config.spec.namespace;
            let next = match this.state.project() {
                StateProj::Acquiring { acquire, call } => {
                    let (sent_at, attempt) = ready!(Pin::new(acquire).poll(cx));
                    let (mut inner, mut req) = call.take().expect("polled after completion");
                    match attempt {
                        // Acquiring → Running, holding the lease.
                        Ok(Attempt::Acquired(held)) => {
                            let guard = LeaseGuard::start(held, sent_at, config.heartbeat);
                            req.extensions_mut().insert(guard.lease());
                            let lost = (config.on_lease_lost == LeaseLost::Abort)
                                .then(|| Box::pin(guard.gone()));
                            State::Running {
                                inner: inner.call(req),
                                guard: Some(guard),
                                lost,
                            }
                        }
                        // Acquiring → Respond: someone else holds it.
                        Ok(Attempt::Busy { retry_after }) => {
                            tracing::debug!(namespace, ?retry_after, "lock held, request refused");
                            State::Respond {
                                problem: Problem::Busy { retry_after },
                                status: config.held_status,
                            }
                        }
                        // Acquiring → Respond: the extractor's name cannot be locked.
                        Err(Error::InvalidName { len }) => {
                            tracing::debug!(namespace, len, "invalid lock name, request refused");
                            State::Respond {
                                problem: Problem::InvalidName(NameDefect::Length(len)),
                                status: StatusCode::BAD_REQUEST,
                            }
                        }
                        // Acquiring → Running unlocked: the store failed and we fail open.
                        Err(error) if config.fail_open => {
                            tracing::warn!(namespace, %error, "lock store failed, running the request unlocked (fail_open)");
                            State::Running {
                                inner: inner.call(req),
                                guard: None,
                                lost: None,
                            }
                        }
                        // Acquiring → Respond: the store failed and we fail closed.
                        Err(error) => {
                            tracing::warn!(namespace, %error, "lock store failed, request refused");
                            State::Respond {
                                problem: Problem::Unavailable,
                                status: StatusCode::SERVICE_UNAVAILABLE,
                            }
                        }
                    }
                }
                StateProj::Running { inner, guard, lost } => {
                    let result = match inner.poll(cx) {
                        Poll::Ready(result) => result,
                        Poll::Pending => {
                            if let Some(guard) = guard {
                                guard.poll_heartbeat(cx, &config.beats);
                            }
                            if !lost
                                .as_mut()
                                .is_some_and(|lost| lost.as_mut().poll(cx).is_ready())
                            {
                                return Poll::Pending;
                            }
                            // Running → Releasing: leaving the state drops the inner future,
                            // which cancels the handler; then answer 503 once released.
                            tracing::warn!(namespace, "lease lost, inner service cancelled");
                            let guard = guard.take().expect("`lost` is only set with a guard");
                            self.as_mut().project().state.set(State::Releasing {
                                release: in_flight_release(guard.release()),
                                result: None,
                            });
                            continue;
                        }
                    };
                    let Some(guard) = guard.take() else {
                        // Running unlocked → Done.
                        self.as_mut().project().state.set(State::Done);
                        return Poll::Ready(result.map(|res| res.map(LeaseBody::inner)));
                    };
                    // The success rule: a response is only worth passing on if the lease was
                    // still ours when it was produced, however late the heartbeat runs.
                    if lost.is_some() && !guard.valid_at(Instant::now()) {
                        tracing::warn!(
                            namespace,
                            "lease ran out before the inner service answered"
                        );
                        // Running → Releasing, answering 503: the lease may still be in
                        // the store for the drift margin, so give it back first.
                        State::Releasing {
                            release: in_flight_release(guard.release()),
                            result: None,
                        }
                    } else if config.hold_through_body {
                        // Running → Done: the body owns the lease from here on, and nobody
                        // may poll it while the client reads slowly, so the heartbeat must run.
                        let mut guard = guard;
                        guard.spawn_heartbeat(&config.beats);
                        let abort_on = lost.take();
                        self.as_mut().project().state.set(State::Done);
                        return Poll::Ready(result.map(|res| {
                            res.map(|body| LeaseBody::held(body, Hold { guard, abort_on }))
                        }));
                    } else {
                        // Running → Releasing: give the lease back before the head goes out.
                        State::Releasing {
                            release: in_flight_release(guard.release()),
                            result: Some(result),
                        }
                    }
                }
                StateProj::Releasing { release, result } => {
                    ready!(Pin::new(release).poll(cx));
                    match result.take() {
                        Some(result) => {
                            // Releasing → Done.
                            self.as_mut().project().state.set(State::Done);
                            return Poll::Ready(result.map(|res| res.map(LeaseBody::inner)));
                        }
                        // Releasing → Respond.
                        None => State::Respond {
                            problem: Problem::Lost,
                            status: StatusCode::SERVICE_UNAVAILABLE,
                        },
                    }
                }
                StateProj::Respond { problem, status } => {
                    let response = problem.response(*status, namespace);
                    // Respond → Done.
                    self.as_mut().project().state.set(State::Done);
                    return Poll::Ready(Ok(response));
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            };
            self.as_mut().project().state.set(next);
        }
    }
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
