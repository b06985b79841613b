//! The [`Lease`] request extension, the heartbeat that keeps a lease alive, and the guard that
//! owns both.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::Context;
use std::time::Duration;

use tokio::time::{Instant, Sleep, sleep_until};
use tokio_util::sync::CancellationToken;

use super::heartbeat::Beats;
use crate::store::{BoxFuture, Mode};
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
    shared: Arc<Shared>,
}

impl Lease {
    /// The locked name, as the extractor produced it.
    pub fn name(&self) -> &[u8] {
        self.shared.held.name()
    }

    /// The lock's namespace.
    pub fn namespace(&self) -> &'static str {
        self.shared.held.namespace()
    }

    /// Which lease this is: [`Mode::Exclusive`] under [`LockLayer`](crate::LockLayer),
    /// [`Mode::Read`] or [`Mode::Write`] under [`RwLockLayer`](crate::RwLockLayer).
    pub fn mode(&self) -> Mode {
        self.shared.held.mode()
    }

    /// The fencing token of this acquisition when the lock is
    /// [fenced](crate::Lock::fenced): pass it to the resource so it can refuse writes from a
    /// holder whose lease has run out.
    pub fn fence(&self) -> Option<u64> {
        self.shared.held.fence()
    }

    /// Whether the lease is still held: not lost, not released, and not past the end of its
    /// last confirmed extension on this process's monotonic clock.
    pub fn is_held(&self) -> bool {
        !self.shared.gone.is_cancelled() && Instant::now() < self.shared.valid_until()
    }

    /// Resolves once the lease is no longer held: lost, or released after the response.
    ///
    /// The future owns what it needs, so it can be moved into a spawned task.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.shared.gone.clone().cancelled_owned()
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

/// What the guard, the heartbeat and every [`Lease`] clone share.
pub(super) struct Shared {
    pub(super) held: Holding,
    /// The end of the lease as last confirmed, minus the drift margin.
    valid_until: Mutex<Instant>,
    /// Cancelled when the lease is lost or released.
    pub(super) gone: CancellationToken,
}

impl Shared {
    pub(super) fn valid_until(&self) -> Instant {
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a confirmed acquire or extend whose command left at `sent_at`.
    ///
    /// Counting from before the command was sent, not from when the answer came, means a slow
    /// round trip shortens our idea of the lease rather than stretching it past the store's.
    pub(super) fn confirm(&self, sent_at: Instant) {
        let ttl = self.held.ttl();
        // Redlock's allowance for the store's clock running faster than ours.
        let margin = ttl / 100 + Duration::from_millis(2);
        let until = sent_at + ttl.saturating_sub(margin);
        *self.valid_until.lock().unwrap_or_else(|e| e.into_inner()) = until;
    }
}

/// Owns a held lease: its place in the layer's heartbeat, and its release.
///
/// Dropped without [`release`](Self::release) (the client went away, the future or body was
/// dropped), it stops the heartbeat and spawns the release, so the lock is free in about one
/// round trip instead of after the TTL.
pub(crate) struct LeaseGuard {
    shared: Option<Arc<Shared>>,
    heartbeat: Beat,
}

/// The heartbeat's life: due, running, or stopped for the release.
enum Beat {
    /// Not handed to the driver yet. Most requests end before the first extension is due, and
    /// registering and deregistering each of them would cost as much as the lock's own round
    /// trips; so the response future waits on this timer while it is polled anyway, and
    /// registers the lease only when it fires (or when the body takes the lease, as nobody may
    /// poll that).
    Due {
        first: Pin<Box<Sleep>>,
        acquired_at: Instant,
        config: Heartbeat,
    },
    /// In the care of the layer's heartbeat driver.
    Running {
        beats: Beats,
    },
    Stopped,
}

/// When and for how long the heartbeat extends a lease.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Heartbeat {
    pub(crate) every: Duration,
    pub(crate) max_hold: Option<Duration>,
}

