//! The states of a [`ResponseFuture`](super::ResponseFuture), and the turns that move it
//! from one to the next: the acquisition's answer, the inner service under the lease, the
//! release before the answer.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tower_service::Service;

use crate::coarse_timer::Overdue;
use crate::definition::attempt::Attempt;
use crate::layer::body::LeaseBody;
use crate::layer::hold::guard::{Guarded, LeaseGuard};
use crate::layer::hold::lease_lost::LeaseLost;
use crate::layer::options::config::Config;
use crate::layer::request_body::timeout_body::TimeoutBody;
use crate::lease::finish_on_drop::FinishOnDrop;
use crate::rejection::{Problem, Reason};

pin_project! {
    // The fields a transition moves on are `Option`s taken out of the state, rather than the
    // state moved out whole with `project_replace`: that copies the whole state (as large as
    // the inner future plus the guard) in and out several times per request.
    #[project = StateProj]
    pub(super) enum State<S, B>
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
            // The longest `Retry-After` a refusal may say, if shorter than the holds' estimate.
            retry_within: Option<Duration>,
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

/// The request under `guard`: its lease in the extensions, its body under the layer's body timeout
/// from now on (so a trickling client cannot hold the lock), and `inner` called.
pub(super) fn locked<S, B>(
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

/// Where a turn of a state ends: in the next state, or with the answer.
pub(super) enum Step<S, B, ResBody>
where
    S: Service<Request<TimeoutBody<B>>>,
    ResBody: http_body::Body,
{
    Next(State<S, B>),
    Answer(Result<Response<LeaseBody<ResBody>>, S::Error>),
}

/// The state after the acquisition's `attempt`: the request under its lease, the layer's
/// refusal, or (failing open) the request without one.
pub(super) fn acquired<S, B>(
    attempt: Guarded,
    mut inner: S,
    req: Request<B>,
    full_at: Option<u32>,
    retry_within: Option<Duration>,
    config: &Config,
) -> State<S, B>
where
    S: Service<Request<TimeoutBody<B>>>,
    B: http_body::Body,
{
    let namespace = config.definition.namespace;
    match attempt {
        Ok(Attempt::Acquired(guard)) => locked(guard, config, &mut inner, req),
        // Someone else holds it, or every permit is taken.
        Ok(Attempt::Busy { retry_after: lease }) => {
            // The holder extends its lease while it works, so the lease says "about a TTL"
            // whatever the work; the holds seen lately say more.
            let retry_after = config.hold_times.expected_wait(lease);
            let retry_after = retry_within.map_or(retry_after, |most| retry_after.min(most));
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
pub(super) fn poll_locked<S, B, ResBody>(
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
    let namespace = config.definition.namespace;
    let in_state = "taken once, on leaving the Locked state";
    let abort_on_loss = config.on_lease_lost == LeaseLost::Abort;
    let held = guard.as_mut().expect(in_state);
    // Before every poll of the work: a process frozen past its lease (SIGSTOP, a pause, a
    // starved executor) must not take the work's next step when it wakes, whether or not the
    // heartbeat has run since. `None`: the lease is lost.
    let response = if abort_on_loss && held.over_at(Instant::now()) {
        None
    } else {
        match inner.poll(cx) {
            Poll::Ready(response) => Some(response),
            Poll::Pending => {
                held.poll_first_beat(cx, &config.heartbeat, config.beat.first_beat_timer());
                if !(abort_on_loss && held.poll_lost(cx).is_ready()) {
                    return Poll::Pending;
                }
                // The lease ended while the work waited.
                None
            }
        }
    };
    let Some(response) = response else {
        tracing::warn!(namespace, "lease lost, inner service cancelled");
        // → ReleasingToRefuse: replacing the state drops the inner future, which cancels the
        // handler before the release is sent (when first polled).
        let guard = guard.take().expect(in_state);
        return Poll::Ready(Step::Next(releasing_lost(guard, config)));
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
                let timer = config.max_release_wait.timer().clone();
                let on_loss = config.on_lease_lost;
                LeaseBody::holding(body, guard, on_loss, timer, timed)
            })
        });
        return Poll::Ready(Step::Answer(answer));
    } else {
        config.hold_times.record(now - since);
        // → Releasing: give the lease back before the head goes out.
        let release = FinishOnDrop::release(guard.release());
        let wait = Overdue::new(config.max_release_wait.timer().clone());
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
    let wait = Overdue::new(config.max_release_wait.timer().clone());
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
