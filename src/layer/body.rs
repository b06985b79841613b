//! [`LeaseBody`]: the response body of the layer.

use std::error::Error as StdError;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::future::{InFlight, in_flight_release};
use super::lease::LeaseGuard;

/// The error type of [`LeaseBody`]: the inner body's error, boxed, or [`LeaseLostError`].
pub type BoxError = Box<dyn StdError + Send + Sync>;

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
        Inner {
            #[pin]
            body: B,
        },
        Held {
            #[pin]
            body: B,
            // `None` once the body has ended and the release has been started.
            hold: Option<Hold>,
            releasing: Option<InFlight<()>>,
            // The inner body's last frame, returned once the release is done.
            last: Option<Frame<B::Data>>,
        },
        Problem {
            data: Option<Bytes>,
        },
    }
}

/// The lease a body holds, and whether losing it ends the body.
pub(crate) struct Hold {
    pub(crate) guard: LeaseGuard,
    /// `Some` under [`LeaseLost::Abort`](crate::LeaseLost::Abort).
    pub(crate) abort_on: Option<Pin<Box<WaitForCancellationFutureOwned>>>,
}

impl<B: Body> LeaseBody<B> {
    pub(crate) fn inner(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
        }
    }

    pub(crate) fn held(body: B, hold: Hold) -> Self {
        Self {
            kind: Kind::Held {
                body,
                hold: Some(hold),
                releasing: None,
                last: None,
            },
        }
    }

    pub(crate) fn problem(data: Bytes) -> Self {
        Self {
            kind: Kind::Problem { data: Some(data) },
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
            KindProj::Held {
                mut body,
                hold,
                releasing,
                last,
            } => loop {
                if let Some(release) = releasing {
                    // Answer the end of the body only once the lease is given back, so the
                    // client's next request finds the lock free.
                    ready!(Pin::new(release).poll(cx));
                    *releasing = None;
                    return Poll::Ready(last.take().map(Ok));
                }
                let Some(held) = hold else {
                    return Poll::Ready(None);
                };
                if let Some(lost) = &mut held.abort_on
                    && lost.as_mut().poll(cx).is_ready()
                {
                    // Truncate rather than finish a response whose lease is gone; the dropped
                    // guard releases in the background.
                    *hold = None;
                    return Poll::Ready(Some(Err(Box::new(LeaseLostError(())))));
                }
                match ready!(body.as_mut().poll_frame(cx)) {
                    Some(Ok(frame)) if !body.is_end_stream() => {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    // The last frame: a server that knows the length may not poll again, and
                    // the client has the whole response as soon as it is written.
                    Some(Ok(frame)) => *last = Some(frame),
                    None => {}
                    Some(Err(error)) => {
                        *hold = None;
                        return Poll::Ready(Some(Err(error.into())));
                    }
                }
                let guard = hold.take().expect("checked above").guard;
                *releasing = Some(in_flight_release(guard.release()));
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Problem { data } => data.is_none(),
            // Holding a lease, claim more is coming even if the inner body has ended, so the
            // server polls once more and the release is awaited there.
            Kind::Held {
                hold, releasing, ..
            } => hold.is_none() && releasing.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } | Kind::Held { body, .. } => body.size_hint(),
            Kind::Problem { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

impl<B: Body> fmt::Debug for LeaseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "Inner",
            Kind::Held { .. } => "Held",
            Kind::Problem { .. } => "Problem",
        };
        f.debug_struct("LeaseBody")
            .field("kind", &kind)
            .finish_non_exhaustive()
    }
}

/// The error a body streamed under
/// [`hold_through_body`](crate::LockLayer::hold_through_body) ends with when its lease is lost
/// under [`LeaseLost::Abort`](crate::LeaseLost::Abort).
#[derive(Debug)]
pub struct LeaseLostError(());

impl fmt::Display for LeaseLostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the lease was lost while the response body was streaming")
    }
}

impl StdError for LeaseLostError {}
