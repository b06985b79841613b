//! [`LeaseService`]: the one service behind every lease layer (`LockLayer`, `RwLockLayer`,
//! `SemaphoreLayer`): each request under a lease of the layer's lock, read-write lock or
//! semaphore.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use futures_util::FutureExt;
use http::{Request, Response};
use tokio::time::Instant;
use tower_service::Service;

use super::body::LeaseBody;
use super::extract::ExtractName;
use super::extract::NameDefect;
use super::future::ResponseFuture;
use super::hold::guard::{Guarded, LeaseGuard};
use super::options::config::Config;
use super::per_request::{PermitsFor, ReadWhen, SafeMethods, SemaphorePermits};
use super::request_body::timeout_body::TimeoutBody;
use super::shared_read::{Entry, IdleShare, SharedRead, SharedReads};
use crate::backend::{Mode, SHORTEST_RETRY_AFTER};
use crate::definition::Definition;
use crate::definition::attempt::{Attempt, outcome};
use crate::lease::finish_on_drop::{FinishOnDrop, SentAt};
use crate::locks::wait::acquire_within::acquire_within;
use crate::name::owned::OwnedName;
use crate::rejection::{Problem, Reason};
use crate::store::raw::RawLease;
use crate::telemetry;

/// Which leases a service takes: an exclusive lock is the case where every request writes.
#[derive(Clone, Debug)]
pub(crate) enum Access<R, P> {
    /// A [`Lock`](crate::Lock)'s one lease for every request.
    Exclusive,
    /// An [`RwLock`](crate::RwLock)'s read or write lease, as `R` decides per request.
    ReadWrite(R),
    /// One of a [`Semaphore`](crate::Semaphore)'s permits, of as many as `P` allows a request.
    Permits(P),
}

/// The middleware [`LockLayer`](crate::LockLayer), [`RwLockLayer`](crate::RwLockLayer) and
/// [`SemaphoreLayer`](crate::SemaphoreLayer) make. `R` only matters for the second, `P` for the
/// third.
#[derive(Clone)]
pub struct LeaseService<S, E, R = SafeMethods, P = SemaphorePermits> {
    inner: S,
    config: Arc<Config>,
    extractor: E,
    access: Access<R, P>,
}