impl LeaseGuard {
    /// Takes charge of `held`, acquired by a command sent at `sent_at`; its heartbeat starts
    /// when the first extension is due (see [`poll_heartbeat`](Self::poll_heartbeat)).
    pub(crate) fn start(held: Holding, sent_at: Instant, config: Heartbeat) -> Self {
        let shared = Arc::new(Shared {
            held,
            valid_until: Mutex::new(sent_at),
            gone: CancellationToken::new(),
        });
        shared.confirm(sent_at);
        tracing::debug!(
            namespace = shared.held.namespace(),
            mode = ?shared.held.mode(),
            fence = shared.held.fence(),
            "lease acquired"
        );
        LeaseGuard {
            shared: Some(shared),
            heartbeat: Beat::Due {
                first: Box::pin(sleep_until(sent_at + config.every)),
                acquired_at: sent_at,
                config,
            },
        }
    }

    /// Hands the lease to the heartbeat driver `beats` once the first extension is due; the
    /// caller's task is woken then. Must be called within a tokio runtime.
    pub(crate) fn poll_heartbeat(&mut self, cx: &mut Context<'_>, beats: &Beats) {
        if let Beat::Due { first, .. } = &mut self.heartbeat
            && first.as_mut().poll(cx).is_ready()
        {
            self.spawn_heartbeat(beats);
        }
    }

    /// Hands the lease to the heartbeat driver `beats` now if it is not there yet: from here on
    /// the lease must be kept alive whether or not anyone polls. Must be called within a tokio
    /// runtime.
    pub(crate) fn spawn_heartbeat(&mut self, beats: &Beats) {
        let Beat::Due {
            acquired_at,
            config,
            ..
        } = self.heartbeat
        else {
            return;
        };
        let shared = self.shared().clone();
        beats.register(shared, acquired_at, config.every, config.max_hold);
        self.heartbeat = Beat::Running {
            beats: beats.clone(),
        };
    }

    /// Ends the lease's heartbeat: `gone` is cancelled first, so the driver sends no extend
    /// for it from now on.
    fn stop(&mut self, shared: &Shared) {
        shared.gone.cancel();
        if let Beat::Running { beats } = std::mem::replace(&mut self.heartbeat, Beat::Stopped) {
            beats.deregister();
        }
    }

    pub(super) fn shared(&self) -> &Arc<Shared> {
        self.shared.as_ref().expect("guard used after release")
    }

    /// The request extension for this lease.
    pub(crate) fn lease(&self) -> Lease {
        Lease {
            shared: self.shared.clone().expect("guard used after release"),
        }
    }

    /// Whether the lease was valid at `at` and has not been declared lost.
    pub(crate) fn valid_at(&self, at: Instant) -> bool {
        let shared = self.shared();
        !shared.gone.is_cancelled() && at < shared.valid_until()
    }

    /// Resolves when the heartbeat declares the lease lost (or it is released).
    pub(crate) fn gone(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.shared().gone.clone().cancelled_owned()
    }

    /// Stops the heartbeat and gives the lease back; the future resolves when the store has
    /// answered. Failures are logged: the TTL frees the lock anyway.
    pub(crate) fn release(mut self) -> BoxFuture<'static, ()> {
        let shared = self.shared.take().expect("guard released twice");
        // Stop extending first, so no extend races the release.
        self.stop(&shared);
        Box::pin(release(shared))
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        self.stop(&shared);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(release(shared));
            }
            Err(_) => {
                shared.gone.cancel();
                tracing::warn!(
                    namespace = shared.held.namespace(),
                    "lease dropped outside a tokio runtime; it stays held until its TTL runs out"
                );
            }
        }
    }
}

impl fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseGuard").finish_non_exhaustive()
    }
}

