//! The [`Lease`] request extension and [`LeaseLost`], the policy for losing one; and
//! [`LeaseState`], what the extension, the guard and the heartbeat share about one lease.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering, fence};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::store::Mode;
use crate::telemetry::{self, LossReason};
use crate::token::Holding;

/// What happens when a lease is lost while the inner service is still working on the request.
///
/// A lease is lost when the store says it is no longer ours (it ran out, or someone deleted
/// it), or when no extension could be confirmed before it would have run out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseLost {
    /// Drop the inner future (cancelling the handler at its next `.await`) and answer `503`.
    /// A response that completes after its lease ran out is replaced by `503` as well, and a
    /// body streamed under [`hold_through_body`](crate::LockLayer::hold_through_body) ends
    /// with an error.
    #[default]
    Abort,
    /// Keep going: only flag the [`Lease`] ([`is_held`](Lease::is_held) turns `false`,
    /// [`lost`](Lease::lost) resolves), so the handler can stop at a point of its choosing.
    Continue,
}

/// The lease a request holds, put in its extensions by the layer.
///
/// ```
/// use axum::Extension;
/// use tower_lease::Lease;
///
/// async fn finalize(Extension(lease): Extension<Lease>) -> String {
///     tokio::select! {
///         // Stop cooperatively when the lease goes away (with `LeaseLost::Continue`; under
///         // the default policy the layer drops this future by itself).
///         () = lease.lost() => "lost the lock, nothing written".to_owned(),
///         () = tokio::time::sleep(std::time::Duration::from_millis(10)) => {
///             format!("finalized under fence {:?}", lease.fence())
///         }
///     }
/// }
/// ```
#[derive(Clone)]
pub struct Lease {
    state: Arc<LeaseState>,
    /// For a request that shares a read lease with others: cancelled when this request is done
    /// with it, which may be long before the shared lease ends.
    share: Option<CancellationToken>,
}

impl Lease {
    pub(super) fn new(state: Arc<LeaseState>) -> Self {
        Self { state, share: None }
    }

    /// The extension of one request among those sharing the read lease of `state`; `left` is
    /// cancelled when the request is done with it.
    pub(super) fn shared(state: Arc<LeaseState>, left: CancellationToken) -> Self {
        let share = Some(left);
        Self { state, share }
    }

    /// Whether this request is done with a shared lease.
    fn left(&self) -> bool {
        self.share
            .as_ref()
            .is_some_and(CancellationToken::is_cancelled)
    }

    /// The locked name, as the extractor produced it.
    pub fn name(&self) -> &[u8] {
        self.state.holding.name()
    }

