//! Tower middleware that runs each request under a lease: [`LockLayer`] and [`RwLockLayer`].
//!
//! For each request the layer asks its extractor ([`ExtractName`]) for a lock name, tries the
//! lease once (no waiting), and then:
//!
//! | outcome | what the client gets |
//! |---|---|
//! | extractor answers `None` | the inner service's response, unlocked |
//! | name empty or over 1024 bytes | `400`, problem+json |
//! | lock held by someone else | `409` (or [`held_status`](LockLayer::held_status)), `Retry-After`, problem+json |
//! | store failed or timed out | `503`, `Retry-After: 1`, problem+json (or the inner response, with [`fail_open`](LockLayer::fail_open)) |
//! | acquired | the inner service's response, the lease released before it is returned |
//! | lease lost while running | `503`, problem+json (or the inner response, with [`LeaseLost::Continue`]) |
//!
//! Every store call has a deadline ([`RedisStore::timeout`](crate::RedisStore::timeout), 1 s
//! by default), so when Redis is down or blackholed a request gets its `503` within about that
//! deadline, never hangs.
//!
//! Problem bodies follow RFC 9457 (`type`, `title`, `status`, `detail`, plus the lock's
//! `namespace`) and never contain a lease token. `Retry-After` is the holder's remaining lease in
//! whole seconds, rounded up, at least 1.
//!
//! # The lease while the request runs
//!
//! An acquired request carries a [`Lease`] extension. The layer's heartbeat, one task on the
//! tokio runtime for all the leases of a layer, extends it every third of the TTL
//! ([`heartbeat`](LockLayer::heartbeat)) whether or not the server polls the response, sending
//! the extensions that fall due together as one batch (one pipeline on Redis), and retries
//! failed extensions until the lease would run out. The task runs only while the layer holds
//! leases past their first beat; most requests end before that and never touch it. The lease counts as lost when the store says it is no longer ours or no
//! extension was confirmed in time. Validity is judged on the monotonic clock from the moment
//! each confirmed command was *sent*, minus a drift margin of 1 % of the TTL + 2 ms.
//!
//! Under the default [`LeaseLost::Abort`], a lost lease drops the inner future and answers
//! `503`, and a response produced after the lease's validity ended is replaced by `503` too: a
//! process that was frozen past its lease does not answer `200`. [`max_hold`](LockLayer::max_hold)
//! stops the heartbeat after a while, so a stuck handler ends this way.
//!
//! The release is awaited before the response head is returned, so the client's next request
//! finds the lock free. With [`hold_through_body`](LockLayer::hold_through_body) the
//! [`LeaseBody`] holds the lease until the body ends. When the future or body is dropped early
//! (the client went away), the release is spawned; if even that fails, the TTL frees the lock.
//!
//! A lease is not a mutex: a holder that is paused or partitioned long enough loses it while
//! it still works. Give the resource a fencing token ([`Lock::fenced`](crate::Lock::fenced),
//! [`Lease::fence`]) when that must never cause a lost update.
//!
//! # With axum
//!
//! ```
//! use std::time::Duration;
//! use axum::{Extension, Router, routing::{get, post}};
//! use tower_lease::{Lease, Lock, LockLayer, RwLock, RwLockLayer, Store, extract};
//!
//! const INVOICE_LOCK: Lock<str> = Lock::new("invoice", Duration::from_secs(30));
//! const CATALOG: RwLock<str> = RwLock::new("catalog", Duration::from_secs(10));
//!
//! async fn finalize(Extension(lease): Extension<Lease>) -> String {
//!     format!("finalized {}", String::from_utf8_lossy(lease.name()))
//! }
//! async fn export() -> &'static str { "catalog" }
//! async fn reprice() -> &'static str { "repriced" }
//!
//! let store = Store::memory();
//! let app: Router = Router::new()
//!     .route("/invoices/{id}/finalize", post(finalize))
//!     .route_layer(LockLayer::new(store.clone(), INVOICE_LOCK, extract::path_segment(1)));
//!
//! let catalog: Router = Router::new()
//!     .route("/catalog/{shop}", get(export).put(reprice))
//!     .route_layer(RwLockLayer::new(store, CATALOG, extract::path_segment(1)));
//! ```
//!
//! `route_layer` runs the layer only for matched routes, so unknown paths still get axum's
//! `404`. Rejections are responses, so no `HandleErrorLayer` is needed.
//!
//! # With hyper or `tower::ServiceBuilder`
//!
//! ```
//! use std::convert::Infallible;
//! use std::time::Duration;
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::{BodyExt, Full};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//! use tower_lease::{Lock, LockLayer, Store, extract};
//!
//! const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(5));
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store = Store::memory();
//! let service = ServiceBuilder::new()
//!     .layer(LockLayer::new(store.clone(), JOBS, extract::header("x-job")).held_status(StatusCode::LOCKED))
//!     .service(service_fn(|_req: Request<Full<Bytes>>| async {
//!         Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("ran"))))
//!     }));
//!
//! // Someone else holds "report":
//! let other = JOBS.try_lock(&store, "report").await.unwrap().unwrap();
//! let req = Request::post("/run").header("x-job", "report").body(Full::default()).unwrap();
//! let res = service.clone().oneshot(req).await.unwrap();
//! assert_eq!(res.status(), StatusCode::LOCKED);
//! assert_eq!(res.headers()["content-type"], "application/problem+json");
//! assert_eq!(res.headers()["retry-after"], "5");
//!
//! other.release().await.unwrap();
//! let req = Request::post("/run").header("x-job", "report").body(Full::default()).unwrap();
//! let res = service.oneshot(req).await.unwrap();
//! assert_eq!(res.status(), StatusCode::OK);
//! assert_eq!(res.into_body().collect().await.unwrap().to_bytes(), "ran");
//! # }
//! ```
//!
//! To serve it with hyper, wrap the service in `hyper_util::service::TowerToHyperService`; the
//! layer's futures and bodies are `Send + 'static` whenever the inner service's are.

#[allow(
    clippy::module_inception,
    reason = "the file of the layer types in the layer module"
)]
mod layer;

mod body;
pub mod extract;
mod future;
mod heartbeat;
mod lease;
mod problem;
mod service;

pub use self::body::{BoxError, LeaseBody, LeaseLostError};
pub use self::extract::ExtractName;
pub use self::future::ResponseFuture;
pub use self::layer::{LockLayer, RwLockLayer};
pub use self::lease::{Lease, LeaseLost};
pub use self::service::LockService;
