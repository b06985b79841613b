//! [`IdempotencyLayer`]: the layer and its options, and [`Unscoped`], its default scope.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use tower_layer::Layer;

use super::Idempotency;
use super::config::{
    Config, DEFAULT_BODY_TIMEOUT, DEFAULT_COMPLETE_WITHIN, DEFAULT_MAX_BODY, DEFAULT_MAX_RESPONSE,
};
use super::key::fingerprint::Fingerprint;
use super::service::IdempotencyService;
use crate::Store;
use crate::coarse_timer::CoarseTimer;
use crate::layer::extract::ExtractName;
use crate::rejection::{OnRejection, Renderer};
use crate::store::heartbeat::HeartbeatTiming;

/// The default scope of an [`IdempotencyLayer`]: every key is unique in the whole namespace.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct Unscoped;

impl<B> ExtractName<B> for Unscoped {
    type Name = Vec<u8>;

    fn extract(&self, _: &Request<B>) -> Option<Vec<u8>> {
        None
    }
}

/// Makes a retried request the same request: the first with an `Idempotency-Key` runs, its
/// response is stored, and every retry with that key gets the stored response. See the
/// [module docs](crate::idempotency) for the HTTP contract.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::post};
/// use tower_lease::{Idempotency, IdempotencyLayer, Store};
///
/// const PAYMENTS: Idempotency = Idempotency::new("payments", Duration::from_secs(24 * 3600));
///
/// async fn pay() -> &'static str { "charged" }
///
/// let app: Router = Router::new()
///     .route("/payments", post(pay))
///     .route_layer(IdempotencyLayer::new(Store::memory(), PAYMENTS).require_key());
/// ```
#[derive(Clone)]
pub struct IdempotencyLayer<E = Unscoped> {
    // Shared: `Layer::layer` (which axum calls per request for an app not yet given its state)
    // clones an `Arc`, not the whole configuration.
    config: Arc<Config>,
    scope: E,
}

impl IdempotencyLayer {
    /// A layer that keeps the keys of `idempotency` in `store`.
    pub fn new(store: Store, idempotency: Idempotency) -> Self {
        let timing = HeartbeatTiming::for_ttl(idempotency.definition.ttl);
        let config = Config {
            store,
            idempotency,
            require_key: false,
            fingerprint: Fingerprint::Bytes,
            max_wait: Duration::ZERO,
            max_body: DEFAULT_MAX_BODY,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            max_response: DEFAULT_MAX_RESPONSE,
            complete_within: DEFAULT_COMPLETE_WITHIN,
            background: Default::default(),
            renderer: Renderer::default(),
            timing,
            first_beat_timer: CoarseTimer::new(timing.every),
            replays: Arc::default(),
        };
        Self {
            config: Arc::new(config),
            scope: Unscoped,
        }
    }
}

impl<E> IdempotencyLayer<E> {
    /// Answers `400 Bad Request` (`urn:tower-lease:idempotency-key-missing`) to a request
    /// without an `Idempotency-Key`, instead of running it as usual.
    pub fn require_key(mut self) -> Self {
        Arc::make_mut(&mut self.config).require_key = true;
        self
    }

