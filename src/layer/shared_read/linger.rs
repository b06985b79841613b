//! A share with no request left, kept for the next read of its name a moment.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{Share, SharedReads};
use crate::backend::BoxFuture;
use crate::lease::kept::KeptLease;

/// How long a share whose requests overlapped (a name read by several requests at once) waits
/// for the next read of its name after its last request finished: hot names keep their lease
/// between reads a fraction of a millisecond apart. A share that only ever had one request is
/// released at once, so names read one at a time pay nothing; zero releases every share at
/// once.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Linger(pub(crate) Duration);

impl Linger {
    /// By default: one tick of tokio's timer. The gaps between the reads of a hot name are far
    /// shorter; the last read of a burst is answered that much later at most.
    pub(crate) const DEFAULT: Linger = Linger(Duration::from_millis(1));

    /// How long `share`, whose last request just left, lingers.
    pub(super) fn of(self, share: &Share) -> Duration {
        match share.overlapped.load(Ordering::Relaxed) {
            true => self.0,
            false => Duration::ZERO,
        }
    }
}

/// Keeps `share`, which has no request left, for the layer's linger (at most a quarter of a
/// heartbeat interval) after its last request left, or until a write intent is heard, then
/// releases it if still no request is in it, and settles it. A name's reads often end in a
/// burst, and the next burst would otherwise wait a round trip for a fresh lease.
///
/// One task per share at a time: a request that comes and goes meanwhile moves the end of the
/// linger, and one still in the share when it ends hands the share back to its own leave.
pub(super) async fn linger(reads: Arc<SharedReads>, share: Arc<Share>) {
    let Some(held) = share.held() else {
        share.settle(u64::MAX);
        return;
    };
    let linger = reads.linger.of(&share).min(held.timing.every / 4);
    let mut until = emptied(&reads, &share) + linger;
    loop {
        let intent = match &held.intent {
            Some(intent) => {
                let heard = intent.notified();
                if !intent.raised() {
                    let _ = tokio::time::timeout_at(until, heard).await;
                }
                intent.raised()
            }
            None => {
                tokio::time::sleep_until(until).await;
                false
            }
        };
        let lease = {
            let mut shares = reads.lock();
            if share.members.load(Ordering::Relaxed) != 0 {
                // In use again: its last request's leave lingers anew.
                share.lingering.store(false, Ordering::Relaxed);
                return;
            }
            let last = *share.emptied.lock().unwrap_or_else(|e| e.into_inner());
            if !intent && last + linger > until {
                // Requests came and went: the linger counts from the last one's leave.
                until = last + linger;
                continue;
            }
            if shares
                .get(&share.name)
                .is_some_and(|other| Arc::ptr_eq(other, &share))
            {
                shares.remove(&share.name);
            }
            share.take_lease()
        };
        // Without a lease here, whoever took it (a write's `end_linger`) settles the share
        // once it has released it.
        if let Some(lease) = lease {
            release_and_settle(lease, share).await;
        }
        return;
    }
}

/// When `share` last lost its last request, read under the registry's lock.
fn emptied(reads: &SharedReads, share: &Share) -> Instant {
    let _shares = reads.lock();
    *share.emptied.lock().unwrap_or_else(|e| e.into_inner())
}

impl SharedReads {
    /// Ends the linger of `name`'s share, if it has no request left: the lease to release, so
    /// that a write of the name in this layer never waits for (or is refused by) the layer's
    /// own idle share.
    pub(crate) fn end_linger(&self, name: &[u8]) -> Option<IdleShare> {
        let mut shares = self.lock();
        let share = shares.get(name)?;
        if share.members.load(Ordering::Relaxed) != 0 {
            return None;
        }
        let share = shares.remove(name)?;
        drop(shares);
        // Out of the registry with no request left: its linger task finds the lease gone.
        let lease = Some(share.take_lease()?);
        Some(IdleShare { share, lease })
    }
}

/// A lingering share taken out of the registry with its lease: released, it settles the share,
/// so the answer of its last request goes out.
pub(crate) struct IdleShare {
    share: Arc<Share>,
    /// Taken by the release.
    lease: Option<KeptLease>,
}

impl IdleShare {
    /// Releases the lease; the future resolves when the store has answered.
    pub(crate) fn release(mut self) -> BoxFuture<'static, ()> {
        let lease = self.lease.take().expect("released once");
        Box::pin(release_and_settle(lease, self.share.clone()))
    }
}

impl Drop for IdleShare {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        // Dropped unreleased: released in the background all the same, and settled after it.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(release_and_settle(lease, self.share.clone()));
            }
            Err(_) => {
                drop(lease);
                self.share.settle(u64::MAX);
            }
        }
    }
}

/// Releases `share`'s lease, then settles the share: its last request's answer goes out.
async fn release_and_settle(lease: KeptLease, share: Arc<Share>) {
    lease.release().await;
    share.settle(u64::MAX);
}
