//! [`ResponseFuture`]: acquire, run the inner service, release.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_service::Service;

use super::body::LeaseBody;
use super::hold::guard::{Guarded, LeaseGuard};
use super::hold::lease_lost::LeaseLost;
use super::hold::release_wait::poll_release;
use super::options::config::Config;
use super::request_body::timeout_body::TimeoutBody;
use crate::lease::finish_on_drop::FinishOnDrop;
use crate::locks::attempt::Attempt;
use crate::rejection::{Problem, Reason};
use crate::wait::coarse_timer::Overdue;

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

pin_project! {
    // The fields a transition moves on are `Option`s taken out of the state, rather than the
    // state moved out whole with `project_replace`: that copies the whole state (as large as
    // the inner future plus the guard) in and out several times per request.
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<TimeoutBody<B>>>,
    {
        // Waiting for the store; the readied inner service and the request wait with it.
        Acquiring {
            acquire: FinishOnDrop<Guarded>,
            // The readied service and its request; `Some` until the acquisition answers.
            call: Option<(S, Request<B>)>,
            // For a permit: refused means the semaphore is full at this limit.
            full_at: Option<u32>,
        },
        // The inner service runs without a lease: the request names no lock, or the store failed
        // and the layer fails open.
        Unlocked {
            #[pin]
            inner: S::Future,
        },
        // The inner service runs under the lease.
        Locked {
            #[pin]
            inner: S::Future,
            // `Some` until the state is left.
            guard: Option<LeaseGuard>,
            // Set when the request body did not arrive within the layer's `body_timeout`; `None`
            // when the body was complete from the start.
            body_late: Option<Arc<AtomicBool>>,
            // When the inner service was called, for the layer's hold times.
            since: Instant,
        },
        // Giving the lease back before the inner service's response goes out, for at most
        // the layer's `release_wait`.
        Releasing {
            release: FinishOnDrop<()>,
            wait: Overdue,
            // `Some` until it is passed on.
            response: Option<Result<S::Response, S::Error>>,
        },
        // Giving the lease back before the layer answers by itself, for at most the layer's
        // `release_wait`: 503 for a lost lease (it may still be in the store for the drift
        // margin), 408 for a request body that did not arrive in time.
        ReleasingToRefuse {
            release: FinishOnDrop<()>,
            wait: Overdue,
            problem: Problem,
        },
        // The layer answers by itself.
        Refusing {
            problem: Problem,
        },
        Done,
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<TimeoutBody<B>>>,
{
    /// Acquires with `acquire`, then calls the readied `inner` with `req`. `full_at` is the
    /// limit of a permit's acquisition, whose refusal says "full" rather than "busy".
    pub(crate) fn acquiring(
        acquire: FinishOnDrop<Guarded>,
        config: Arc<Config>,
        inner: S,
        req: Request<B>,
        full_at: Option<u32>,
        span: tracing::Span,
    ) -> Self {
        let state = State::Acquiring {
            acquire,
            call: Some((inner, req)),
            full_at,
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

/// The request under `guard`: its lease in the extensions, its body under the layer's deadline
/// from now on (so a trickling client cannot hold the lock), and `inner` called.
fn locked<S, B>(
    guard: LeaseGuard,
    config: &Config,
    inner: &mut S,
    mut req: Request<B>,
) -> State<S, B>
where
    S: Service<Request<TimeoutBody<B>>>,
    B: http_body::Body,
{
    req.extensions_mut().insert(guard.lease());
    let (parts, body) = req.into_parts();
    let (timeout, timer) = (config.body_timeout.after(), config.body_timeout.timer());
    let (body, body_late) = TimeoutBody::within(body, timeout, timer);
    let inner = inner.call(Request::from_parts(parts, body));
    State::Locked {
        inner,
        guard: Some(guard),
        body_late,
        since: Instant::now(),
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
            let namespace = config.spec.namespace;
            let next = match this.state.as_mut().project() {
                StateProj::Acquiring {
                    acquire,
                    call,
                    full_at,
                } => {
                    let attempt = ready!(Pin::new(acquire).poll(cx));
                    let in_state = "taken once, on leaving the Acquiring state";
                    let (inner, req) = call.take().expect(in_state);
                    // Acquiring → Locked, Refusing or Unlocked.
                    acquired(attempt, inner, req, *full_at, config)
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

/// Where a turn of a state ends: in the next state, or with the answer.
enum Step<S, B, ResBody>
where
    S: Service<Request<TimeoutBody<B>>>,
    ResBody: http_body::Body,
{
    Next(State<S, B>),
    Answer(Result<Response<LeaseBody<ResBody>>, S::Error>),
}

/// The state after the acquisition's `attempt`: the request under its lease, the layer's
/// refusal, or (failing open) the request without one.
fn acquired<S, B>(
    attempt: Guarded,
    mut inner: S,
    req: Request<B>,
    full_at: Option<u32>,
    config: &Config,
) -> State<S, B>
where
    S: Service<Request<TimeoutBody<B>>>,
    B: http_body::Body,
{
    let namespace = config.spec.namespace;
    match attempt {
        Ok(Attempt::Acquired(guard)) => locked(guard, config, &mut inner, req),
        // Someone else holds it, or every permit is taken.
        Ok(Attempt::Busy { retry_after: lease }) => {
            // The holder extends its lease while it works, so the lease says "about a TTL"
            // whatever the work; the holds seen lately say more.
            let retry_after = config.hold_times.expected_wait(lease);
            tracing::debug!(
                namespace,
                ?retry_after,
                ?lease,
                "lock busy, request refused"
            );
            let problem = match full_at {
                Some(limit) => Problem::from(Reason::Full { retry_after, limit }),
                None => Problem::from(Reason::Busy { retry_after }),
            };
            State::Refusing { problem }
        }
        // The store failed and the layer fails open.
        Err(error) if config.fail_open => {
            tracing::warn!(namespace, %error, "lock store failed, running the request unlocked (fail_open)");
            State::Unlocked {
                inner: inner.call(req.map(TimeoutBody::new)),
            }
        }
        // The store failed and the layer fails closed.
        Err(error) => {
            tracing::warn!(namespace, %error, "lock store failed, request refused");
            let reason = match error {
                crate::Error::NotReplicated { .. } => Reason::NotReplicated,
                _ => Reason::StoreUnavailable,
            };
            State::Refusing {
                problem: Problem::from(reason),
            }
        }
    }
}

/// Polls the inner service under `guard`, the `Locked` state's turn: checks the lease before
/// every poll of the work, and once the work answered, where the answer goes.
fn poll_locked<S, B, ResBody>(
    inner: Pin<&mut S::Future>,
    guard: &mut Option<LeaseGuard>,
    body_late: &Option<Arc<AtomicBool>>,
    since: Instant,
    config: &Config,
    cx: &mut Context<'_>,
) -> Poll<Step<S, B, ResBody>>
where
    S: Service<Request<TimeoutBody<B>>, Response = Response<ResBody>>,
    B: http_body::Body,
    ResBody: http_body::Body,
{
    let namespace = config.spec.namespace;
    let in_state = "taken once, on leaving the Locked state";
    let abort_on_loss = config.on_lease_lost == LeaseLost::Abort;
    let held = guard.as_mut().expect(in_state);
    // Before every poll of the work: a process frozen past its lease (SIGSTOP, a pause, a
    // starved executor) must not take the work's next step when it wakes, whether or not the
    // heartbeat has run since.
    if abort_on_loss && held.over_at(Instant::now()) {
        tracing::warn!(namespace, "lease lost, inner service cancelled");
        // → ReleasingToRefuse: replacing the state drops the inner future, which cancels the
        // handler before the release is sent (when first polled).
        let guard = guard.take().expect(in_state);
        return Poll::Ready(Step::Next(releasing_lost(guard, config)));
    }
    let response = match inner.poll(cx) {
        Poll::Ready(response) => response,
        Poll::Pending => {
            held.poll_first_beat(cx, &config.heartbeat, config.beat.first_beat_timer());
            if abort_on_loss && held.poll_lost(cx).is_ready() {
                // The lease ended while the work waited: → ReleasingToRefuse, as above.
                tracing::warn!(namespace, "lease lost, inner service cancelled");
                let guard = guard.take().expect(in_state);
                return Poll::Ready(Step::Next(releasing_lost(guard, config)));
            }
            return Poll::Pending;
        }
    };
    let mut guard = guard.take().expect(in_state);
    let body_late = body_late
        .as_ref()
        .is_some_and(|late| late.load(Ordering::Relaxed));
    let now = Instant::now();
    // The success rule: a response is only worth passing on if the lease was still ours when
    // it was produced, however late the heartbeat runs.
    let next = if abort_on_loss && guard.over_at(now) {
        tracing::warn!(namespace, "lease ran out before the inner service answered");
        // → ReleasingToRefuse.
        releasing_lost(guard, config)
    } else if body_late {
        let after = config.body_timeout.after();
        tracing::debug!(namespace, ?after, "request body too slow under the lock");
        // → ReleasingToRefuse: the handler's answer to a body that never came whole is
        // replaced by the layer's 408.
        let problem = Problem::from(Reason::BodyTimeout { after });
        releasing_to_refuse(guard, config, problem)
    } else if config.hold_through_body {
        // → Done: the body owns the lease from here on, and nobody may poll it while the
        // client reads slowly, so the heartbeat must run.
        guard.enrol_now(&config.heartbeat);
        let timed = (config.hold_times.clone(), since);
        let answer = response.map(|res| {
            res.map(|body| {
                let timer = config.release_wait.timer().clone();
                let on_loss = config.on_lease_lost;
                LeaseBody::holding(body, guard, on_loss, timer, timed)
            })
        });
        return Poll::Ready(Step::Answer(answer));
    } else {
        config.hold_times.record(now - since);
        // → Releasing: give the lease back before the head goes out.
        let release = FinishOnDrop::release(guard.release());
        let wait = Overdue::new(config.release_wait.timer().clone());
        State::Releasing {
            release,
            wait,
            response: Some(response),
        }
    };
    Poll::Ready(Step::Next(next))
}

/// The state that gives `guard`'s lease back, then answers `problem`.
fn releasing_to_refuse<S, B>(guard: LeaseGuard, config: &Config, problem: Problem) -> State<S, B>
where
    S: Service<Request<TimeoutBody<B>>>,
{
    let release = FinishOnDrop::release(guard.release());
    let wait = Overdue::new(config.release_wait.timer().clone());
    State::ReleasingToRefuse {
        release,
        wait,
        problem,
    }
}

/// The state that gives a lost lease back, then answers `503`.
fn releasing_lost<S, B>(guard: LeaseGuard, config: &Config) -> State<S, B>
where
    S: Service<Request<TimeoutBody<B>>>,
{
    releasing_to_refuse(guard, config, Problem::from(Reason::LeaseLost))
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<TimeoutBody<B>>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
