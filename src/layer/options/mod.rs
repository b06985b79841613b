//! The options [`LockLayer`], [`RwLockLayer`] and [`SemaphoreLayer`] share, written once.

pub(crate) mod config;
pub(crate) mod timing;

use std::time::Duration;

use http::StatusCode;

use super::hold::lease_lost::LeaseLost;
use super::layer::{LockLayer, RwLockLayer};
use super::semaphore::SemaphoreLayer;
use crate::rejection::{OnRejection, Renderer};

/// The options every layer has, with the same docs.
macro_rules! options {
    ($ty:ident < $($param:ident),* >) => {
        impl<$($param),*> $ty<$($param),*> {
            /// Runs requests unlocked when the store fails or does not answer in time, logging
            /// a warning, instead of answering `503 Service Unavailable` with `Retry-After: 1`
            /// (the default, failing closed).
            ///
            /// Use it only where running a request twice at once is an inconvenience, not a
            /// corruption.
            pub fn fail_open(mut self) -> Self {
                std::sync::Arc::make_mut(&mut self.config).fail_open = true;
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
                    !every.is_zero() && every < self.config.definition.ttl,
                    "tower-lease: the heartbeat ({every:?}) must be non-zero and shorter than \
                     the TTL ({:?})",
                    self.config.definition.ttl
                );
                std::sync::Arc::make_mut(&mut self.config).beat.set_every(every);
                self
            }

            /// Stops extending a lease `max_hold` after it was taken, so a stuck handler cannot
            /// keep the lock forever: the lease then runs out at most one TTL later and counts
            /// as lost (see [`on_lease_lost`](Self::on_lease_lost)). No limit by default.
            pub fn max_hold(mut self, max_hold: Duration) -> Self {
                std::sync::Arc::make_mut(&mut self.config).beat.set_max_hold(max_hold);
                self
            }

            /// What to do when a lease is lost while the inner service runs:
            /// [`LeaseLost::Abort`] (the default) drops the inner future and answers `503`;
            /// [`LeaseLost::Continue`] only flags the [`Lease`](crate::Lease).
            pub fn on_lease_lost(mut self, policy: LeaseLost) -> Self {
                std::sync::Arc::make_mut(&mut self.config).on_lease_lost = policy;
                self
            }

            /// Holds the lease until the response body has ended (end of stream, error, or the
            /// body dropped) instead of releasing it before the response head is returned (the
            /// default). For streaming responses whose body is part of the guarded work.
            ///
            /// The heartbeat keeps the lease alive while the client reads slowly, or not at
            /// all; combine with [`max_hold`](Self::max_hold) to bound that.
            pub fn hold_through_body(mut self) -> Self {
                std::sync::Arc::make_mut(&mut self.config).hold_through_body = true;
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
                std::sync::Arc::make_mut(&mut self.config).binary_names = true;
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
                std::sync::Arc::make_mut(&mut self.config).require_name = true;
                self
            }

            /// Renders the layer's refusals (busy, invalid or missing name, store unavailable,
            /// lease lost, body too large or too slow) with `hook` instead of the default
            /// RFC 9457 `application/problem+json` documents: for an application's own error
            /// format or its own `Retry-After` policy. The hook gets a
            /// [`Rejection`](crate::rejection::Rejection), whose
            /// [`problem_response`](crate::rejection::Rejection::problem_response) is the default.
            pub fn on_rejection<M: 'static>(mut self, hook: impl OnRejection<M>) -> Self {
                std::sync::Arc::make_mut(&mut self.config).renderer = Renderer::new(hook);
                self
            }

            /// Waits up to `wait` for a busy lock (or a free permit) before refusing the
            /// request. By default an [`RwLockLayer`](crate::RwLockLayer) waits up to 2 s (see
            /// its docs), and a [`LockLayer`](crate::LockLayer) and a
            /// [`SemaphoreLayer`](crate::SemaphoreLayer) do not wait; `Duration::ZERO` answers
            /// at once. The request is woken
            /// at once by a release in this process, or in any process when the store has
            /// [release notifications](crate::RedisStore::notifications); at the holder's lease
            /// end; and otherwise by polling with jitter. Within a process the waiters of one name
            /// queue first come, first served, and only the first asks the store. A client that
            /// goes away while waiting leaves nothing behind.
            pub fn max_wait(mut self, wait: Duration) -> Self {
                std::sync::Arc::make_mut(&mut self.config).max_wait = wait;
                self
            }

            /// The most requests of this layer that wait at once (1024 by default); a request
            /// beyond it is answered at once, as without [`max_wait`](Self::max_wait).
            pub fn max_waiters(mut self, max_waiters: usize) -> Self {
                std::sync::Arc::make_mut(&mut self.config).max_waiters = max_waiters;
                self
            }

            /// How long the whole request body may take to arrive (10 s by default), so a
            /// client that trickles its body cannot hold a lock.
            ///
            /// A body streamed to the handler under the lock (the default) must have arrived
            /// within `timeout` of the lock being taken: the handler's next read then fails
            /// with [`BodyTimeoutError`](crate::layer::BodyTimeoutError), the lock is released,
            /// and the layer answers `408 Request Timeout` (see
            /// [`TimeoutBody`](crate::layer::TimeoutBody)). Under
            /// [`buffer_body`](Self::buffer_body) the body must arrive within `timeout` before
            /// the lock is taken, or the answer is `408` without locking. `Duration::MAX`
            /// turns the timeout off.
            pub fn body_timeout(mut self, timeout: Duration) -> Self {
                std::sync::Arc::make_mut(&mut self.config).body_timeout = super::options::timing::Limit::new(timeout);
                self
            }

            /// How long a finished response waits for its lease's release before it goes out
            /// anyway (250 ms by default); the release then finishes in the background.
            ///
            /// A healthy store answers the release in a round trip, so the client's next
            /// request finds the lock free. A failing one would otherwise hold every finished
            /// response for the store's whole timeout; the lease's TTL frees the lock if the
            /// release never lands.
            pub fn max_release_wait(mut self, wait: Duration) -> Self {
                std::sync::Arc::make_mut(&mut self.config).max_release_wait = super::options::timing::Limit::new(wait);
                self
            }
        }
    };
}

options!(LockLayer<E, P>);
options!(RwLockLayer<E, R, P>);
options!(SemaphoreLayer<E, K, P>);

/// `busy_status`, for the layers whose refusal means "busy" (a semaphore's means "full").
macro_rules! busy_status {
    ($ty:ident < $($param:ident),* >) => {
        impl<$($param),*> $ty<$($param),*> {
            /// The status of the answer when someone else holds the lock: `409 Conflict` by
            /// default. Clients that retry by themselves (urllib3's `Retry`, `reqwest-retry`)
            /// leave a `409` to the user; `StatusCode::SERVICE_UNAVAILABLE` (503) or
            /// `StatusCode::TOO_MANY_REQUESTS` (429) makes them wait the `Retry-After` and try
            /// again. `StatusCode::LOCKED` (423) is the WebDAV choice.
            ///
            /// # Panics
            ///
            /// If `status` is neither a client error (4xx) nor `503 Service Unavailable`.
            pub fn busy_status(mut self, status: StatusCode) -> Self {
                std::sync::Arc::make_mut(&mut self.config).taken_status = super::options::config::taken_status("busy_status", status);
                self
            }
        }
    };
}

busy_status!(LockLayer<E, P>);
busy_status!(RwLockLayer<E, R, P>);
