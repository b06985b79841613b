//! [`Lease`]: the handle on a held lease that handlers and jobs share.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use tokio::time::Instant;

use super::left::LeftShare;
use crate::backend::Mode;
use crate::store::LeaseState;

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
    /// For a request that shares a read lease with others: set when this request is done with
    /// it, which may be long before the shared lease ends.
    share: Option<LeftShare>,
}

impl Lease {
    pub(crate) fn new(state: Arc<LeaseState>) -> Self {
        Self { state, share: None }
    }

    /// The extension of one request among those sharing the read lease of `state`; `left` is
    /// set when the request is done with it.
    pub(crate) fn shared(state: Arc<LeaseState>, left: LeftShare) -> Self {
        let share = Some(left);
        Self { state, share }
    }

    /// Whether this request is done with a shared lease.
    fn left(&self) -> bool {
        self.share.as_ref().is_some_and(LeftShare::is_set)
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
    /// [`Mode::Permit`] under [`SemaphoreLayer`](crate::SemaphoreLayer); never
    /// [`Mode::Reservation`], which only a [`Backend`](crate::backend::Backend) meets.
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
    /// last confirmed extension on this process's monotonic clock. For a read that shares its
    /// lease with others ([`RwLockLayer::coalesce_reads`](crate::RwLockLayer::coalesce_reads)),
    /// released means this request is done with it, whether or not other requests still share
    /// it.
    pub fn is_held(&self) -> bool {
        !self.left() && self.state.valid_at(Instant::now())
    }

    /// Resolves once the lease is lost: the store no longer holds it for us, or no extension
    /// was confirmed before it would have run out. It never resolves for a lease that is
    /// released normally; use [`ended`](Self::ended) to learn about either.
    ///
    /// The future owns what it needs, so it can be moved into a spawned task.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        let ended = self.ended();
        let (state, share) = (self.state.clone(), self.share.clone());
        async move {
            ended.await;
            let left = share.is_some_and(|left| left.is_set());
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
    pub fn ended(&self) -> impl Future<Output = ()> + Send + 'static + use<> {
        let ended = self.state.ended().clone().cancelled_owned();
        let left = self.share.clone().map(LeftShare::left);
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
