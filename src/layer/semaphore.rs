//! [`SemaphoreLayer`]: at most K requests per name at once, across every replica.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use http::StatusCode;
use tower_layer::Layer;

use super::options::config::Config;
use super::per_request::{SafeMethods, SemaphorePermits};
use super::request_body::buffer::{BufferBody, Buffered, Streamed};
use super::service::{Access, LeaseService};
use crate::{Semaphore, Store};

/// Caps the requests running at once per name, across every replica that shares the store:
/// each request holds one permit of a [`Semaphore`] on the name its extractor picks.
///
/// tower's `ConcurrencyLimit` caps one process; this caps a key (a tenant, a partner API, a
/// section of seats) everywhere. A request that finds every permit taken gets
/// `429 Too Many Requests` ([`full_status`](Self::full_status) to change it) with `Retry-After`
/// from the earliest live permit, and problem `urn:tower-lease:concurrency-limit`. Everything
/// else (heartbeat, success rule, release before the response, waiting, failing open or
/// closed, the [`Lease`](crate::Lease) extension) is as [`LockLayer`](crate::LockLayer) does it.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::post};
/// use http::Request;
/// use tower_lease::{Semaphore, SemaphoreLayer, Store, extract};
///
/// // At most 4 exports at once per tenant, across all replicas.
/// const EXPORTS: Semaphore<str> = Semaphore::new("export", 4, Duration::from_secs(30));
///
/// async fn export() -> &'static str { "exported" }
///
/// let layer = SemaphoreLayer::new(Store::memory(), EXPORTS, extract::header("x-tenant"))
///     // Tenants on the large plan get 16.
///     .permits(|req: &Request<axum::body::Body>| {
///         match req.headers().get("x-plan").map(|plan| plan.as_bytes()) {
///             Some(b"large") => 16,
///             _ => 4,
///         }
///     });
/// let app: Router = Router::new().route("/exports", post(export)).route_layer(layer);
/// ```
///
/// The limit is checked against the permits live when a request arrives: requests of one name
/// with different limits each get in while fewer than their own limit are running.
#[derive(Clone)]
pub struct SemaphoreLayer<E, K = SemaphorePermits, P = Streamed> {
    pub(super) config: Arc<Config>,
    extractor: E,
    permits: K,
    body: PhantomData<fn() -> P>,
}

impl<E> SemaphoreLayer<E> {
    /// A layer that takes a permit of `semaphore` in `store` on the name `extractor` picks
    /// from each request.
    ///
    /// As with [`LockLayer::new`](crate::LockLayer::new), the semaphore may have any name type
    /// `N`, and the extractor should yield its owned form.
    pub fn new<N: ?Sized>(store: Store, semaphore: Semaphore<N>, extractor: E) -> Self {
        let config = Config::new(store, semaphore.definition());
        Self {
            config: Arc::new(config),
            extractor,
            permits: SemaphorePermits,
            body: PhantomData,
        }
    }
}

impl<E, K, P> SemaphoreLayer<E, K, P> {
    /// Gives each request its own limit with `permits`: a
    /// [`PermitsFor`](crate::layer::PermitsFor), such as a closure `Fn(&Request<B>) -> u32`
    /// (a tenant's plan). A request whose limit is 0 gets `400`, problem
    /// `urn:tower-lease:invalid-concurrency-limit`.
    pub fn permits<K2>(self, permits: K2) -> SemaphoreLayer<E, K2, P> {
        SemaphoreLayer {
            config: self.config,
            extractor: self.extractor,
            permits,
            body: PhantomData,
        }
    }

    /// The status of the answer when every permit is taken: `429 Too Many Requests` by
    /// default, which clients that retry by themselves honour; `503` is the other.
    ///
    /// # Panics
    ///
    /// If `status` is neither a client error (4xx) nor `503 Service Unavailable`.
    pub fn full_status(mut self, status: StatusCode) -> Self {
        Arc::make_mut(&mut self.config).taken_status =
            super::options::config::taken_status("full_status", status);
        self
    }

    /// Reads the whole request body before taking a permit; see
    /// [`LockLayer::buffer_body`](crate::LockLayer::buffer_body).
    pub fn buffer_body(mut self, max_bytes: usize) -> SemaphoreLayer<E, K, Buffered> {
        Arc::make_mut(&mut self.config).body_limit = max_bytes;
        SemaphoreLayer {
            config: self.config,
            extractor: self.extractor,
            permits: self.permits,
            body: PhantomData,
        }
    }

    fn service<S>(&self, inner: S) -> LeaseService<S, E, SafeMethods, K>
    where
        E: Clone,
        K: Clone,
    {
        let config = self.config.clone();
        let access = Access::Permits(self.permits.clone());
        LeaseService::new(inner, config, self.extractor.clone(), access)
    }
}

impl<S, E: Clone, K: Clone> Layer<S> for SemaphoreLayer<E, K, Streamed> {
    type Service = LeaseService<S, E, SafeMethods, K>;

    fn layer(&self, inner: S) -> Self::Service {
        self.service(inner)
    }
}

impl<S, E: Clone, K: Clone> Layer<S> for SemaphoreLayer<E, K, Buffered> {
    type Service = BufferBody<LeaseService<S, E, SafeMethods, K>>;

    fn layer(&self, inner: S) -> Self::Service {
        BufferBody::new(self.service(inner), self.config.clone())
    }
}

impl<E, K, P> fmt::Debug for SemaphoreLayer<E, K, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SemaphoreLayer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