impl<S, E, R, P> LeaseService<S, E, R, P> {
    pub(crate) fn new(inner: S, config: Arc<Config>, extractor: E, access: Access<R, P>) -> Self {
        Self {
            inner,
            config,
            extractor,
            access,
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, E, R, P, ReqBody, ResBody> Service<Request<ReqBody>> for LeaseService<S, E, R, P>
where
    S: Service<Request<TimeoutBody<ReqBody>>, Response = Response<ResBody>> + Clone,
    ReqBody: http_body::Body,
    ResBody: http_body::Body,
    E: ExtractName<ReqBody>,
    R: ReadWhen<ReqBody>,
    P: PermitsFor<ReqBody>,
{
    type Response = Response<LeaseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let namespace = self.config.definition.namespace;
        // Owned, as the request moves on with the future: in place when short (no allocation).
        let Some(name) = self.extractor.with_name(&req, OwnedName::new) else {
            if self.config.require_name {
                let mode = self.access.mode(&req);
                let span = request_span(namespace, mode);
                span.in_scope(|| tracing::debug!("no lock name, request refused"));
                telemetry::refused(namespace, mode, telemetry::AcquireOutcome::MissingName);
                let config = self.config.clone();
                return ResponseFuture::refused(Problem::from(Reason::MissingName), config, span);
            }
            let req = req.map(TimeoutBody::new);
            return ResponseFuture::unlocked(self.inner.call(req), self.config.clone());
        };
        let mode = self.access.mode(&req);
        let span = request_span(namespace, mode);
        if let Some(defect) = NameDefect::of(name.as_bytes(), self.config.binary_names) {
            span.in_scope(|| tracing::debug!(?defect, "invalid lock name, request refused"));
            telemetry::refused(namespace, mode, telemetry::AcquireOutcome::InvalidName);
            let problem = Problem::invalid_name(defect);
            return ResponseFuture::refused(problem, self.config.clone(), span);
        }
        let Some(definition) = self.access.definition(&req, self.config.definition) else {
            span.in_scope(|| tracing::debug!("a limit of 0 permits, request refused"));
            telemetry::refused(namespace, mode, telemetry::AcquireOutcome::InvalidLimit);
            let problem = Problem::from(Reason::InvalidLimit);
            return ResponseFuture::refused(problem, self.config.clone(), span);
        };
        // A refusal of a permit says the semaphore is full, at this request's limit.
        let full_at = (mode == Mode::Permit).then_some(definition.permits);
        // A refused write's intent holds new reads off only until a client told the shortest
        // `Retry-After` is back: one told to come later would find it gone, and the reads that
        // came meanwhile would refuse it again, at every retry.
        let leaves_intent = mode == Mode::Write && definition.fairness.leaves_write_intent();
        let retry_within = leaves_intent.then_some(SHORTEST_RETRY_AFTER);
        let config = self.config.clone();
        match acquire(&config, definition, mode, name) {
            // A held share: no store call, and the inner service runs now.
            Acquiring::Joined(guard) => {
                ResponseFuture::locked(guard, config, &mut self.inner, req, span)
            }
            Acquiring::Pending(acquire) => {
                // The clone may not be ready; the one `poll_ready` readied goes with this
                // request.
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                let refusal = (full_at, retry_within);
                ResponseFuture::acquiring(acquire, config, inner, req, refusal, span)
            }
        }
    }
}

/// How a request's acquisition stands once the service has sent it on its way.
enum Acquiring {
    /// A read that joined a held share of the layer: its lease is there already.
    Joined(LeaseGuard),
    /// The store's answer (or a share's, or a bounded wait's) is still to come.
    Pending(FinishOnDrop<Guarded>),
}

/// Sends a request's acquisition on one of three ways: a bounded wait (the layer waits and has
/// a place free), a read under read coalescing, or one attempt of its own.
fn acquire(config: &Arc<Config>, definition: Definition, mode: Mode, name: OwnedName) -> Acquiring {
    let shared = config.shared_reads.clone().filter(|_| mode == Mode::Read);
    // A write ends this layer's own idle share of the name first, rather than wait for (or be
    // refused by) its linger.
    let idle = match (mode, &config.shared_reads) {
        (Mode::Write, Some(reads)) => reads.end_linger(name.as_bytes()),
        _ => None,
    };
    let waits = !config.max_wait.is_zero();
    if let Some(reads) = shared.clone().filter(|_| waits) {
        // A read that may wait first asks as one that may not: with the other reads of its
        // name in this layer, through one acquisition, so that reads arriving together hold
        // one lease. Only a refused one waits on its own.
        let entry = reads.enter(name.as_bytes());
        if let Entry::Joined(read) = entry {
            return Acquiring::Joined(joined(read, config));
        }
        let config = config.clone();
        let read = async move {
            let first = shared_read(reads.clone(), entry, config.clone(), name.clone(), true);
            // Finished even if the request is dropped meanwhile, as without a wait.
            let first = FinishOnDrop::guarded(Box::pin(first)).await;
            if !matches!(first, Ok(Attempt::Busy { .. })) {
                return first;
            }
            match WaiterSlot::take(&config) {
                Some(slot) => {
                    waiting(slot, config, definition, mode, name, Some(reads), None).await
                }
                None => {
                    let busy = telemetry::AcquireOutcome::Busy;
                    telemetry::acquisition(definition.namespace, mode, busy);
                    first
                }
            }
        };
        // Dropped with the request (its attempts on the wire finish).
        return Acquiring::Pending(FinishOnDrop::droppable(Box::pin(read)));
    }
    if let Some(slot) = WaiterSlot::take(config) {
        let wait = waiting(slot, config.clone(), definition, mode, name, shared, idle);
        // Dropped with the request (its attempts on the wire finish).
        return Acquiring::Pending(FinishOnDrop::droppable(Box::pin(wait)));
    }
    if let Some(reads) = shared {
        let entry = reads.enter(name.as_bytes());
        if let Entry::Joined(read) = entry {
            return Acquiring::Joined(joined(read, config));
        }
        let read = shared_read(reads, entry, config.clone(), name, false);
        return Acquiring::Pending(FinishOnDrop::guarded(Box::pin(read)));
    }
    let (store, timing) = (config.store.clone(), config.beat.timing());
    let on_store_error = Some(config.on_store_error());
    let attempt = RawLease::acquire_counted(store, definition, mode, name, on_store_error);
    // A named future rather than an `async` block around `attempt`, which would hold it twice
    // (see `SentAt`): this is boxed for every request in flight.
    let guarded = SentAt::new(attempt).map(move |(sent_at, attempt)| {
        attempt.map(|a| a.map(|holding| LeaseGuard::new(holding, sent_at, timing)))
    });
    Acquiring::Pending(match idle {
        None => FinishOnDrop::guarded(Box::pin(guarded)),
        // First polled after the idle share's release: the lease counts from then.
        Some(idle) => FinishOnDrop::guarded(Box::pin(async move {
            FinishOnDrop::release(idle.release()).await;
            guarded.await
        })),
    })
}

/// A request's bounded wait for its lease, in its place among the layer's waiters (`slot`):
/// after the release of the layer's idle share it ended (`idle`), a read joins a held share of
/// `shared` if there is one; otherwise the wait's attempts, and a read's lease is shared
/// afterwards.
async fn waiting(
    slot: WaiterSlot,
    config: Arc<Config>,
    definition: Definition,
    mode: Mode,
    name: OwnedName,
    shared: Option<Arc<SharedReads>>,
    idle: Option<IdleShare>,
) -> Guarded {
    if let Some(idle) = idle {
        // Sent to its end even if the waiting request is dropped meanwhile.
        FinishOnDrop::release(idle.release()).await;
    }
    if let Some(read) = shared
        .as_ref()
        .and_then(|reads| reads.join(name.as_bytes()))
    {
        return Ok(Attempt::Acquired(joined(read, &config)));
    }
    let (store, wait) = (config.store.clone(), config.max_wait);
    let name = name.into_boxed();
    let on_store_error = config.on_store_error();
    let (sent_at, attempt) =
        acquire_within(store, definition, mode, name, wait, on_store_error).await;
    drop(slot);
    let timing = config.beat.timing();
    attempt.map(|attempt| {
        attempt.map(|holding| match &shared {
            Some(reads) => match reads.adopt(holding, sent_at, timing) {
                Ok(read) => LeaseGuard::shared(read),
                Err(own) => LeaseGuard::own(own),
            },
            None => LeaseGuard::new(holding, sent_at, timing),
        })
    })
}

/// A read request's lease under read coalescing: joined, waited for, or acquired for the share
/// (see [`shared_read`](super::shared_read)). Joiners and waiters count in the metrics as
/// acquisitions with the outcome they got, without a store round trip. A refusal is not
/// counted when the request then waits (`then_waits`), which counts once, at the wait's end.
async fn shared_read(
    reads: Arc<SharedReads>,
    mut entry: Entry,
    config: Arc<Config>,
    name: OwnedName,
    then_waits: bool,
) -> Guarded {
    let (namespace, mode) = (config.definition.namespace, Mode::Read);
    let on_store_error = config.on_store_error();
    let counted = |answer: &Guarded| !(then_waits && matches!(answer, Ok(Attempt::Busy { .. })));
    loop {
        let waited = match entry {
            Entry::Joined(read) => return Ok(Attempt::Acquired(joined(read, &config))),
            Entry::Leading(leader) => {
                // Taken before the command leaves, so the lease's end is never overestimated.
                let sent_at = Instant::now();
                let (store, definition) = (config.store.clone(), config.definition);
                let name = Cow::Borrowed(name.as_bytes());
                // Before a wait, counted here, once the answer says whether the request waits.
                let counts_itself = (!then_waits).then_some(on_store_error);
                let attempt =
                    RawLease::acquire_counted(store, definition, mode, name, counts_itself).await;
                let answer = leader.publish(attempt, sent_at, config.beat.timing());
                let answer = answer.map(|attempt| attempt.map(LeaseGuard::shared));
                if then_waits && counted(&answer) {
                    let outcome = outcome(&answer, false, on_store_error);
                    telemetry::acquisition(namespace, mode, outcome);
                }
                return answer;
            }
            Entry::Waiting(waiter) => waiter.outcome().await,
        };
        let Some(answer) = waited else {
            // The leading request went away before it asked: enter again.
            entry = reads.enter(name.as_bytes());
            continue;
        };
        let answer = answer.map(|attempt| attempt.map(LeaseGuard::shared));
        if counted(&answer) {
            telemetry::shared(namespace, mode, outcome(&answer, false, on_store_error));
        }
        return answer;
    }
}

/// The guard of a request that joined a held share, counted as an acquisition without a store
/// round trip.
fn joined(read: SharedRead, config: &Config) -> LeaseGuard {
    let acquired = telemetry::AcquireOutcome::Acquired;
    telemetry::shared(config.definition.namespace, Mode::Read, acquired);
    read.enrol_if_due(&config.heartbeat);
    LeaseGuard::shared(read)
}

/// A request's place among the layer's waiters, given back when it is dropped.
struct WaiterSlot(Arc<AtomicUsize>);

impl WaiterSlot {
    /// A place when the layer waits and has one free; `None` answers at once.
    fn take(config: &Config) -> Option<Self> {
        if config.max_wait.is_zero() {
            return None;
        }
        let waiting = &config.waiting;
        let taken = waiting.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < config.max_waiters).then_some(n + 1)
        });
        taken.ok().map(|_| WaiterSlot(waiting.clone()))
    }
}

