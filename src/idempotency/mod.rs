//! Idempotent requests: [`IdempotencyLayer`] makes a retried request the same request.
//!
//! A lock stops two requests from buying the last seat at once; it does nothing for the client
//! whose request timed out and who sends it again. Payment APIs solve that with an idempotency
//! key (the IETF httpapi `Idempotency-Key` draft, Stripe's practice): the first request with a
//! key runs, its response is stored, and every retry with the key gets that response instead
//! of running again. This layer does it across replicas, with the reservation of a key held as
//! a lease by the store's heartbeat, as every lease of the crate is.
//!
//! ```
//! use std::time::Duration;
//! use axum::{Extension, Router, routing::post};
//! use tower_lease::{Idempotency, IdempotencyLayer, Lease, Store, extract};
//!
//! const PAYMENTS: Idempotency =
//!     Idempotency::new("payments", Duration::from_secs(24 * 3600)).fenced();
//!
//! async fn pay(Extension(lease): Extension<Lease>) -> String {
//!     // The fence orders this reservation's writes after any earlier holder's.
//!     format!("charged under fence {:?}", lease.fence())
//! }
//!
//! let app: Router = Router::new()
//!     .route("/payments", post(pay))
//!     .route_layer(
//!         IdempotencyLayer::new(Store::memory(), PAYMENTS)
//!             .scope(extract::header("x-tenant"))
//!             .max_wait(Duration::from_secs(2)),
//!     );
//! ```
//!
//! # The HTTP contract
//!
//! | request | answer |
//! |---|---|
//! | no `Idempotency-Key` | runs as usual; `400` `urn:tower-lease:idempotency-key-missing` under [`require_key`](IdempotencyLayer::require_key) |
//! | a key that is not 1 to 255 printable ASCII characters, as a structured-field string (`"8e03978e-…"`) or bare token characters (`8e03978e-…`), or two keys | `400` `urn:tower-lease:idempotency-key-invalid` |
//! | a body over [`max_body`](IdempotencyLayer::max_body) (1 MiB), or slower than [`body_timeout`](IdempotencyLayer::body_timeout) (10 s) | `413`, `408`, before anything is reserved |
//! | the first with its key | runs under the reservation; its response goes out once stored for the retention (and acknowledged by the replicas a [`wait_for_replicas`](crate::RedisStore::wait_for_replicas) store waits for) |
//! | the first, its record not stored within [`complete_within`](IdempotencyLayer::complete_within) (10 s) | `503` `urn:tower-lease:idempotency-outcome-unknown` with `Retry-After`; stored in the background, then replayed |
//! | a retry, same fingerprint, first completed | the stored response, with `Idempotent-Replayed: true`; the inner service is not called |
//! | a retry while the first runs | `409` `urn:tower-lease:idempotency-in-flight` with `Retry-After`; under [`max_wait`](IdempotencyLayer::max_wait), the first's response once it is stored |
//! | the same key, another fingerprint | `422` `urn:tower-lease:idempotency-key-reused` (under [`Fingerprint::Json`], the same JSON spaced or ordered otherwise is the same fingerprint) |
//! | the first answered `5xx` (its own, or the layer's) | nothing stored, the key is freed: the retry runs |
//! | the first's handler panicked | `500` `urn:tower-lease:handler-failed`; nothing stored, the key freed before that answer: the retry runs (under [`at_most_once`](Idempotency::at_most_once), `409` outcome unknown) |
//! | the first's response was not stored (see below) | `410` `urn:tower-lease:idempotency-not-stored`, with `Idempotent-Replayed: true` and the first's status in the detail; never a second run |
//! | under [`at_most_once`](Idempotency::at_most_once), a retry after the first's holder died | `409` `urn:tower-lease:idempotency-outcome-unknown`, no `Retry-After`, for the retention; never a second run |
//! | a retry after the first's handler claimed the key in its transaction (`tower_lease_postgres::claim`) and died before its response was stored | runs the handler again under the reservation, whose claim answers it was claimed before; it answers from its own record (*Exactly once* below), at most once or not |
//! | the store failed | `503` `urn:tower-lease:lock-store-unavailable`, `Retry-After: 1` |
//!
//! Both spellings of a key name the same key: `"abc"` and `abc`. A bare key may hold the
//! characters of a structured-field token (`tchar`, `:` and `/`) and, unlike a strict token,
//! start with a digit, so the bare UUIDs most clients send are accepted.
//!
//! # The fingerprint
//!
//! Method, path with query, and the whole body, read before anything is reserved, hashed into
//! 128 bits by a non-cryptographic hash the crate carries itself (no dependency), stable across
//! Rust versions and platforms. Under [`fingerprint(Fingerprint::Json)`](IdempotencyLayer::fingerprint)
//! a JSON body counts by its meaning: whitespace, the order of an object's members and the
//! spelling of string escapes do not count, numbers count as written (`10` is not `10.0`), and
//! a body that is not JSON counts by its bytes ([`Fingerprint::Json`]). The handler gets the
//! body as sent either way. A collision matters only within one key, between two requests
//! one client sent with it: by chance about 2⁻¹²⁸; made on purpose, it only replays the
//! client's own response to itself.
//!
//! # What is stored, and what is not
//!
//! The status, the headers and the body, for the [`retention`](Idempotency::new). Hop-by-hop
//! headers (`Connection` and those it lists, `Keep-Alive`, `Transfer-Encoding`, `TE`,
//! `Trailer`, `Upgrade`, `Proxy-*`) and `Set-Cookie` are not: the first client gets its cookie,
//! a retry does not (one session cookie handed to two clients would be one session for both).
//!
//! The response body is read in the request's task, up to
//! [`max_response`](IdempotencyLayer::max_response) (1 MiB). A longer body (an endless stream
//! included), one that breaks off, or one that ends with trailers cannot be replayed: the first
//! client still gets all of it, streamed on after the part read, and the store keeps a marker
//! with its status. Retries get `410 Gone`: the request completed, and running it again is
//! the one thing a retry must never do. A streaming response that ends within the limit is
//! stored whole, like any other.
//!
//! # The reservation
//!
//! The first request takes the key's reservation: a lease of [`Idempotency::lease`] (10 s by
//! default), extended by the store's heartbeat every third of it while the request runs,
//! released or completed when it ends. A replica that crashes mid-request leaves a reservation
//! that runs out by its TTL, so a retry is told `409` for at most one lease, never for good.
//! [`fenced`](Idempotency::fenced) gives the reservation a fence, in the request's
//! [`Lease`](crate::Lease) extension (which every request run under a reservation carries).
//!
//! Once reserved, the inner service runs in a task of its own, so a client that disconnects
//! does not cancel a request that has started: it runs to completion, its response is stored,
//! and the retry replays it. The lease bounds the task: when the reservation is lost (the
//! store says it is gone, or no extension was confirmed in time) the work is dropped at its
//! next `.await` and nothing is stored; a retry runs again, so write through the fence.
//!
//! The response is stored only while the reservation is still ours (the store compares its
//! secret), or the key is empty (the reservation ran out, or a restart lost it, and nobody
//! took it since), in the same step that ends it. No response goes out before that: a `2xx`
//! whose record was lost would let a retry run the request again. While storing fails the
//! heartbeat keeps the reservation, and the completion is sent again (a completion sent twice
//! is answered the same) until stored or [`complete_within`](IdempotencyLayer::complete_within)
//! passed; then the client gets `503` outcome unknown, and the layer goes on trying in the
//! background (at most for the retention, and while the layer lives).
//!
//! Not promised: a retry that comes while a record waits for its replicas' `WAIT` may be
//! replayed that record from the primary (the look does not wait for replicas), and a
//! layer dropped while its completions are still tried leaves their reservations to run out.
//!
//! # Exactly once, and at most once
//!
//! A replica that dies mid-request leaves a reservation that runs out; by default a retry
//! then runs again. [`at_most_once`](Idempotency::at_most_once) keeps it from running again:
//! the reservation leaves a marker for the retention, and a retry that finds the reservation
//! gone without a completion (or a `5xx`, which frees both) is told `409` outcome unknown.
//! Neither undoes an effect whose response was never stored. Exactly once needs the handler:
//! it gets the key as [`IdempotencyKey`] and records it in the same transaction as its
//! effect, under `UNIQUE (idempotency_key)`, so a second run fails there.
//!
//! On PostgreSQL the store does this for the handler, and gives the retry its answer:
//! `tower_lease_postgres::claim(&tx, &key)` records the key in the effect's transaction, in
//! the store's own table. A retry that finds its key claimed and no response stored (the first
//! committed, then died before its response was stored) runs the handler again, under the
//! key's reservation like any first request, at most once at a time, at-most-once or not: the
//! claim says the effect was made. Its `claim` answers `ClaimError::AlreadyClaimed {
//! claimed_at }`, and the handler rolls back and answers from its own record, as the first run
//! would have; that response is stored and replayed like any other:
//!
//! ```text
//! match claim(&tx, &key).await {
//!     Ok(()) => tx.commit().await?,                 // charged now
//!     Err(ClaimError::AlreadyClaimed { .. }) => {   // charged by a run that died
//!         tx.rollback().await?;
//!         return receipt_for(&key).await;           // SELECT … WHERE idempotency_key = $1
//!     }
//!     Err(e) => return Err(e.into()),
//! }
//! ```
//!
//! A store without claims (Redis, memory, most backends of your own) cannot tell a committed
//! effect from one that never happened: there, a crash mid-request still runs again, or under
//! `at_most_once` answers `409` outcome unknown.
//!
//! Once the body is read, the rest of the request (the look-up included) runs in that task:
//! a client cut while the key is being reserved leaves no reservation that nobody runs.
//!
//! # Replays on this replica
//!
//! A completed record never changes while it lives, so each layer keeps a copy of the records
//! it stored or read (at most 4096 of them and 16 MiB, started over when full), each until
//! the record's own expiry, counted from before the store call. A retry on a replica that saw
//! the record is answered without a store round trip; one on another replica reads it from the
//! store once. A record the store lost (a restart without persistence) is still replayed from
//! a copy, which is what its retries want.
//!
//! # Keys in Redis
//!
//! `P:idem:{ns:scope:key}` holds the reservation while the first request runs (its secret, `PX`
//! the lease), and once it completed, the record written over it (fingerprint, the completing
//! reservation's secret, so a completion sent twice is answered the same, and the response),
//! `PX` the retention. So a first request costs the store what a lock does: one `SET NX PX`
//! to reserve, one script to complete. `…:fence` is the fence counter of a fenced definition,
//! `…:unknown` the marker of an at-most-once one: a reservation's value is its bare secret,
//! which the lock scripts extend and release, and the key expires with the lease, so what
//! must outlive the lease needs a key of its own. The scope has `\` and `:`
//! escaped, so the names are injective in (scope, key); all keys of one key share its hash tag
//! and cluster slot. Nothing outlives its expiry: records their retention, reservations their
//! lease, markers their retention, fence counters an hour.
//!
//! # Waiting
//!
//! Under [`max_wait`](IdempotencyLayer::max_wait) a retry that finds the key in flight waits until the
//! first completes (it then gets the stored response), frees the key (it then runs itself) or
//! the wait runs out (`409`). On a store with release notifications (a Redis store made by
//! `RedisStore::connect` or `connect_cluster`; `tower-lease-postgres`'s `PgStore`, through
//! `LISTEN`/`NOTIFY`; a backend of your own that delivers them) it watches the key and is woken
//! by the completion, looking again at the holder's lease end and at least every second in
//! case a message was lost; the one retry a message wakes wakes the others of its process. On
//! other stores it looks again after 10 ms, doubling to every 100 ms.

