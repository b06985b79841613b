//! [`Held`]: a lease kept alive by the store's heartbeat while any code works, for jobs that
//! are not requests (a cron run, a queue consumer, a reindex).

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::time::Instant;
use tokio_util::sync::WaitForCancellationFuture;

use super::handle::Lease;
use super::kept::KeptLease;
use crate::Result;
use crate::lease::finish_on_drop::FinishOnDrop;
use crate::store::LeaseState;
use crate::store::heartbeat::HeartbeatTiming;
use crate::store::raw::RawLease;

/// A lease whose heartbeat runs: made from a token by `keep_alive()`
/// ([`LockToken::keep_alive`](crate::LockToken::keep_alive),
/// [`ReadToken::keep_alive`](crate::ReadToken::keep_alive),
/// [`Permit::keep_alive`](crate::Permit::keep_alive)).
///
/// ```
/// use std::time::Duration;
/// use tower_lease::{Lock, Store};
///
/// const INVOICES: Lock<u64> = Lock::new("invoice", Duration::from_secs(30)).fenced();
///
/// async fn write_totals(invoice: u64, fence: Option<u64>) -> u64 { invoice }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_lease::Error> {
/// let store = Store::memory();
/// let Some(token) = INVOICES.try_lock(&store, &42).await? else {
///     return Ok(()); // another replica is on it
/// };
/// let held = token.keep_alive(); // extended every ttl / 3 from now on
/// let done = held.run(write_totals(42, held.fence())).await; // None: the lease was lost
/// assert_eq!(done, Some(42));
/// assert!(held.release().await?);
/// # Ok(())
/// # }
/// ```
///
/// The store's heartbeat (one task per [`Store`](crate::Store), shared with the layers, and
/// batching the extensions that fall due together) extends the lease every third of its TTL.
/// The lease is lost when the store says it is gone, or when no extension was confirmed before
/// it would have run out on this process's monotonic clock (counted from when each acquire or
/// extend was *sent*, less a drift margin); [`is_held`](Self::is_held) turns `false` and
/// [`lost`](Self::lost) resolves then.
///
/// Dropping a `Held` stops its heartbeat and releases the lease in a spawned task, bounded by
/// the store's timeout (unlike a bare token, whose drop never talks to the store); outside a
/// tokio runtime it can only log, and the TTL frees the lock.
/// `into_token()` stops the heartbeat without releasing and gives the token back: the lease runs
/// out one TTL after its last extension.
#[must_use = "dropping a Held releases its lease at once"]
pub struct Held<T> {
    own: KeptLease,
    token: PhantomData<fn() -> T>,
}

impl<T> Held<T> {
    /// Keeps `holding` alive in its store's heartbeat, from its last confirmed acquire or
    /// extend on.
    pub(crate) fn new(holding: RawLease) -> Self {
        let timing = HeartbeatTiming::for_ttl(holding.ttl());
        let (sent_at, heartbeat) = (holding.confirmed_at(), holding.store().heartbeat().clone());
        let mut own = KeptLease::new(holding, sent_at, timing);
        own.enrol_now(&heartbeat);
        Self {
            own,
            token: PhantomData,
        }
    }

    fn state(&self) -> &LeaseState {
        self.own.state()
    }

    /// The fencing token of the acquisition (for a reader, the last writer's), when the lock is
    /// fenced: pass it to the resource so it can refuse a stale holder's writes.
    pub fn fence(&self) -> Option<u64> {
        self.state().holding.fence()
    }

    /// Whether the lease is still held: not lost, and not past the end of its last confirmed
    /// extension on this process's monotonic clock.
    pub fn is_held(&self) -> bool {
        self.state().valid_at(Instant::now())
    }

    /// Resolves once the lease is lost. The future owns what it needs, so it can be moved into
    /// a spawned task.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static + use<T> {
        self.lease().lost()
    }

    /// The handle on this lease that the layers put in request extensions: one type for
    /// handlers and jobs, cheap to clone and to pass into spawned work.
    pub fn lease(&self) -> Lease {
        self.own.lease()
    }

    /// The locked name, as encoded by [`LockName`](crate::LockName).
    pub fn name(&self) -> &[u8] {
        self.state().holding.name()
    }

    /// The namespace of the lock.
    pub fn namespace(&self) -> &'static str {
        self.state().holding.namespace()
    }

    /// How long the lease lasts from each extension.
    pub fn ttl(&self) -> Duration {
        self.state().holding.ttl()
    }

    /// Runs `work` under the lease: `Some` with its output when it finished while the lease was
    /// held, `None` when the lease was lost first (`work` is dropped at once, cancelling it at
    /// its next `.await`) or had run out by the time it finished.
    ///
    /// The lease's expiry is checked before every poll of `work`: a process frozen past its lease
    /// (SIGSTOP, a pause, a starved executor) drops the work when it wakes, before its next
    /// step. A step the work had already sent on its way (a write) is not undone; a
    /// [fence](Self::fence) checked by the resource catches it.
    pub fn run<F: Future>(&self, work: F) -> Run<'_, F> {
        let state = self.state();
        Run {
            state,
            ended: state.ended().cancelled(),
            work,
        }
    }

    /// Stops the heartbeat and answers the lease, still held, for a token (`into_token`).
    pub(crate) fn into_holding(self) -> RawLease {
        let state = self.own.stop();
        state.holding.hand_over()
    }

    /// Stops the heartbeat and gives the lease up so others can take it at once.
    ///
    /// Answers `false` when the lease had already run out (someone else may hold the lock now,
    /// and their lease is left alone). Once polled, the release runs to its end even if this
    /// future is dropped (a `select!` with a shutdown branch, a timeout): the heartbeat has
    /// stopped by then, so the release goes on in a spawned task rather than leave the lease
    /// to its TTL.
    pub async fn release(self) -> Result<bool> {
        let state = self.own.stop();
        FinishOnDrop::to_the_end(Box::pin(async move { state.holding.release().await })).await
    }
}

impl<T> fmt::Debug for Held<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Held")
            .field("lease", &self.lease())
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// The future of [`Held::run`].
    #[must_use = "futures do nothing unless polled"]
    pub struct Run<'a, F> {
        state: &'a LeaseState,
        #[pin]
        ended: WaitForCancellationFuture<'a>,
        #[pin]
        work: F,
    }
}

impl<F: Future> Future for Run<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        // Before every poll of the work, as the layer does: a frozen process that wakes past
        // its lease must not take the work's next step.
        if this.state.over_at(Instant::now()) {
            return Poll::Ready(None);
        }
        if let Poll::Ready(output) = this.work.poll(cx) {
            // The same rule as the layer's: an output is only worth having if the lease was
            // still ours when it was produced.
            let held = !this.state.over_at(Instant::now());
            return Poll::Ready(held.then_some(output));
        }
        if this.ended.poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        Poll::Pending
    }
}

impl<F> fmt::Debug for Run<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Run").finish_non_exhaustive()
    }
}
