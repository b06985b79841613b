//! [`LockLayer`] and [`RwLockLayer`], and the configuration they hand their services. Their
//! shared options are in `options.rs`.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use tower_layer::Layer;

use super::options::config::{Config, DEFAULT_READ_WRITE_WAIT, ReadSharing};
use super::per_request::SafeMethods;
use super::request_body::buffer::{BufferBody, Buffered, Streamed};
use super::service::{Access, LeaseService};
use super::shared_read::Linger;
use crate::{Lock, RwLock, Store};

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
///
/// With [`buffer_body`](Self::buffer_body) the layer reads the whole request body before it
/// takes the lock; its type then says so in `P` ([`Buffered`] instead of [`Streamed`]).
#[derive(Clone)]
pub struct LockLayer<E, P = Streamed> {
    pub(super) config: Arc<Config>,
    extractor: E,
    body: PhantomData<fn() -> P>,
}

impl<E> LockLayer<E> {
    /// A layer that takes `lock` in `store` on the name `extractor` picks from each request.
    ///
    /// The lock may have any name type: `Lock<str>` with an extractor of text, `Lock<u64>` with
    /// one that parses an id, and so on. Names are compared as the bytes [`LockName`](crate::LockName) encodes,
    /// so the extractor should yield `N`'s owned form (`String` for `str`, `u64` for `u64`) for
    /// the layer and direct callers of `lock` to meet on the same names.
    ///
    /// The layer cannot tell `N` from the extractor, so a lock written inline needs its name
    /// type: `LockLayer::new(store, Lock::<str>::new("jobs", ttl), extractor)` (without the
    /// `::<str>`, rustc answers E0282, "type annotations needed"). A lock defined as a typed
    /// `const`, as above, needs nothing.
    pub fn new<N: ?Sized>(store: Store, lock: Lock<N>, extractor: E) -> Self {
        Self {
            config: Arc::new(Config::new(store, lock.definition())),
            extractor,
            body: PhantomData,
        }
    }

    /// Reads the whole request body, up to `max_bytes`, before taking the lock, so a slow or
    /// oversized upload never holds it: a longer body gets `413 Payload Too Large`, one that
    /// does not arrive within [`body_timeout`](Self::body_timeout) (10 s by default) gets
    /// `408 Request Timeout`, and neither takes the lock. The inner service gets the body
    /// from memory, so the request body type must be buildable from [`Bytes`](bytes::Bytes)
    /// (axum's `Body` and `http_body_util::Full<Bytes>` are).
    ///
    /// Use it for routes whose handlers read a small body (JSON commands) under the lock.
    /// For large uploads, stream them before locking, or bound the hold with
    /// [`max_hold`](Self::max_hold) and tower-http's body timeout instead.
    pub fn buffer_body(mut self, max_bytes: usize) -> LockLayer<E, Buffered> {
        Arc::make_mut(&mut self.config).body_limit = max_bytes;
        LockLayer {
            config: self.config,
            extractor: self.extractor,
            body: PhantomData,
        }
    }
}

/// Guards each request with an [`RwLock`] on the name its extractor picks: a shared read
/// lease for `GET`, `HEAD`, `OPTIONS` and `TRACE`, the exclusive write lease otherwise.
///
/// Its requests wait up to 2 s for their lease by default ([`max_wait`](Self::max_wait)),
/// unlike a [`LockLayer`]'s: reads and writes of one name take turns, and under the lock's
/// default [phase-fair](crate::Fairness::PhaseFair) policy a read waits for at most one write
/// and a write for the reads already in, so a request that waits its turn is served where one
/// that does not would be refused whenever it meets the other side (a read meeting a waiting
/// writer, a write meeting reads), and would come back only after a `Retry-After` of whole
/// seconds. With short holds, as a catalog's reads and reprices, the wait is a few of them;
/// the 2 s bound answers a request stuck behind a long write while its client still waits.
/// `.max_wait(Duration::ZERO)` refuses at once instead, with `409` and `Retry-After`.
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
pub struct RwLockLayer<E, R = SafeMethods, P = Streamed> {
    pub(super) config: Arc<Config>,
    extractor: E,
    read_when: R,
    body: PhantomData<fn() -> P>,
}

