//! [`LockLayer`] and [`RwLockLayer`], and the options they share.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tower_layer::Layer;

use super::extract::SafeMethods;
use super::heartbeat::{Heartbeat, HeartbeatTiming};
use super::lease::LeaseLost;
use super::service::{Access, LockService};
use crate::lock::Spec;
use crate::{Lock, RwLock, Store};

/// How long a response waits for its release by default: a healthy store answers in a round
/// trip, far sooner; a failing one must not hold a finished response for its whole deadline.
const DEFAULT_RELEASE_WAIT: Duration = Duration::from_millis(250);

/// What the layer does, shared by every service and future it makes.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) store: Store,
    pub(crate) spec: Spec,
    pub(crate) held_status: StatusCode,
    pub(crate) fail_open: bool,
    pub(crate) timing: HeartbeatTiming,
    /// The heartbeat of this layer's leases, shared by every service it makes.
    pub(crate) heartbeat: Heartbeat,
    pub(crate) on_lease_lost: LeaseLost,
    pub(crate) hold_through_body: bool,
    pub(crate) binary_names: bool,
    pub(crate) require_name: bool,
    /// How long the response waits for the release before it goes out anyway.
    pub(crate) release_wait: Duration,
}

impl Config {
    fn new(store: Store, spec: Spec) -> Self {
        Self {
            store,
            spec,
            held_status: StatusCode::CONFLICT,
            fail_open: false,
            timing: HeartbeatTiming {
                every: spec.ttl / 3,
                max_hold: None,
            },
            heartbeat: Heartbeat::default(),
            on_lease_lost: LeaseLost::Abort,
            hold_through_body: false,
            binary_names: false,
            require_name: false,
            release_wait: DEFAULT_RELEASE_WAIT,
        }
    }
}

/// Guards each request with an exclusive [`Lock`] on the name its extractor picks.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::post};
/// use tower_lease::{Lock, LockLayer, Store, extract};
///
/// const INVOICE_LOCK: Lock<str> = Lock::new("invoice", Duration::from_secs(30));
///
/// async fn finalize() -> &'static str { "finalized" }
///
/// let store = Store::memory();
/// let app: Router = Router::new()
///     .route("/invoices/{id}/finalize", post(finalize))
///     .route_layer(LockLayer::new(store, INVOICE_LOCK, extract::path_segment(1)));
/// ```
///
/// See the [module docs](crate::layer) for the behaviour and the responses it makes.
#[derive(Clone)]
pub struct LockLayer<E> {
    config: Config,
    extractor: E,
}

impl<E> LockLayer<E> {
    /// A layer that takes `lock` in `store` on the name `extractor` picks from each request.
    ///
    /// The lock may have any name type: `Lock<str>` with an extractor of text, `Lock<u64>` with
    /// one that parses an id, and so on. Names are compared as the bytes [`LockName`](crate::LockName) encodes,
    /// so the extractor should yield `N`'s owned form (`String` for `str`, `u64` for `u64`) for
    /// the layer and direct callers of `lock` to meet on the same names.
    pub fn new<N: ?Sized>(store: Store, lock: Lock<N>, extractor: E) -> Self {
        Self {
            config: Config::new(store, lock.spec()),
            extractor,
        }
    }
}

/// Guards each request with an [`RwLock`] on the name its extractor picks: a shared read
/// lease for `GET`, `HEAD`, `OPTIONS` and `TRACE`, the exclusive write lease otherwise.
///
/// ```
/// use std::time::Duration;
/// use axum::{Router, routing::get};
/// use http::{Method, Request};
/// use tower_lease::{RwLock, RwLockLayer, Store, extract};
///
/// const CATALOG: RwLock<str> = RwLock::new("catalog", Duration::from_secs(10));
///
/// async fn export() -> &'static str { "catalog" }
/// async fn reprice() -> &'static str { "repriced" }
///
/// let layer = RwLockLayer::new(Store::memory(), CATALOG, extract::path_segment(1))
///     // A POST that only searches reads, too.
///     .read_when(|req: &Request<axum::body::Body>| {
///         req.method() == Method::GET || req.uri().path().ends_with("/search")
///     });
/// let app: Router = Router::new()
///     .route("/catalog/{shop}", get(export).put(reprice))
///     .route_layer(layer);
/// ```
#[derive(Clone)]
pub struct RwLockLayer<E, R = SafeMethods> {
    config: Config,
    extractor: E,
    read_when: R,
}

impl<E> RwLockLayer<E> {
    /// A layer that takes `lock` in `store` on the name `extractor` picks from each request.
    ///
    /// As with [`LockLayer::new`], the lock may have any name type `N`, and the extractor
    /// should yield its owned form.
    pub fn new<N: ?Sized>(store: Store, lock: RwLock<N>, extractor: E) -> Self {
        Self {
            config: Config::new(store, lock.spec()),
            extractor,
            read_when: SafeMethods,
        }
    }
}

impl<E, R> RwLockLayer<E, R> {
    /// Decides which requests read with `read_when` instead of by method: a
    /// [`ReadWhen`](crate::extract::ReadWhen), such as a closure `Fn(&Request<B>) -> bool`
    /// that answers `true` for a read.
    pub fn read_when<R2>(self, read_when: R2) -> RwLockLayer<E, R2> {
        RwLockLayer {
            config: self.config,
            extractor: self.extractor,
            read_when,
        }
    }
}