use std::fmt;
use std::time::Duration;

use crate::definition::Definition;

mod body;
mod config;
mod future;
mod key;
mod layer;
mod record;
mod reserved;
mod service;

pub use self::body::IdempotentBody;
pub use self::future::ResponseFuture;
pub use self::key::extension::IdempotencyKey;
pub use self::key::fingerprint::Fingerprint;
pub use self::layer::{IdempotencyLayer, Unscoped};
pub use self::service::IdempotencyService;

/// The default lease of a reservation.
const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// An idempotency namespace: how long completed responses are replayed, and the lease of an
/// in-flight reservation. `const`, like the lock definitions.
///
/// ```
/// use std::time::Duration;
/// use tower_lease::Idempotency;
///
/// const PAYMENTS: Idempotency = Idempotency::new("payments", Duration::from_secs(24 * 3600))
///     .lease(Duration::from_secs(30))
///     .fenced();
/// ```
#[derive(Clone, Copy)]
pub struct Idempotency {
    pub(crate) definition: Definition,
    pub(crate) retention: Duration,
    pub(crate) at_most_once: bool,
}

impl Idempotency {
    /// Keys in `namespace`, whose completed responses are replayed for `retention` (counted
    /// in whole milliseconds).
    ///
    /// # Panics
    ///
    /// As [`Lock::new`](crate::Lock::new) for the namespace; and if `retention` is under 1 ms.
    /// In a `const`, at compile time.
    pub const fn new(namespace: &'static str, retention: Duration) -> Self {
        assert!(
            retention.as_millis() >= 1,
            "tower-lease: an idempotency retention must be at least 1 ms"
        );
        Self {
            definition: Definition::new(namespace, DEFAULT_LEASE),
            retention,
            at_most_once: false,
        }
    }

