//! [`LeaseBody`]: the response body of the layer.

use std::error::Error as StdError;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use super::hold::guard::LeaseGuard;
use super::hold::hold_times::HoldTimes;
use super::hold::lease_lost::LeaseLost;
use super::hold::release_wait::poll_release;
use crate::coarse_timer::{CoarseTimer, Overdue};
use crate::lease::finish_on_drop::FinishOnDrop;
use crate::rejection::{BoxError, RejectionBody};

pin_project! {
    /// The response body of [`LockLayer`](crate::LockLayer) and
    /// [`RwLockLayer`](crate::RwLockLayer): the inner service's body, or the small
    /// `application/problem+json` document of a response the layer made itself.
    ///
    /// Under [`hold_through_body`](crate::LockLayer::hold_through_body) it owns the lease and
    /// releases it when the body ends (end of stream or error) or is dropped.
    pub struct LeaseBody<B>
    where
        B: Body,
    {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B>
    where
        B: Body,
    {
        // The inner service's body, its lease already released (or never taken).
        Inner {
            #[pin]
            body: B,
        },
        // The inner service's body, holding the lease until it ends.
        RawLease {
            #[pin]
            body: B,
            lease: BodyLease<B::Data>,
        },
        // The layer's own problem+json document; `None` once it has been handed on.
        Problem {
            data: Option<Bytes>,
        },
        // A refusal rendered by the layer's `on_rejection` hook.
        Rendered {
            #[pin]
            body: RejectionBody,
        },
    }
}

/// Where the lease of a [`Kind::RawLease`] body stands.
enum BodyLease<D> {
    Held {
        guard: LeaseGuard,
        /// What a loss while the body streams does to it.
        on_loss: LeaseLost,
        /// The layer's timer of its `release_wait`.
        release_timer: Arc<CoarseTimer>,
        /// The layer's hold times, and when this hold began.
        timed: (Arc<HoldTimes>, Instant),
    },
    // The body has ended; its last frame (if it had one) waits for the release, for at most
    // the layer's `release_wait`.
    Releasing {
        release: FinishOnDrop<()>,
        wait: Overdue,
        last: Option<Frame<D>>,
        namespace: &'static str,
    },
    // Released, or dropped (which releases in the background) after an error.
    Ended,
}

impl<B: Body> LeaseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    /// `body`, holding the lease of `guard` until it ends; under [`LeaseLost::Abort`] a loss
    /// ends the body with an error. The hold is noted in `timed`'s hold times when the body
    /// ends.
    pub(crate) fn holding(
        body: B,
        guard: LeaseGuard,
        on_loss: LeaseLost,
        release_timer: Arc<CoarseTimer>,
        timed: (Arc<HoldTimes>, Instant),
    ) -> Self {
        let lease = BodyLease::Held {
            guard,
            on_loss,
            release_timer,
            timed,
        };
        Self {
            kind: Kind::RawLease { body, lease },
        }
    }

    pub(crate) fn problem(data: Bytes) -> Self {
        Self {
            kind: Kind::Problem { data: Some(data) },
        }
    }

    pub(crate) fn rendered(body: RejectionBody) -> Self {
        Self {
            kind: Kind::Rendered { body },
        }
    }
}

impl<B> Body for LeaseBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body } => body.poll_frame(cx).map_err(Into::into),
            KindProj::Problem { data } => {
                Poll::Ready(data.take().map(|d| Ok(Frame::data(d.into()))))
            }
            KindProj::Rendered { body } => body
                .poll_frame(cx)
                .map(|frame| frame.map(|frame| frame.map(|f| f.map_data(Into::into)))),
            KindProj::RawLease { mut body, lease } => loop {
                match lease {
                    BodyLease::Held { guard, on_loss, .. } => {
                        // The lease's expiry first, as before every poll of the inner future: a
                        // process frozen past its lease sends no further frame.
                        if *on_loss == LeaseLost::Abort
                            && (guard.over_at(Instant::now()) || guard.poll_lost(cx).is_ready())
                        {
                            // Held → Ended: truncate rather than finish a response whose lease
                            // is gone; the dropped guard releases in the background.
                            *lease = BodyLease::Ended;
                            return Poll::Ready(Some(Err(Box::new(LeaseLostError(())))));
                        }
                        let last = match ready!(body.as_mut().poll_frame(cx)) {
                            Some(Ok(frame)) if !body.is_end_stream() => {
                                return Poll::Ready(Some(Ok(frame)));
                            }
                            // The last frame: a server that knows the length may not poll
                            // again, and the client has the whole response as soon as it is
                            // written.
                            Some(Ok(frame)) => Some(frame),
                            None => None,
                            Some(Err(error)) => {
                                // Held → Ended.
                                *lease = BodyLease::Ended;
                                return Poll::Ready(Some(Err(error.into())));
                            }
                        };
                        // Held → Releasing.
                        let BodyLease::Held {
                            guard,
                            release_timer,
                            timed: (hold_times, since),
                            ..
                        } = std::mem::replace(lease, BodyLease::Ended)
                        else {
                            unreachable!("in the Held state")
                        };
                        hold_times.record(since.elapsed());
                        let namespace = guard.namespace();
                        let release = FinishOnDrop::release(guard.release());
                        let wait = Overdue::new(release_timer);
                        *lease = BodyLease::Releasing {
                            release,
                            wait,
                            last,
                            namespace,
                        };
                    }
                    BodyLease::Releasing {
                        release,
                        wait,
                        last,
                        namespace,
                    } => {
                        // Answer the end of the body only once the lease is given back (or
                        // `release_wait` is over), so the client's next request finds the
                        // lock free.
                        ready!(poll_release(release, wait, cx, namespace));
                        let last = last.take();
                        // Releasing → Ended.
                        *lease = BodyLease::Ended;
                        return Poll::Ready(last.map(Ok));
                    }
                    BodyLease::Ended => return Poll::Ready(None),
                }
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Problem { data } => data.is_none(),
            Kind::Rendered { body } => body.is_end_stream(),
            // RawLease a lease, claim more is coming even if the inner body has ended, so the
            // server polls once more and the release is awaited there.
            Kind::RawLease { lease, .. } => matches!(lease, BodyLease::Ended),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } | Kind::RawLease { body, .. } => body.size_hint(),
            Kind::Problem { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Rendered { body } => body.size_hint(),
        }
    }
}

impl<B: Body> fmt::Debug for LeaseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "Inner",
            Kind::RawLease { .. } => "RawLease",
            Kind::Problem { .. } => "Problem",
            Kind::Rendered { .. } => "Rendered",
        };
        f.debug_struct("LeaseBody")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

/// The error a body streamed under
/// [`hold_through_body`](crate::LockLayer::hold_through_body) ends with when its lease is lost
/// under [`LeaseLost::Abort`].
#[derive(Debug)]
pub struct LeaseLostError(());

impl fmt::Display for LeaseLostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the lease was lost while the response body was streaming")
    }
}

impl StdError for LeaseLostError {}
