//! [`TimeoutBody`]: the request body as the inner service reads it, with the deadline of a
//! body read under a lock.

use std::error::Error as StdError;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::coarse_timer::{CoarseTimer, Overdue};
use crate::rejection::BoxError;

pin_project! {
    /// The request body the inner service of [`LockLayer`](crate::LockLayer),
    /// [`RwLockLayer`](crate::RwLockLayer) and [`SemaphoreLayer`](crate::SemaphoreLayer)
    /// reads: the client's body, which must have arrived whole within the layer's
    /// [`body_timeout`](crate::LockLayer::body_timeout) (10 s by default) of the lock being
    /// taken.
    ///
    /// A client that trickles its body would otherwise hold the lock for as long as it likes.
    /// Once the deadline has passed, the next read fails with [`BodyTimeoutError`], the
    /// handler ends (axum's body extractors turn the error into a rejection), the lock is
    /// released, and the layer answers `408 Request Timeout` (problem+json) in place of
    /// whatever the handler made of the failed read. Unlike tower-http's `TimeoutBody`, the
    /// deadline is for the whole body, not for each frame. A request that holds no lock (no
    /// name, or run unlocked under `fail_open`) has no deadline.
    ///
    /// axum's router accepts it as it is; a hyper service behind the layer takes
    /// `Request<TimeoutBody<Incoming>>` (or is generic over the body).
    pub struct TimeoutBody<B> {
        #[pin]
        body: B,
        // `None` for a body read without a lock, or one that was already complete.
        deadline: Option<Deadline>,
    }
}

/// The deadline of one body, and where it stands.
struct Deadline {
    at: Instant,
    timer: Arc<CoarseTimer>,
    /// Made the first time the body has nothing to give: a body that arrives at once never
    /// costs a timer.
    wait: Option<Overdue>,
    /// Set when the deadline passed before the body ended; the response future reads it.
    passed: Arc<AtomicBool>,
}

impl<B> TimeoutBody<B> {
    /// `body` without a deadline, as the layer passes on the body of a request that holds no
    /// lock; also for calling a service written for the layer without it (in a test, say).
    pub fn new(body: B) -> Self {
        Self {
            body,
            deadline: None,
        }
    }
}

impl<B: Body> TimeoutBody<B> {
    /// `body`, due within `timeout` from now on `timer`'s clock; also answers the flag that
    /// says the deadline passed first, unless the body is already complete (or the timeout
    /// is too long to reach).
    pub(crate) fn within(
        body: B,
        timeout: Duration,
        timer: &Arc<CoarseTimer>,
    ) -> (Self, Option<Arc<AtomicBool>>) {
        let at = Instant::now().checked_add(timeout);
        let Some(at) = at.filter(|_| !body.is_end_stream()) else {
            return (Self::new(body), None);
        };
        let passed = Arc::new(AtomicBool::new(false));
        let deadline = Some(Deadline {
            at,
            timer: timer.clone(),
            wait: None,
            passed: passed.clone(),
        });
        (Self { body, deadline }, Some(passed))
    }
}

impl<B> Body for TimeoutBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let Some(deadline) = this.deadline.as_mut() else {
            return this.body.poll_frame(cx).map_err(Into::into);
        };
        if deadline.passed.load(Ordering::Relaxed) {
            return Poll::Ready(None);
        }
        // A frame that is there already is not late; only waiting for one past the deadline is.
        if Instant::now() < deadline.at {
            match this.body.as_mut().poll_frame(cx) {
                Poll::Ready(frame) => {
                    if frame.is_none() || this.body.is_end_stream() {
                        // Complete in time: nothing left to bound, and the timer's slot goes.
                        *this.deadline = None;
                    }
                    return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
                }
                Poll::Pending => {
                    let (timer, at) = (&deadline.timer, deadline.at);
                    let wait = deadline
                        .wait
                        .get_or_insert_with(|| Overdue::until(timer.clone(), at));
                    if wait.poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
            }
        }
        deadline.wait = None;
        deadline.passed.store(true, Ordering::Relaxed);
        Poll::Ready(Some(Err(Box::new(BodyTimeoutError(())))))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl<B> fmt::Debug for TimeoutBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimeoutBody")
            .field("deadline", &self.deadline.as_ref().map(|d| d.at))
            .finish_non_exhaustive()
    }
}

/// The error a [`TimeoutBody`] gives once its deadline has passed before the body arrived.
#[derive(Debug)]
pub struct BodyTimeoutError(());

impl fmt::Display for BodyTimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the request body did not arrive in time under the lock")
    }
}

impl StdError for BodyTimeoutError {}
