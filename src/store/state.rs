//! [`LeaseState`]: what a lease's holder (a request's guard, a [`Held`](crate::Held)), the
//! heartbeat and every [`Lease`](crate::Lease) handle share about one held lease.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering, fence};
use std::sync::{Mutex, OnceLock};
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::store::raw::{RawLease, valid_for};
use crate::telemetry::{self, LossReason};

/// What the holder, the heartbeat and every [`Lease`](crate::Lease) clone know about one held
/// lease.
///
/// It is one allocation per lease: the end of the lease is a flag and a waker slot in here,
/// not a cancellation token of its own. Only [`Lease::lost`](super::Lease::lost) and [`Lease::ended`](super::Lease::ended) need a
/// token (any number of futures may wait on them), and few handlers call them, so it is made
/// on first use.
pub(crate) struct LeaseState {
    pub(crate) holding: RawLease,
    /// The end of the lease as last confirmed, minus the drift margin.
    valid_until: Mutex<Instant>,
    /// [`LIVE`], [`RELEASED`] or [`LOST`]; it leaves `LIVE` once.
    over: AtomicU8,
    /// The task that polls for the end of an own lease while the inner service runs or the
    /// body streams (the response future or the body, one at a time), woken when it ends. The
    /// requests sharing a read lease wait on the token instead (see `LeaseGuard::poll_lost`).
    end_waker: AtomicWaker,
    /// Cancelled when the lease ends, for [`Lease::lost`](crate::Lease::lost), [`Lease::ended`](crate::Lease::ended) and shared reads.
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
    pub(crate) fn new(holding: RawLease, sent_at: Instant) -> Self {
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

    pub(crate) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the lease was valid at `at` and is not over.
    pub(crate) fn valid_at(&self, at: Instant) -> bool {
        !self.is_over() && at < self.valid_until()
    }

    /// Records a confirmed acquire or extend whose command left at `sent_at`.
    ///
    /// Counting from before the command was sent, not from when the answer came, means a slow
    /// round trip shortens our idea of the lease rather than stretching it past the store's.
    pub(crate) fn confirm(&self, sent_at: Instant) {
        let until = sent_at + valid_for(self.holding.ttl());
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = until;
        // For a token handed back (`Held::into_token`), which counts from there.
        self.holding.confirmed(sent_at);
    }

    /// Records that an extension found a writer waiting for the readers to leave.
    pub(crate) fn writer_waits(&self) {
        self.writer_waiting.store(true, Ordering::Release);
    }

    /// Whether an extension found a writer waiting for the readers to leave.
    pub(crate) fn writer_waiting(&self) -> bool {
        self.writer_waiting.load(Ordering::Acquire)
    }

    /// Whether the lease is lost or released.
    pub(crate) fn is_over(&self) -> bool {
        self.over.load(Ordering::Acquire) != LIVE
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.over.load(Ordering::Acquire) == LOST
    }

    /// Says the lease is lost: [`Lease::lost`](crate::Lease::lost) and [`Lease::ended`](crate::Lease::ended) resolve. Only the first end
    /// counts: a lease already lost or released is left as it is, and counted once.
    pub(crate) fn declare_lost(&self, reason: LossReason) {
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
    /// extension, which declares it lost (`expired`) before the heartbeat has noticed.
    ///
    /// The response future and the body ask this before each poll of the work the lease
    /// guards: a process that was frozen past its lease (SIGSTOP, a pause, a starved executor)
    /// must not take the work's next step when it wakes up.
    pub(crate) fn over_at(&self, now: Instant) -> bool {
        if self.is_over() {
            return true;
        }
        if now < self.valid_until() {
            return false;
        }
        self.declare_lost(LossReason::Expired);
        true
    }

    /// Says the lease is over without being lost (it is being released).
    pub(crate) fn end(&self) {
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
    pub(crate) fn ended(&self) -> &CancellationToken {
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
    pub(crate) fn poll_ended(&self, cx: &mut Context<'_>) -> Poll<()> {
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