impl Drop for WaiterSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The span of one locked request: `tower_lease.request` with the lock's namespace and mode.
///
/// None while no tracing subscriber has been set: a span then only feeds tracing's `log`
/// fallback (its `log` feature, which axum's default features turn on), which records its
/// fields when it is made and checks the `log` crate on every enter and exit, about 350
/// instructions per request for span lines at `TRACE`. Events still reach `log` as before.
fn request_span(namespace: &'static str, mode: Mode) -> tracing::Span {
    if !tracing::dispatcher::has_been_set() {
        return tracing::Span::none();
    }
    tracing::debug_span!("tower_lease.request", namespace, mode = mode.as_str())
}

impl<R, P> Access<R, P> {
    /// The lease `req` takes.
    fn mode<B>(&self, req: &Request<B>) -> Mode
    where
        R: ReadWhen<B>,
    {
        match self {
            Access::Exclusive => Mode::Exclusive,
            Access::ReadWrite(read_when) if read_when.is_read(req) => Mode::Read,
            Access::ReadWrite(_) => Mode::Write,
            Access::Permits(_) => Mode::Permit,
        }
    }

    /// The definition `req` takes its lease under: the layer's, with the request's own permits
    /// for a semaphore; `None` when they are 0.
    fn definition<B>(&self, req: &Request<B>, definition: Definition) -> Option<Definition>
    where
        P: PermitsFor<B>,
    {
        let Access::Permits(permits) = self else {
            return Some(definition);
        };
        match permits.permits_for(req) {
            None => Some(definition),
            Some(0) => None,
            Some(permits) => Some(Definition {
                permits,
                ..definition
            }),
        }
    }
}

impl<S: fmt::Debug, E, R, P> fmt::Debug for LeaseService<S, E, R, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseService")
            .field("inner", &self.inner)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