impl<E> RwLockLayer<E> {
    /// A layer that takes `lock` in `store` on the name `extractor` picks from each request.
    ///
    /// As with [`LockLayer::new`], the lock may have any name type `N`, and the extractor
    /// should yield its owned form. Its requests wait up to 2 s for a busy lock; see the type's
    /// docs.
    pub fn new<N: ?Sized>(store: Store, lock: RwLock<N>, extractor: E) -> Self {
        let mut config = Config::new(store, lock.definition());
        let linger = Linger::DEFAULT;
        config.share_reads(ReadSharing::Coalesced { linger });
        config.max_wait = DEFAULT_READ_WRITE_WAIT;
        Self {
            config: Arc::new(config),
            extractor,
            read_when: SafeMethods,
            body: PhantomData,
        }
    }
}

impl<E, R, P> RwLockLayer<E, R, P> {
    /// Decides which requests read with `read_when` instead of by method: a
    /// [`ReadWhen`](crate::layer::ReadWhen), such as a closure `Fn(&Request<B>) -> bool`
    /// that answers `true` for a read.
    pub fn read_when<R2>(self, read_when: R2) -> RwLockLayer<E, R2, P> {
        RwLockLayer {
            config: self.config,
            extractor: self.extractor,
            read_when,
            body: PhantomData,
        }
    }

    /// Whether concurrent reads of one name share one reader lease in the store (on by
    /// default).
    ///
    /// With it, the read requests of one name that overlap in this layer hold one reader lease
    /// between them: the first takes it, the next ones join it without a store call (or wait
    /// for the first one's acquisition and share its answer), the heartbeat extends it once per
    /// beat for all of them, and the last one to finish releases it. A writer anywhere is
    /// refused while it lives, as by any reader. When it is lost, every request sharing it is
    /// told as under [`on_lease_lost`](Self::on_lease_lost), and each response still needs the
    /// lease valid when it was produced. A shared lease stops taking new requests when it is
    /// lost, when an extension finds a writer of a
    /// [phase-fair or writers-first](crate::RwLock::fairness) lock waiting (new reads then ask the
    /// store, which refuses them until the writer is through), and, under
    /// [`max_hold`](Self::max_hold), once half of `max_hold` has passed since it was taken.
    /// Under [`max_wait`](Self::max_wait), a read joins a held share or waits on its own, and shares
    /// the lease it gets. With the `metrics` feature, a request that shares counts as
    /// `acquired` (or as the outcome it shared), and the held gauge counts leases in the store,
    /// not requests; see [shared reads](crate::layer#shared-reads).
    ///
    /// Turn it off to give every read request a reader lease of its own (and no
    /// [linger](Self::linger_reads)); turned on, it keeps a linger set before.
    pub fn coalesce_reads(mut self, coalesce: bool) -> Self {
        let sharing = match (coalesce, self.config.read_sharing()) {
            (false, _) => ReadSharing::Separate,
            (true, ReadSharing::Separate) => ReadSharing::Coalesced {
                linger: Linger::DEFAULT,
            },
            (true, coalesced) => coalesced,
        };
        Arc::make_mut(&mut self.config).share_reads(sharing);
        self
    }

    /// Keeps a shared read lease whose reads overlapped (a second read joined it while the
    /// first ran) for up to `linger` after its last request finished (at most a quarter of a
    /// heartbeat interval), for the next read of its name, while that last request's response
    /// waits: a read that comes meanwhile takes the share over and the waiting response goes
    /// out at once; otherwise the lease is released, then the response goes out. A request is
    /// never answered while a lease nobody in flight holds is left behind, so a client's next
    /// request (a write, say, to another replica) never meets it. A share that only ever served
    /// one read is released at once, so names read one at a time pay nothing; zero releases
    /// every share at once. Implies [`coalesce_reads(true)`](Self::coalesce_reads).
    ///
    /// Default: 1 ms. On a hot name the gaps between reads are far shorter than that, so its
    /// share, and its one reader lease, lasts as long as the reads keep coming, and the last
    /// read of a burst is answered at most 1 ms later. A longer linger carries a share across
    /// gaps between bursts, and delays the last read of each burst by as much. The linger is
    /// part of that read's wait for its release, which [`max_release_wait`](Self::max_release_wait)
    /// bounds (250 ms by default): keep it well below that, or the read is answered while its
    /// lease still lingers.
    ///
    /// A write of the name through this layer ends the layer's idle share at once, so it never
    /// waits for the linger. A write intent of a
    /// [phase-fair or writers-first](crate::RwLock::fairness) lock, from this process or another,
    /// ends the linger at once too.
    pub fn linger_reads(mut self, linger: Duration) -> Self {
        let linger = Linger(linger);
        Arc::make_mut(&mut self.config).share_reads(ReadSharing::Coalesced { linger });
        self
    }

