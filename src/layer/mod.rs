//! Tower middleware that runs each request under a lease: [`LockLayer`], [`RwLockLayer`] and
//! [`SemaphoreLayer`].
//!
//! This page is the reference for the layer: where the name comes from, the options, every answer
//! the layer makes over HTTP, and what happens while a request runs.
//!
//! For each request the layer asks its extractor for a lock name, tries the lease once (no
//! waiting), and then answers or runs the inner service as the [HTTP contract](#http-contract)
//! says.
//! [`LockLayer::new(store, lock, extractor)`](crate::LockLayer::new) takes an exclusive
//! `Lock<str>`; [`RwLockLayer::new(store, rwlock, extractor)`](crate::RwLockLayer::new) takes
//! the shared read lease for `GET`, `HEAD`, `OPTIONS` and `TRACE` and the write lease otherwise;
//! [`SemaphoreLayer::new(store, semaphore, extractor)`](crate::SemaphoreLayer::new) takes one of
//! a `Semaphore`'s K permits, so at most K requests per name run at once across every replica.
//! All are `Clone + Send + Sync`, keep the inner service's error type (every rejection is a
//! response, so axum needs no `HandleErrorLayer`), and need a tokio runtime.
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
//! let app: Router = Router::new().route(
//!     "/invoices/{id}/finalize",
//!     post(finalize).route_layer(LockLayer::new(store.clone(), INVOICE_LOCK, extract::path_segment(1))),
//! );
//!
//! let catalog: Router = Router::new().route(
//!     "/catalog/{shop}",
//!     get(export)
//!         .put(reprice)
//!         .route_layer(RwLockLayer::new(store, CATALOG, extract::path_segment(1))),
//! );
//! ```
//!
//! The layer sits on the route's `MethodRouter`, which runs it only for the methods the route
//! serves: an unknown path still gets axum's `404`, and a method the route does not serve its
//! `405`, without taking a lock. (`Router::route_layer` would lock the `405` fallback too, so a
//! stray `POST` on the catalog would take its write lease.)
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
//! use tower_lease::layer::TimeoutBody;
//! use tower_lease::{Lock, LockLayer, Store, extract};
//!
//! const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(5));
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let store = Store::memory();
//! let service = ServiceBuilder::new()
//!     .layer(LockLayer::new(store.clone(), JOBS, extract::header("x-job")).busy_status(StatusCode::LOCKED))
//!     .service(service_fn(|_req: Request<TimeoutBody<Full<Bytes>>>| async {
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
//!
//! # Where the name comes from
//!
//! An extractor is anything that implements [`extract::ExtractName`],
//! including every closure `Fn(&Request<B>) -> Option<N>` that returns an owned name (`String`,
//! `Vec<u8>`, `Bytes`, an integer, …). `None` means "not locked": the request goes straight to the
//! inner service. The helpers in [`extract`]:
//!
//! | helper | name | `None` when |
//! |---|---|---|
//! | [`path_segment(i)`](crate::extract::path_segment) | the `i`th path segment counting from 0 after the leading `/` (`/invoices/{id}/finalize`: `1` is the id), percent-decoded to raw bytes | the path has fewer segments |
//! | [`path()`](crate::extract::path) | the whole path, percent-decoded (so every spelling of a path takes the same lock) | never |
//! | [`header(name)`](crate::extract::header) | the first value of the header, raw bytes | the header is missing |
//! | [`path_segments([i, j])`](crate::extract::path_segments) | several segments, each decoded, joined with `/` (a `/` or `%` inside one written as `%2F`, `%25`); `/events/{event}/seats/{seat}`: `[1, 3]` | the path has fewer segments |
//! | [`constant(name)`](crate::extract::constant) | always `name`: one lock for the whole route | never |
//!
//! A name that is empty (`/invoices//finalize`) or longer than 1024 bytes gets `400`, and so, by
//! default, does one that is not UTF-8 text or holds a control character (NUL included) or a
//! brace (`/invoices/%00`, `/invoices/%7Bx%7D`, `/invoices/%FF`). The store takes any bytes, but
//! from a request such names are a bug or a probe: control bytes make keys unreadable in
//! `redis-cli`, and a `}` shortens the cluster hash tag, so crafted names could pile onto one slot.
//! `.binary_names()` lifts the text rule for extractors that produce binary names (raw UUIDs,
//! say). Inside axum's `Router::nest`, the path is the nested router's, without its prefix.
//!
//! The layers take a lock of any name type (`Lock<u64>`, `RwLock<str>`, …); names meet as the
//! bytes [`LockName`](crate::LockName) encodes, so an extractor for a `Lock<u64>` should yield a
//! `u64`. A request the extractor finds no name in runs unlocked, and a handler that takes
//! `Extension<Lease>` then fails with axum's `500 Missing request extension`: use
//! `.require_name()` where every request must be locked, or take `Option<Extension<Lease>>`.
//!
//! # Options
//!
//! Every layer has these, except where the table says otherwise:
//!
//! | option | default | effect |
//! |---|---|---|
//! | [`.busy_status(StatusCode)`](crate::LockLayer::busy_status) (`LockLayer`, `RwLockLayer`) | `409 Conflict` | the status when someone else holds the lock: a 4xx or `503`; `503` or `429` for clients that retry by themselves (see [the README's Clients](crate#clients)) |
//! | [`.full_status(StatusCode)`](crate::SemaphoreLayer::full_status) (`SemaphoreLayer`) | `429 Too Many Requests` | the status when every permit is taken: a 4xx or `503` |
//! | [`.permits(f)`](crate::SemaphoreLayer::permits) (`SemaphoreLayer`) | the semaphore's own | any `Fn(&Request<B>) -> u32`: this request's limit, such as a tenant's plan; `0` answers `400` |
//! | [`.fail_open()`](crate::LockLayer::fail_open) | off: fail closed with `503` | when the store fails or times out, run the request unlocked and log a warning |
//! | [`.heartbeat(Duration)`](crate::LockLayer::heartbeat) | TTL / 3 | how often the lease is extended while the request runs (must be shorter than the TTL) |
//! | [`.max_hold(Duration)`](crate::LockLayer::max_hold) | no limit | stop extending this long after acquiring: a stuck handler loses the lease at most one TTL later |
//! | [`.on_lease_lost(LeaseLost)`](crate::LockLayer::on_lease_lost) | [`LeaseLost::Abort`] | `Abort`: drop the handler's future and answer `503`; `Continue`: only flag the [`Lease`](crate::Lease) |
//! | [`.hold_through_body()`](crate::LockLayer::hold_through_body) | off: released before the response head | keep the lease until the response body ends (end of stream, error or drop), for streamed work |
//! | [`.binary_names()`](crate::LockLayer::binary_names) | off: names must be UTF-8 text without control characters or braces | accept any bytes as a name (still 1 to 1024 of them) |
//! | [`.require_name()`](crate::LockLayer::require_name) | off: no name runs unlocked | answer `400` when the extractor finds no name |
//! | [`.max_wait(Duration)`](crate::LockLayer::max_wait) | `RwLockLayer`: 2 s; `LockLayer`, `SemaphoreLayer`: zero, answer at once | `Duration::ZERO` answers at once; otherwise wait up to this long for a busy lock, woken by a release in this process (and anywhere, with [`RedisStore::connect`](crate::RedisStore::connect)'s release notifications), at the holder's lease end, or else by polling (5–100 ms, jittered); then `409` as usual |
//! | [`.max_waiters(n)`](crate::LockLayer::max_waiters) | 1024 | the most requests of the layer waiting at once; beyond it a request is answered at once |
//! | [`.max_release_wait(Duration)`](crate::LockLayer::max_release_wait) | 250 ms | the longest a finished response waits for its release; a slower release finishes in the background |
//! | [`.buffer_body(max_bytes)`](crate::LockLayer::buffer_body) | off: the body streams to the handler under the lock, within `.body_timeout(..)` | read the whole body before locking: `413` above `max_bytes`, `408` after `.body_timeout(..)` |
//! | [`.body_timeout(Duration)`](crate::LockLayer::body_timeout) | 10 s | the longest the whole request body may take: under the lock (streamed, as a [`TimeoutBody`]), the handler's read fails after it, the lock is released and the answer is `408`; under `.buffer_body(..)`, before the lock |
//! | [`.on_rejection(hook)`](crate::LockLayer::on_rejection) | problem+json | render the layer's refusals with an [`OnRejection`](crate::rejection::OnRejection) hook (any `Fn(&Rejection) -> Response<B>`, `B` being `Bytes` or any body: axum's `IntoResponse` output fits) |
//! | [`.coalesce_reads(bool)`](crate::RwLockLayer::coalesce_reads) (`RwLockLayer` only) | on | overlapping reads of one name in the layer share one reader lease in the store; `false` gives each read its own (see [shared reads](#shared-reads)) |
//! | [`.read_when(f)`](crate::RwLockLayer::read_when) (`RwLockLayer` only) | [`SafeMethods`]: `GET`, `HEAD`, `OPTIONS`, `TRACE` read | any `Fn(&Request<B>) -> bool`: `true` takes a read lease, `false` the write lease |
//!
//! The store's own options matter too: [`RedisStore::timeout`](crate::RedisStore::timeout)
//! (default 1 s) bounds every acquire, extend and release, and so how long a request can wait on a
//! sick Redis. redis-rs connections have their own response timeout (500 ms by default); whichever
//! is shorter answers first.
//!
//! # HTTP contract
//!
//! | situation | status | headers | body |
//! |---|---|---|---|
//! | extractor answers `None` | the inner service's | the inner service's | the inner service's |
//! | name empty, over 1024 bytes, or (without `.binary_names()`) not UTF-8 text or holding a control character or a brace | `400 Bad Request` | `content-type: application/problem+json` | problem `urn:tower-lease:invalid-lock-name` |
//! | lock busy: held by another request | `409 Conflict`, or `.busy_status(…)` | `retry-after` (the expected wait, below), problem+json | problem `urn:tower-lease:lock-busy` |
//! | every permit taken (`SemaphoreLayer`) | `429 Too Many Requests`, or `.full_status(…)` | `retry-after` (the expected wait), problem+json | problem `urn:tower-lease:concurrency-limit` |
//! | a limit of 0 from `.permits(..)` | `400 Bad Request` | problem+json | problem `urn:tower-lease:invalid-concurrency-limit` |
//! | store failed or timed out | `503 Service Unavailable` (or the inner response with `.fail_open()`) | `retry-after: 1`, problem+json | problem `urn:tower-lease:lock-store-unavailable` |
//! | lease taken, but fewer replicas acknowledged it than [`RedisStore::wait_for_replicas`](crate::RedisStore::wait_for_replicas) asks (it was released again) | `503 Service Unavailable` | `retry-after: 1`, problem+json | problem `urn:tower-lease:not-replicated` |
//! | lease lost while the handler ran (default policy) | `503 Service Unavailable` (or the inner response with `LeaseLost::Continue`) | `retry-after: 1`, problem+json | problem `urn:tower-lease:lease-lost` |
//! | no name, under `.require_name()` | `400 Bad Request` | problem+json | problem `urn:tower-lease:missing-lock-name` |
//! | body over the limit, under `.buffer_body(..)` | `413 Payload Too Large` | problem+json | problem `urn:tower-lease:body-too-large` |
//! | body not in within `.body_timeout(..)` (buffered before the lock, or streamed under it: the handler's answer is replaced) | `408 Request Timeout` | problem+json | problem `urn:tower-lease:body-timeout` |
//! | body broke off while buffered | `400 Bad Request` | problem+json | problem `urn:tower-lease:body-unreadable` |
//! | acquired | the inner service's | the inner service's | the inner service's, released before it is returned |
//!
//! Every refusal above goes through the [`on_rejection`](crate::LockLayer::on_rejection) hook
//! when the layer has one.
//!
//! - `Retry-After` on a busy lock (or a full semaphore) is the expected wait: the 90th
//!   percentile of the last 16 holds the layer saw, never more than the blocking lease has left
//!   (which is all the layer knows before it has seen a hold), in whole seconds, rounded up, at
//!   least 1 (RFC 9110). A holder's heartbeat keeps its lease at about one TTL for as long as it
//!   works, so the lease alone would tell a client to wait 5 s for a 30 ms job. It is a hint,
//!   not a promise that the lock is free then. A refused write of a phase-fair or writers-first
//!   `RwLock` is told 1 s at most: its write intent, which keeps new reads out for it, lasts
//!   1.5 s after a refusal without a wait, and a client that comes back later would find it gone
//!   and the reads that came meanwhile in its way, at every retry.
//! - With Redis down or blackholed, the `503` comes within `RedisStore::timeout` (1 s by default)
//!   plus a round trip, never later.
//! - Problem bodies are RFC 9457 documents (`type`, `title`, `status`, `detail`) with the lock's
//!   namespace as an extension member. They never contain a lease token, and the `type` URIs are
//!   stable identifiers (not links):
//!
//! ```json
//! {"type":"urn:tower-lease:lock-busy","title":"The resource is locked by another request","status":409,
//!  "detail":"Another request holds the invoice lock for this resource; retry in 30 s.","namespace":"invoice"}
//! ```
//!
//! - Under `.hold_through_body()`, a lease lost while the body streams (default policy) ends the
//!   body with an error, so the client sees a truncated response rather than a complete one. The
//!   body's last frame is written after the release's round trip, so set `TCP_NODELAY` on the
//!   listener (in axum, `listener.tap_io(|tcp| tcp.set_nodelay(true))` from
//!   `axum::serve::ListenerExt`); otherwise Nagle's algorithm can hold that frame back for a
//!   delayed ACK (about 20 ms per response on loopback).
//!
//! # While the request runs
//!
//! An acquired request carries a [`Lease`](crate::Lease) extension (`Extension<Lease>` in axum):
//! `name()`, `namespace()`, `mode()`, `fence()`, `is_held()`, and two futures for handlers that
//! stop cooperatively under [`LeaseLost::Continue`]:
//! [`lost()`](crate::Lease::lost) resolves only when the lease is lost, and
//! [`ended()`](crate::Lease::ended) when it is lost or released.
//!
//! The store's heartbeat extends each lease every `heartbeat` interval, whether or not the server
//! is polling the response (a client that reads slowly does not let the lease lapse). It is one
//! task per [`Store`](crate::Store), shared by every layer and `Held` on it, not one per lease:
//! the extensions that fall due together (within an eighth of the interval) go out as one batch,
//! one pipeline on Redis (concurrent single calls on a cluster, where a pipeline cannot span
//! slots). The task is spawned when a lease's first extension falls due, and ends when the
//! store's last such lease is released or lost; a request that ends sooner never touches it. Failed extensions are retried with a short backoff until the
//! lease would end; a batch the store does not answer is abandoned at the earliest expiry in it.
//!
//! Validity is counted on the monotonic clock from the moment each confirmed acquire or extend
//! was *sent*, less 1 % of the TTL + 2 ms for clock drift; when no extension is confirmed by then,
//! or the store answers that the lease is gone, it is lost. Under the default
//! [`LeaseLost::Abort`] a lost lease drops the inner future and answers
//! `503`, and a handler that finishes after that moment (a process that was frozen, an executor
//! that was starved) gets `503`, not its `200`. The lease's expiry is checked before *every* poll of
//! the handler (and of a body under `.hold_through_body()`), so a frozen process that wakes up
//! past its lease drops the handler before its next step, even if the heartbeat has not run
//! yet; `tower_lease_lost_total{reason="expired"}` counts it. A step the handler took
//! before the freeze is another matter: only a [fence](crate::Lock::fenced) checked by the
//! resource catches a write that was already on its way. [`max_hold`](crate::LockLayer::max_hold) stops
//! the heartbeat after a while, so a stuck handler ends this way.
//!
//! The release is awaited before the response head is returned, so the client's next request
//! finds the lock free; with `.hold_through_body()` the [`LeaseBody`] holds
//! the lease until the body ends instead. When a client disconnects mid-request, hyper drops the
//! future (or the body); the layer then stops extending and releases in a spawned task, and a store
//! call still on the wire is finished in a task of its own, giving back any lease it took. If even
//! that release fails, the TTL frees the lock.
//!
//! # Shared reads
//!
//! An `RwLockLayer` lets the read requests of one name that overlap in time share one reader
//! lease in the store ([`coalesce_reads`](crate::RwLockLayer::coalesce_reads), on by default):
//! the first takes it, the next ones join it with no store call (or, while its acquisition is
//! on the wire, wait for it and get its answer: the lease, or the same `409` or `503`), the
//! heartbeat extends it once per beat for all of them, and the last one out releases it before
//! its response goes out. Shares are kept per layer (the services one layer value makes, and its
//! clones, share them) and per name. So a store sees one reader lease per process and name while
//! reads overlap, however many there are, and a `GET` that joins costs a lock and a count in
//! memory instead of two round trips.
//!
//! The guarantees are a reader's: a writer anywhere is refused while the shared lease lives. When
//! it is lost (the store says it is gone, or no extension was confirmed in time) every request
//! sharing it is told, each as above: `503` under `Abort`, the [`Lease`](crate::Lease) flag under `Continue`;
//! and each response still needs the lease valid at the moment it was produced. A lost share
//! takes no newcomer (they take a fresh lease), and neither does one that heard of a writer of
//! a [phase-fair or writers-first](crate::RwLock::fairness) lock waiting: new reads then ask the
//! store, which refuses them until the writer is through, and the writer gets in once the reads
//! inside end. A share hears of it at once: the writer's refused attempt raises it in its own
//! process and publishes it on the lock's channel, to which every share of such a lock
//! subscribes on a store with notifications (an intent published before that subscription is
//! confirmed is heard at the writer's next attempt, or at the share's next extension). So the
//! writer waits about one read's duration, whatever the TTL.
//!
//! When a reader lease ends: before the response of the last read that shared it goes out. A
//! share whose reads overlapped *lingers* first: its last read's response waits up to 1 ms for
//! another read of the name, which takes the share over (the waiting response then goes out at
//! once, the lease now that read's); if none comes, the lease is released and then the response
//! goes out. So a hot name keeps one lease while its reads keep coming, and an answered read
//! never leaves a lease behind that no request in flight holds: a client's next request, to any
//! replica, never meets it. [`linger_reads`](crate::RwLockLayer::linger_reads) sets how long
//! for every share. A heard intent ends the linger at once, and a write through the layer ends
//! the layer's own idle share before it asks the store. The writer's intent lives
//! while it waits under [`max_wait`](crate::LockLayer::max_wait) (or for 1.5 s after a refusal without
//! a wait, long enough for its client to come back after its `Retry-After`), so a writer that
//! waits at least a heartbeat is found; one that gives up, or whose
//! client disconnects, withdraws its intent, and reads are let in again at once. Under
//! [`max_hold`](crate::LockLayer::max_hold) a share takes newcomers for the first half of it
//! only, since the limit counts from the shared lease's acquisition. With [`max_wait`](crate::LockLayer::max_wait)
//! (an `RwLockLayer`'s default), a read first asks as without a wait, with the reads of its
//! name that arrive with it; refused, it joins a share held by then or waits on its own, and
//! shares the lease it gets.
//!
//! Each request's [`Lease`](crate::Lease) is its own view: `is_held()` turns `false` and `ended()` resolves
//! when that request is done, even while others still share the lease; `fence()` is the shared
//! lease's. With the `metrics` feature, a request that joins (or shared an acquisition) counts
//! in `tower_lease_acquire_total` with the outcome it got (`acquired`, `busy`, `store_error`),
//! without an `acquire_seconds` sample; `tower_lease_held`, `tower_lease_hold_seconds`,
//! `tower_lease_extend_total` and `tower_lease_lost_total` count leases in the store, so a
//! shared lease counts once however many requests share it.
//!
//! A lease is not a mutex: a holder that is paused or partitioned long enough loses it while it
//! still works. Give the resource a fencing token ([`Lock::fenced`](crate::Lock::fenced),
//! [`Lease::fence`](crate::Lease::fence)) when that must never cause a lost update; see
//! [what a lease cannot promise](crate#what-a-lease-cannot-promise).

#[allow(
    clippy::module_inception,
    reason = "the file of the layer types in the layer module"
)]
mod layer;

mod body;
pub mod extract;
mod future;
mod hold;
mod options;
mod per_request;
mod request_body;
mod semaphore;
mod service;
mod shared_read;

pub use self::body::{LeaseBody, LeaseLostError};
pub use self::extract::ExtractName;
pub use self::future::ResponseFuture;
pub use self::hold::lease_lost::LeaseLost;
pub use self::layer::{LockLayer, RwLockLayer};
pub use self::per_request::{PermitsFor, ReadWhen, SafeMethods, SemaphorePermits};
pub use self::request_body::buffer::{BufferBody, BufferFuture, Buffered, Streamed};
pub use self::request_body::timeout_body::{BodyTimeoutError, TimeoutBody};
pub use self::semaphore::SemaphoreLayer;
pub use self::service::LeaseService;