async fn release(shared: Arc<Shared>) {
    let namespace = shared.held.namespace();
    match shared.held.release().await {
        Ok(true) => tracing::debug!(namespace, "lease released"),
        Ok(false) => tracing::debug!(namespace, "lease had already run out at release"),
        Err(error) => tracing::warn!(
            namespace,
            %error,
            "releasing the lease failed; it stays held until its TTL runs out"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;
    use crate::lock::Spec;
    use crate::token::Attempt;
    use crate::{Lock, Store};

    const LOCK: Lock<str> = Lock::new("beat", Duration::from_millis(300));

    async fn guard(store: &Store, heartbeat: Heartbeat) -> (LeaseGuard, Instant) {
        let spec: Spec = LOCK.spec();
        let sent_at = Instant::now();
        let held = match Holding::acquire(store.clone(), spec, Mode::Exclusive, Cow::Borrowed(b"x"))
            .await
            .unwrap()
        {
            Attempt::Acquired(held) => held,
            Attempt::Busy { .. } => panic!("free at first"),
        };
        let mut guard = LeaseGuard::start(held, sent_at, heartbeat);
        guard.spawn_heartbeat(&Beats::default());
        (guard, sent_at)
    }

    #[tokio::test(start_paused = true)]
    async fn the_heartbeat_starts_when_its_first_beat_is_due_under_a_polling_future() {
        let store = Store::memory();
        let heartbeat = Heartbeat {
            every: Duration::from_millis(100),
            max_hold: None,
        };
        let (held, sent_at) = match Holding::acquire(
            store.clone(),
            LOCK.spec(),
            Mode::Exclusive,
            Cow::Borrowed(b"lazy"),
        )
        .await
        .unwrap()
        {
            Attempt::Acquired(held) => (held, Instant::now()),
            Attempt::Busy { .. } => panic!("free at first"),
        };
        let mut guard = LeaseGuard::start(held, sent_at, heartbeat);
        assert!(
            matches!(guard.heartbeat, Beat::Due { .. }),
            "no task before it is due"
        );

        // What the response future does while the handler runs: poll, and be woken on time.
        let beats = Beats::default();
        let polling = std::future::poll_fn(|cx| {
            guard.poll_heartbeat(cx, &beats);
            std::task::Poll::<()>::Pending
        });
        let _ = tokio::time::timeout(Duration::from_millis(150), polling).await;
        assert!(
            matches!(guard.heartbeat, Beat::Running { .. }),
            "registered when due"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            guard.valid_at(Instant::now()),
            "the driver extends it on its own"
        );
        assert!(LOCK.try_lock(&store, "lazy").await.unwrap().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_heartbeat_keeps_the_lease_and_max_hold_ends_it_at_the_margin() {
        let store = Store::memory();
        let heartbeat = Heartbeat {
            every: Duration::from_millis(100),
            max_hold: Some(Duration::from_millis(250)),
        };
        let (guard, acquired) = guard(&store, heartbeat).await;
        let lease = guard.lease();

        // Extends at 100 and 200 ms; none at 300 ms (past max_hold), so the lease counts as
        // lost at 200 + 300 − (3 + 2) ms = 495 ms, just before the store's end at 500 ms.
        lease.lost().await;
        assert_eq!(acquired.elapsed(), Duration::from_millis(495));
        assert!(!lease.is_held());
        assert!(!guard.valid_at(Instant::now()));
        assert!(
            LOCK.try_lock(&store, "x").await.unwrap().is_none(),
            "still in the store"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(LOCK.try_lock(&store, "x").await.unwrap().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_stays_valid_while_extended_and_release_ends_it() {
        let store = Store::memory();
        let heartbeat = Heartbeat {
            every: Duration::from_millis(100),
            max_hold: None,
        };
        let (guard, _) = guard(&store, heartbeat).await;
        let lease = guard.lease();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(lease.is_held() && guard.valid_at(Instant::now()));
        assert!(LOCK.try_lock(&store, "x").await.unwrap().is_none());

        guard.release().await;
        assert!(!lease.is_held());
        lease.lost().await;
        assert!(LOCK.try_lock(&store, "x").await.unwrap().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_guard_releases_in_the_background() {
        let store = Store::memory();
        let heartbeat = Heartbeat {
            every: Duration::from_millis(100),
            max_hold: None,
        };
        let (guard, _) = guard(&store, heartbeat).await;
        drop(guard);
        tokio::task::yield_now().await;
        assert!(LOCK.try_lock(&store, "x").await.unwrap().is_some());
    }
}