/// The options both layers have, with the same docs.
macro_rules! options {
    ($ty:ident < $($param:ident),* >) => {
        impl<$($param),*> $ty<$($param),*> {
            /// The status of the answer when someone else holds the lock: `409 Conflict` by
            /// default; `StatusCode::LOCKED` (423) is the other common choice.
            ///
            /// # Panics
            ///
            /// If `status` is not a client error (4xx).
            pub fn held_status(mut self, status: StatusCode) -> Self {
                assert!(
                    status.is_client_error(),
                    "tower-lease: held_status must be a 4xx status, got {status}"
                );
                self.config.held_status = status;
                self
            }

            /// Runs requests unlocked when the store fails or does not answer in time, logging
            /// a warning, instead of answering `503 Service Unavailable` with `Retry-After: 1`
            /// (the default, failing closed).
            ///
            /// Use it only where running a request twice at once is an inconvenience, not a
            /// corruption.
            pub fn fail_open(mut self) -> Self {
                self.config.fail_open = true;
                self
            }

            /// How often the heartbeat extends a held lease: a third of the TTL by default, so
            /// two extensions can fail before the lease runs out.
            ///
            /// # Panics
            ///
            /// If `every` is zero or not shorter than the lock's TTL.
            pub fn heartbeat(mut self, every: Duration) -> Self {
                assert!(
                    !every.is_zero() && every < self.config.spec.ttl,
                    "tower-lease: the heartbeat ({every:?}) must be non-zero and shorter than \
                     the TTL ({:?})",
                    self.config.spec.ttl
                );
                self.config.timing.every = every;
                self
            }

            /// Stops extending a lease `max_hold` after it was taken, so a stuck handler cannot
            /// keep the lock forever: the lease then runs out at most one TTL later and counts
            /// as lost (see [`on_lease_lost`](Self::on_lease_lost)). No limit by default.
            pub fn max_hold(mut self, max_hold: Duration) -> Self {
                self.config.timing.max_hold = Some(max_hold);
                self
            }

            /// What to do when a lease is lost while the inner service runs:
            /// [`LeaseLost::Abort`] (the default) drops the inner future and answers `503`;
            /// [`LeaseLost::Continue`] only flags the [`Lease`](crate::Lease).
            pub fn on_lease_lost(mut self, policy: LeaseLost) -> Self {
                self.config.on_lease_lost = policy;
                self
            }

            /// Holds the lease until the response body has ended (end of stream, error, or the
            /// body dropped) instead of releasing it before the response head is returned (the
            /// default). For streaming responses whose body is part of the guarded work.
            ///
            /// The heartbeat keeps the lease alive while the client reads slowly, or not at
            /// all; combine with [`max_hold`](Self::max_hold) to bound that.
            pub fn hold_through_body(mut self) -> Self {
                self.config.hold_through_body = true;
                self
            }

            /// Accepts any bytes as a name (1 to 1024 of them), for extractors that produce
            /// binary names such as raw UUIDs.
            ///
            /// By default the layer answers `400 Bad Request` to a name that is not UTF-8 text,
            /// or that holds a control character (NUL included) or a brace. Such names are safe
            /// for the store, which is binary-safe, but coming from a request they are a client
            /// bug or a probe; control bytes make keys unreadable in `redis-cli`, and a `}`
            /// shortens the cluster hash tag, so crafted names could pile onto one slot.
            pub fn binary_names(mut self) -> Self {
                self.config.binary_names = true;
                self
            }

            /// Answers `400 Bad Request` (problem `urn:tower-lease:missing-lock-name`) when the
            /// extractor finds no name, instead of running the request unlocked (the default).
            ///
            /// Use it where every request on the route must be locked, such as handlers that
            /// take `Extension<Lease>`: without it, a request the extractor answers `None` for
            /// reaches the handler with no [`Lease`](crate::Lease), and axum rejects it with
            /// `500 Missing request extension`. Handlers that also serve unlocked requests take
            /// `Option<Extension<Lease>>` instead.
            pub fn require_name(mut self) -> Self {
                self.config.require_name = true;
                self
            }

            /// How long a finished response waits for its lease's release before it goes out
            /// anyway (250 ms by default); the release then finishes in the background.
            ///
            /// A healthy store answers the release in a round trip, so the client's next
            /// request finds the lock free. A failing one would otherwise hold every finished
            /// response for the store's whole deadline; the lease's TTL frees the lock if the
            /// release never lands.
            pub fn release_wait(mut self, wait: Duration) -> Self {
                self.config.release_wait = wait;
                self
            }
        }
    };
}

options!(LockLayer<E>);
options!(RwLockLayer<E, R>);

impl<S, E: Clone> Layer<S> for LockLayer<E> {
    type Service = LockService<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        LockService::new(
            inner,
            Arc::new(self.config.clone()),
            self.extractor.clone(),
            Access::Exclusive,
        )
    }
}

impl<S, E: Clone, R: Clone> Layer<S> for RwLockLayer<E, R> {
    type Service = LockService<S, E, R>;

    fn layer(&self, inner: S) -> Self::Service {
        LockService::new(
            inner,
            Arc::new(self.config.clone()),
            self.extractor.clone(),
            Access::ReadWrite(self.read_when.clone()),
        )
    }
}

impl<E> fmt::Debug for LockLayer<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<E, R> fmt::Debug for RwLockLayer<E, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLockLayer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
