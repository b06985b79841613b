//! [`ResponseFuture`]: the response future of [`IdempotencyService`](super::IdempotencyService).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Response;

use super::body::IdempotentBody;
use crate::backend::BoxFuture;

/// The response future of [`IdempotencyService`](super::IdempotencyService).
///
/// One allocation per request: the request goes through a store round trip (or two) anyway,
/// next to which a box costs nothing that shows.
#[must_use = "futures do nothing unless polled"]
pub struct ResponseFuture<B, E> {
    inner: BoxFuture<'static, Result<Response<IdempotentBody<B>>, E>>,
}

impl<B, E> ResponseFuture<B, E> {
    pub(crate) fn new(
        inner: impl Future<Output = Result<Response<IdempotentBody<B>>, E>> + Send + 'static,
    ) -> Self {
        Self {
            inner: Box::pin(inner),
        }
    }
}

impl<B, E> Future for ResponseFuture<B, E> {
    type Output = Result<Response<IdempotentBody<B>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<B, E> fmt::Debug for ResponseFuture<B, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