    /// The lease of an in-flight reservation (default 10 s), kept by the heartbeat while the
    /// request runs: how long a crashed replica's reservation keeps retries at `409`.
    ///
    /// # Panics
    ///
    /// If `ttl` is under 1 ms.
    pub const fn lease(self, ttl: Duration) -> Self {
        let fenced = self.definition.fenced;
        let mut definition = Definition::new(self.definition.namespace, ttl);
        definition.fenced = fenced;
        Self { definition, ..self }
    }

    /// Gives each reservation a fence, larger than every fence issued before for its key, in
    /// the request's [`Lease`](crate::Lease) extension.
    pub const fn fenced(mut self) -> Self {
        self.definition.fenced = true;
        self
    }

    /// Never runs a key twice, even when its first request's replica died mid-request: a
    /// reservation whose holder died (its lease ran out without a completion) makes the key's
    /// outcome unknown for the retention, and its retries get `409`
    /// `urn:tower-lease:idempotency-outcome-unknown` instead of running again. Without it,
    /// such a key runs again once the lease ran out. A `5xx` still frees the key. A key the
    /// handler claimed in the transaction of its effect (`tower_lease_postgres::claim`) is
    /// known to have taken effect: it runs again, and the handler answers from its record.
    ///
    /// It costs one more key in the store per request (a marker, `PX` the retention) and the
    /// reservation is taken by a script.
    pub const fn at_most_once(mut self) -> Self {
        self.at_most_once = true;
        self
    }

    /// The namespace.
    pub const fn namespace(&self) -> &'static str {
        self.definition.namespace
    }

    /// How long completed responses are replayed.
    pub const fn retention(&self) -> Duration {
        self.retention
    }
}

impl fmt::Debug for Idempotency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Idempotency")
            .field("namespace", &self.definition.namespace)
            .field("retention", &self.retention)
            .field("lease", &self.definition.ttl)
            .field("fenced", &self.definition.fenced)
            .field("at_most_once", &self.at_most_once)
            .finish()
    }
}
