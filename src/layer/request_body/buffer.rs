//! [`BufferBody`]: reads a request's whole body before the lock is taken, for layers built
//! with [`buffer_body`](crate::LockLayer::buffer_body).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use pin_project_lite::pin_project;
use tokio::time::error::Elapsed;
use tower_service::Service;

use crate::backend::BoxFuture;
use crate::layer::body::LeaseBody;
use crate::layer::options::config::Config;
use crate::rejection::{BoxError, Problem, Reason};

/// The body policy of a layer that hands the request body to the inner service as it streams
/// in, taking the lock before the body is read: the default.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct Streamed;

/// The body policy of a layer built with [`buffer_body`](crate::LockLayer::buffer_body): the
/// whole body is read before the lock is taken.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct Buffered;

/// The middleware a [`Buffered`] layer makes: reads the whole request body (up to the layer's
/// limit and within its `body_timeout`), then calls the locking service `T` with the body in
/// memory.
#[derive(Clone)]
pub struct BufferBody<T> {
    inner: T,
    config: Arc<Config>,
}

impl<T> BufferBody<T> {
    pub(crate) fn new(inner: T, config: Arc<Config>) -> Self {
        Self { inner, config }
    }

    /// The locking service inside.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }

    /// The locking service inside, mutably.
    pub fn get_mut(&mut self) -> &mut T {
        &mut self.inner
    }

    /// Unwraps the locking service.
    pub fn into_inner(self) -> T {
        self.inner
    }
}

impl<T: fmt::Debug> fmt::Debug for BufferBody<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferBody")
            .field("inner", &self.inner)
            .field("limit", &self.config.body_limit)
            .field("timeout", &self.config.body_timeout.after())
            .finish()
    }
}

/// The body read whole, or why not: too long or unreadable (`Err`), or not in time (`Elapsed`).
type Read = Result<Result<Bytes, BoxError>, Elapsed>;

impl<T, B, ResBody> Service<Request<B>> for BufferBody<T>
where
    T: Service<Request<B>, Response = Response<LeaseBody<ResBody>>> + Clone,
    B: Body + From<Bytes> + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    ResBody: Body,
{
    type Response = T::Response;
    type Error = T::Error;
    type Future = BufferFuture<T, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // The clone may not be ready; the one `poll_ready` readied waits for the body.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = self.config.clone();
        let limit = config.body_limit;
        let (parts, body) = req.into_parts();
        // A declared length over the limit is refused before a byte is read.
        if body.size_hint().lower() > limit as u64 {
            let problem = Problem::from(Reason::BodyTooLarge { limit });
            let state = BufferState::Refusing { problem };
            return BufferFuture { state, config };
        }
        let read = async move {
            let collected = Limited::new(body, limit).collect().await;
            collected.map(|body| body.to_bytes())
        };
        let read = Box::pin(tokio::time::timeout(config.body_timeout.after(), read));
        let state = BufferState::Reading { read, parts, inner };
        BufferFuture { state, config }
    }
}

pin_project! {
    /// The response future of [`BufferBody`].
    pub struct BufferFuture<T, B>
    where
        T: Service<Request<B>>,
    {
        #[pin]
        state: BufferState<T, B>,
        config: Arc<Config>,
    }
}

pin_project! {
    #[project = BufferStateProj]
    #[project_replace = BufferStateOwned]
    enum BufferState<T, B>
    where
        T: Service<Request<B>>,
    {
        // Reading the body; the readied locking service and the request head wait with it.
        Reading {
            read: BoxFuture<'static, Read>,
            parts: Parts,
            inner: T,
        },
        // The locking service runs on the request with its body in memory.
        Calling {
            #[pin]
            call: T::Future,
        },
        // The layer answers by itself.
        Refusing {
            problem: Problem,
        },
        Done,
    }
}

impl<T, B, ResBody> Future for BufferFuture<T, B>
where
    T: Service<Request<B>, Response = Response<LeaseBody<ResBody>>>,
    B: From<Bytes>,
    ResBody: Body,
{
    type Output = Result<T::Response, T::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let mut this = self.as_mut().project();
            let config: &Config = this.config;
            let namespace = config.definition.namespace;
            match this.state.as_mut().project() {
                BufferStateProj::Reading { read, .. } => {
                    let read = ready!(read.as_mut().poll(cx));
                    let BufferStateOwned::Reading {
                        parts, mut inner, ..
                    } = this.state.as_mut().project_replace(BufferState::Done)
                    else {
                        unreachable!("in the Reading state")
                    };
                    let next = match read {
                        // Reading → Calling.
                        Ok(Ok(bytes)) => {
                            let call = inner.call(Request::from_parts(parts, B::from(bytes)));
                            BufferState::Calling { call }
                        }
                        // Reading → Refusing: longer than the limit.
                        Ok(Err(error)) if error.is::<LengthLimitError>() => {
                            let limit = config.body_limit;
                            tracing::debug!(namespace, limit, "request body too large");
                            let problem = Problem::from(Reason::BodyTooLarge { limit });
                            BufferState::Refusing { problem }
                        }
                        // Reading → Refusing: the body broke off (the client went away, or
                        // sent a malformed chunk).
                        Ok(Err(error)) => {
                            tracing::debug!(namespace, %error, "request body unreadable");
                            let problem = Problem::from(Reason::BodyUnreadable);
                            BufferState::Refusing { problem }
                        }
                        // Reading → Refusing: not in time.
                        Err(_elapsed) => {
                            let after = config.body_timeout.after();
                            tracing::debug!(namespace, ?after, "request body too slow");
                            let problem = Problem::from(Reason::BodyTimeout { after });
                            BufferState::Refusing { problem }
                        }
                    };
                    this.state.set(next);
                }
                BufferStateProj::Calling { call } => {
                    let response = ready!(call.poll(cx));
                    // Calling → Done.
                    this.state.set(BufferState::Done);
                    return Poll::Ready(response);
                }
                BufferStateProj::Refusing { problem } => {
                    let response = config.refuse(*problem);
                    // Refusing → Done.
                    this.state.set(BufferState::Done);
                    return Poll::Ready(Ok(response));
                }
                BufferStateProj::Done => panic!("BufferFuture polled after completion"),
            }
        }
    }
}

impl<T, B> fmt::Debug for BufferFuture<T, B>
where
    T: Service<Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferFuture").finish_non_exhaustive()
    }
}
