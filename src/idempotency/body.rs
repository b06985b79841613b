//! [`IdempotentBody`]: the response body of [`IdempotencyLayer`](super::IdempotencyLayer).

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::rejection::{BoxError, RejectionBody};

pin_project! {
    /// The response body of [`IdempotencyLayer`](super::IdempotencyLayer): the inner
    /// service's body (after the part the layer read to store it, if any), a stored or read
    /// response in memory, or a refusal.
    pub struct IdempotentBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        // What the layer read of the inner body, then its trailers or error if it met them,
        // then the rest of it.
        Inner {
            prefix: Option<Bytes>,
            trailers: Option<HeaderMap>,
            error: Option<BoxError>,
            #[pin]
            rest: Option<B>,
        },
        // A refusal, rendered by the layer's hook or as problem+json.
        Rendered {
            #[pin]
            body: RejectionBody,
        },
    }
}

impl<B> IdempotentBody<B> {
    /// The inner body, untouched.
    pub(crate) fn inner(body: B) -> Self {
        Self::read(Bytes::new(), None, None, Some(body))
    }

    /// A body wholly in memory.
    pub(crate) fn full(data: Bytes) -> Self {
        Self::read(data, None, None, None)
    }

    /// `prefix` (read by the layer), then `trailers` or `error` if the read met them, then
    /// `rest` if the body goes on.
    pub(crate) fn read(
        prefix: Bytes,
        trailers: Option<HeaderMap>,
        error: Option<BoxError>,
        rest: Option<B>,
    ) -> Self {
        let prefix = (!prefix.is_empty()).then_some(prefix);
        Self {
            kind: Kind::Inner {
                prefix,
                trailers,
                error,
                rest,
            },
        }
    }

    pub(crate) fn rendered(body: RejectionBody) -> Self {
        Self {
            kind: Kind::Rendered { body },
        }
    }
}

impl<B> Body for IdempotentBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.project().kind.project() {
            KindProj::Inner {
                prefix,
                trailers,
                error,
                rest,
            } => {
                if let Some(data) = prefix.take() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                if let Some(trailers) = trailers.take() {
                    return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
                }
                if let Some(error) = error.take() {
                    return Poll::Ready(Some(Err(error)));
                }
                match rest.as_pin_mut() {
                    Some(rest) => rest.poll_frame(cx).map_err(Into::into),
                    None => Poll::Ready(None),
                }
            }
            KindProj::Rendered { body } => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner {
                prefix,
                trailers,
                error,
                rest,
            } => {
                prefix.is_none()
                    && trailers.is_none()
                    && error.is_none()
                    && rest.as_ref().is_none_or(Body::is_end_stream)
            }
            Kind::Rendered { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner {
                prefix,
                trailers,
                error,
                rest,
            } => {
                let read = prefix.as_ref().map_or(0, |p| p.len() as u64);
                let mut hint = rest
                    .as_ref()
                    .map_or_else(|| SizeHint::with_exact(0), B::size_hint);
                if trailers.is_some() || error.is_some() {
                    hint = SizeHint::with_exact(0);
                }
                let mut total = SizeHint::new();
                total.set_lower(hint.lower() + read);
                if let Some(upper) = hint.upper() {
                    total.set_upper(upper + read);
                }
                total
            }
            Kind::Rendered { body } => body.size_hint(),
        }
    }
}

impl<B> fmt::Debug for IdempotentBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { rest: None, .. } => "Full",
            Kind::Inner { .. } => "Inner",
            Kind::Rendered { .. } => "Rendered",
        };
        f.debug_tuple("IdempotentBody").field(&kind).finish()
    }
}