    /// Reads the whole request body before taking the lock; see
    /// [`LockLayer::buffer_body`].
    pub fn buffer_body(mut self, max_bytes: usize) -> RwLockLayer<E, R, Buffered> {
        Arc::make_mut(&mut self.config).body_limit = max_bytes;
        RwLockLayer {
            config: self.config,
            extractor: self.extractor,
            read_when: self.read_when,
            body: PhantomData,
        }
    }
}

impl<E, P> LockLayer<E, P> {
    fn service<S>(&self, inner: S) -> LeaseService<S, E>
    where
        E: Clone,
    {
        let config = self.config.clone();
        LeaseService::new(inner, config, self.extractor.clone(), Access::Exclusive)
    }
}

impl<E, R, P> RwLockLayer<E, R, P> {
    fn service<S>(&self, inner: S) -> LeaseService<S, E, R>
    where
        E: Clone,
        R: Clone,
    {
        let config = self.config.clone();
        let access = Access::ReadWrite(self.read_when.clone());
        LeaseService::new(inner, config, self.extractor.clone(), access)
    }
}

impl<S, E: Clone> Layer<S> for LockLayer<E, Streamed> {
    type Service = LeaseService<S, E>;

    fn layer(&self, inner: S) -> Self::Service {
        self.service(inner)
    }
}

impl<S, E: Clone> Layer<S> for LockLayer<E, Buffered> {
    type Service = BufferBody<LeaseService<S, E>>;

    fn layer(&self, inner: S) -> Self::Service {
        BufferBody::new(self.service(inner), self.config.clone())
    }
}

impl<S, E: Clone, R: Clone> Layer<S> for RwLockLayer<E, R, Streamed> {
    type Service = LeaseService<S, E, R>;

    fn layer(&self, inner: S) -> Self::Service {
        self.service(inner)
    }
}

impl<S, E: Clone, R: Clone> Layer<S> for RwLockLayer<E, R, Buffered> {
    type Service = BufferBody<LeaseService<S, E, R>>;

    fn layer(&self, inner: S) -> Self::Service {
        BufferBody::new(self.service(inner), self.config.clone())
    }
}

impl<E, P> fmt::Debug for LockLayer<E, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<E, R, P> fmt::Debug for RwLockLayer<E, R, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLockLayer")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOCS: RwLock<str> = RwLock::new("docs", Duration::from_secs(3));

    fn linger<E, R, P>(layer: &RwLockLayer<E, R, P>) -> Option<Linger> {
        layer
            .config
            .shared_reads
            .as_ref()
            .map(|reads| reads.linger())
    }

    #[test]
    fn an_rw_layer_waits_by_default_and_a_lock_layer_does_not() {
        const JOB: Lock<str> = Lock::new("job", Duration::from_secs(3));
        let store = Store::memory();
        let rw = RwLockLayer::new(store.clone(), DOCS, crate::extract::path());
        assert_eq!(rw.config.max_wait, DEFAULT_READ_WRITE_WAIT);
        let at_once = rw.max_wait(Duration::ZERO);
        assert_eq!(at_once.config.max_wait, Duration::ZERO);
        let exclusive = LockLayer::new(store, JOB, crate::extract::path());
        assert_eq!(exclusive.config.max_wait, Duration::ZERO, "409 at once");
    }

    #[test]
    fn coalesce_reads_and_linger_reads_do_not_undo_each_other() {
        let store = Store::memory();
        let layer = |store: &Store| RwLockLayer::new(store.clone(), DOCS, crate::extract::path());
        let ms = |ms| Linger(Duration::from_millis(ms));
        assert_eq!(
            linger(&layer(&store)),
            Some(Linger::DEFAULT),
            "coalesced by default"
        );
        let lingering = layer(&store)
            .linger_reads(Duration::from_millis(15))
            .coalesce_reads(true);
        assert_eq!(
            linger(&lingering),
            Some(ms(15)),
            "coalescing keeps the linger"
        );
        let coalesced = layer(&store)
            .coalesce_reads(true)
            .linger_reads(Duration::from_millis(15));
        assert_eq!(linger(&coalesced), Some(ms(15)));
        let separate = layer(&store)
            .linger_reads(Duration::from_millis(15))
            .coalesce_reads(false);
        assert_eq!(
            linger(&separate),
            None,
            "false turns sharing, and so lingering, off"
        );
        let again = layer(&store)
            .coalesce_reads(false)
            .linger_reads(Duration::from_millis(15));
        assert_eq!(linger(&again), Some(ms(15)), "a linger implies coalescing");
    }
}