    /// How a request body counts in the fingerprint a retry must match:
    /// [`Fingerprint::Bytes`] (the default), every byte, or [`Fingerprint::Json`], a JSON
    /// body by its meaning, so a retry whose client re-serialised the same JSON (other spacing,
    /// another member order) is answered with the stored response instead of `422` key
    /// reused. The method and the path with its query always count as they are.
    ///
    /// Replicas that share keys need the same setting: a record stored under one is another
    /// request to the other, unless the body is the same bytes, or JSON in the canonical form
    /// (no whitespace, members sorted by name, strings escaped only where they must be).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_lease::{Fingerprint, Idempotency, IdempotencyLayer, Store};
    ///
    /// const ORDERS: Idempotency = Idempotency::new("orders", Duration::from_secs(3600));
    ///
    /// let layer = IdempotencyLayer::new(Store::memory(), ORDERS).fingerprint(Fingerprint::Json);
    /// ```
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        Arc::make_mut(&mut self.config).fingerprint = fingerprint;
        self
    }

    /// Makes keys unique per scope: the name `extractor` finds in a request (a tenant or user
    /// header, say, as [`extract::header`](crate::extract::header) reads it). The same key in
    /// two scopes names two requests. A request whose extractor finds nothing is in the
    /// default scope, the whole namespace; a scope over
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes makes the key invalid (`400`).
    pub fn scope<F>(self, extractor: F) -> IdempotencyLayer<F> {
        IdempotencyLayer {
            config: self.config,
            scope: extractor,
        }
    }

    /// Lets a retry that comes while the first request runs wait up to `wait` for it, and
    /// answer with its response, instead of `409` at once. On a store with release
    /// notifications (a Redis store made by `connect` or `connect_cluster`,
    /// `tower-lease-postgres`'s `PgStore`) the completion wakes it, and it looks again at
    /// least every second; on other stores it looks again every 10 ms at first, then every
    /// 100 ms ([module docs](crate::idempotency#waiting)).
    pub fn max_wait(mut self, wait: Duration) -> Self {
        Arc::make_mut(&mut self.config).max_wait = wait;
        self
    }

    /// The most request body bytes read for the fingerprint (default 1 MiB): a longer body
    /// gets `413 Payload Too Large` before anything is reserved.
    pub fn max_body(mut self, bytes: usize) -> Self {
        Arc::make_mut(&mut self.config).max_body = bytes;
        self
    }

    /// How long the request body may take to arrive (default 10 s): a slower one gets
    /// `408 Request Timeout` before anything is reserved.
    pub fn body_timeout(mut self, timeout: Duration) -> Self {
        Arc::make_mut(&mut self.config).body_timeout = timeout;
        self
    }

    /// The largest response body stored for replay (default 1 MiB). A response with a longer
    /// body (or one that breaks off, or ends with trailers) reaches its first client whole,
    /// and leaves a marker: its retries get `410 Gone`
    /// (`urn:tower-lease:idempotency-not-stored`), never a second run.
    pub fn max_response(mut self, bytes: usize) -> Self {
        Arc::make_mut(&mut self.config).max_response = bytes;
        self
    }

    /// How long the first request's response waits for its record to be stored (default
    /// 10 s). No response goes out before its record is stored (and acknowledged by the
    /// replicas a [`wait_for_replicas`](crate::RedisStore::wait_for_replicas) store waits
    /// for): while storing fails, the reservation is kept and the completion tried again.
    /// After `within`, the client gets `503` `urn:tower-lease:idempotency-outcome-unknown`
    /// with `Retry-After`, and the layer goes on trying in the background while it lives (at
    /// most for the retention): once stored, retries replay the response.
    pub fn complete_within(mut self, within: Duration) -> Self {
        Arc::make_mut(&mut self.config).complete_within = within;
        self
    }

    /// Renders the layer's refusals (`400`, `409`, `410`, `422`, `413`, `408`, `503`) with
    /// `hook`, as [`LockLayer::on_rejection`](crate::LockLayer::on_rejection) does.
    pub fn on_rejection<M: 'static>(mut self, hook: impl OnRejection<M>) -> Self {
        Arc::make_mut(&mut self.config).renderer = Renderer::new(hook);
        self
    }
}

impl<S, E: Clone> Layer<S> for IdempotencyLayer<E> {
    type Service = IdempotencyService<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        IdempotencyService::new(inner, self.config.clone(), self.scope.clone())
    }
}

impl<E> fmt::Debug for IdempotencyLayer<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyLayer")
            .field("idempotency", &self.config.idempotency)
            .field("require_key", &self.config.require_key)
            .field("fingerprint", &self.config.fingerprint)
            .field("max_wait", &self.config.max_wait)
            .field("max_body", &self.config.max_body)
            .field("max_response", &self.config.max_response)
            .field("complete_within", &self.config.complete_within)
            .finish_non_exhaustive()
    }
}