    /// The lock's namespace.
    pub fn namespace(&self) -> &'static str {
        self.state.holding.namespace()
    }

    /// Which lease this is: [`Mode::Exclusive`] under [`LockLayer`](crate::LockLayer),
    /// [`Mode::Read`] or [`Mode::Write`] under [`RwLockLayer`](crate::RwLockLayer),
    /// [`Mode::Permit`] under [`SemaphoreLayer`](crate::SemaphoreLayer).
    pub fn mode(&self) -> Mode {
        self.state.holding.mode()
    }

    /// The fencing token of this acquisition when the lock is
    /// [fenced](crate::Lock::fenced): pass it to the resource so it can refuse writes from a
    /// holder whose lease has run out.
    pub fn fence(&self) -> Option<u64> {
        self.state.holding.fence()
    }

    /// Whether the lease is still held: not lost, not released, and not past the end of its
    /// last confirmed extension on this process's monotonic clock. For a read that
    /// [shares](crate::layer#shared-reads) its lease, released means this request is done with
    /// it, whether or not other requests still share it.
    pub fn is_held(&self) -> bool {
        !self.left() && self.state.valid_at(Instant::now())
    }

    /// Resolves once the lease is lost: the store no longer holds it for us, or no extension
    /// was confirmed before it would have run out. It never resolves for a lease that is
    /// released normally; use [`ended`](Self::ended) to learn about either.
    ///
    /// The future owns what it needs, so it can be moved into a spawned task.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let ended = self.ended();
        let (state, share) = (self.state.clone(), self.share.clone());
        async move {
            ended.await;
            let left = share.is_some_and(|left| left.is_cancelled());
            if left || !state.is_lost() {
                // Released, not lost: this never resolves.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Resolves once the lease is over: lost, or released after the response (for a shared
    /// read, once this request is done with it).
    ///
    /// The future owns what it needs, so it can be moved into a spawned task.
    pub fn ended(&self) -> impl Future<Output = ()> + Send + 'static {
        let ended = self.state.ended().clone().cancelled_owned();
        let left = self.share.clone().map(CancellationToken::cancelled_owned);
        async move {
            match left {
                // A shared lease ends for this request when it leaves, or when it is lost.
                Some(left) => {
                    futures_util::pin_mut!(ended, left);
                    futures_util::future::select(ended, left).await;
                }
                None => ended.await,
            }
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("namespace", &self.namespace())
            .field("name", &String::from_utf8_lossy(self.name()))
            .field("mode", &self.mode())
            .field("fence", &self.fence())
            .field("is_held", &self.is_held())
            .finish()
    }
}

/// What the guard, the heartbeat and every [`Lease`] clone know about one held lease.
///
/// It is one allocation per lease: the end of the lease is a flag and a waker slot in here,
/// not a cancellation token of its own. Only [`Lease::lost`] and [`Lease::ended`] need a
/// token (any number of futures may wait on them), and few handlers call them, so it is made
/// on first use.
pub(super) struct LeaseState {
    pub(super) holding: Holding,
    /// The end of the lease as last confirmed, minus the drift margin.
    valid_until: Mutex<Instant>,
    /// [`LIVE`], [`RELEASED`] or [`LOST`]; it leaves `LIVE` once.
    over: AtomicU8,
    /// The task that polls for the end of an own lease while the inner service runs or the
    /// body streams (the response future or the body, one at a time), woken when it ends. The
    /// requests sharing a read lease wait on the token instead (see `LeaseGuard::poll_lost`).
    end_waker: AtomicWaker,
    /// Cancelled when the lease ends, for [`Lease::lost`], [`Lease::ended`] and shared reads.
    ended: OnceLock<CancellationToken>,
    /// Set when an extension found a writer waiting (a write intent): a shared read lease
    /// admits no more requests.
    writer_waiting: AtomicBool,
}

const LIVE: u8 = 0;
const RELEASED: u8 = 1;
const LOST: u8 = 2;

impl LeaseState {
    /// The state of `holding`, acquired by a command sent at `sent_at`.
    pub(super) fn new(holding: Holding, sent_at: Instant) -> Self {
        let state = Self {
            holding,
            valid_until: Mutex::new(sent_at),
            over: AtomicU8::new(LIVE),
            end_waker: AtomicWaker::new(),
            ended: OnceLock::new(),
            writer_waiting: AtomicBool::new(false),
        };
        state.confirm(sent_at);
        state
    }

    pub(super) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the lease was valid at `at` and is not over.
    pub(super) fn valid_at(&self, at: Instant) -> bool {
        !self.is_over() && at < self.valid_until()
    }

    /// Records a confirmed acquire or extend whose command left at `sent_at`.
    ///
    /// Counting from before the command was sent, not from when the answer came, means a slow
    /// round trip shortens our idea of the lease rather than stretching it past the store's.
    pub(super) fn confirm(&self, sent_at: Instant) {
        let ttl = self.holding.ttl();
        // Redlock's allowance for the store's clock running faster than ours.
        let margin = ttl / 100 + Duration::from_millis(2);
        let until = sent_at + ttl.saturating_sub(margin);
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = until;
    }

    /// Records that an extension found a writer waiting for the readers to leave.
    pub(super) fn writer_waits(&self) {
        self.writer_waiting.store(true, Ordering::Release);
    }

    /// Whether an extension found a writer waiting for the readers to leave.
    pub(super) fn writer_waiting(&self) -> bool {
        self.writer_waiting.load(Ordering::Acquire)
    }

    /// Whether the lease is lost or released.
    pub(super) fn is_over(&self) -> bool {
        self.over.load(Ordering::Acquire) != LIVE
    }

    fn is_lost(&self) -> bool {
        self.over.load(Ordering::Acquire) == LOST
    }

    /// Says the lease is lost: [`Lease::lost`] and [`Lease::ended`] resolve. Only the first end
    /// counts: a lease already lost or released is left as it is, and counted once.
    pub(super) fn declare_lost(&self, reason: LossReason) {
        if !self.finish(LOST) {
            return;
        }
        let (namespace, mode) = (self.holding.namespace(), self.holding.mode());
        tracing::warn!(
            namespace,
            mode = mode.as_str(),
            reason = reason.as_str(),
            "lease lost"
        );
        telemetry::lost(namespace, mode, reason);
    }

    /// Whether the lease is over at `now`: ended already, or past the end of its last confirmed
    /// extension, which declares it lost (`deadline_passed`) before the heartbeat has noticed.
    ///
    /// The response future and the body ask this before each poll of the work the lease
    /// guards: a process that was frozen past its lease (SIGSTOP, a pause, a starved executor)
    /// must not take the work's next step when it wakes up.
    pub(super) fn over_at(&self, now: Instant) -> bool {
        if self.is_over() {
            return true;
        }
        if now < self.valid_until() {
            return false;
        }
        self.declare_lost(LossReason::DeadlinePassed);
        true
    }

    /// Says the lease is over without being lost (it is being released).
    pub(super) fn end(&self) {
        self.finish(RELEASED);
    }

    /// Leaves `LIVE` for `how` (the first end is the one that counts), and wakes whoever waits;
    /// answers whether this call was the first end.
    fn finish(&self, how: u8) -> bool {
        let first = self
            .over
            .compare_exchange(LIVE, how, Ordering::SeqCst, Ordering::Acquire)
            .is_ok();
        // Pairs with the fence in `ended`: either that call sees the flag, or this one sees
        // its token.
        fence(Ordering::SeqCst);
        if let Some(ended) = self.ended.get() {
            ended.cancel();
        }
        self.end_waker.wake();
        first
    }

    /// The token cancelled at the end of the lease, made on first use.
    pub(super) fn ended(&self) -> &CancellationToken {
        let ended = self.ended.get_or_init(CancellationToken::new);
        fence(Ordering::SeqCst);
        if self.is_over() {
            // It may have ended before the token was there to cancel.
            ended.cancel();
        }
        ended
    }

    /// Ready once the lease has ended; otherwise the task of `cx` is woken when it does. While
    /// the inner service runs, or the body streams, the guard has not released the lease yet,
    /// so an end there is a loss. One poller at a time: the last one registered is woken.
    pub(super) fn poll_ended(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.is_over() {
            return Poll::Ready(());
        }
        self.end_waker.register(cx.waker());
        // It may have ended before the waker was registered.
        if self.is_over() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}
