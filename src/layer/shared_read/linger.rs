//! A share with no request left, kept for the next read of its name a moment.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use super::{Share, SharedReads};

/// How long a share outlives its last request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Linger {
    /// [`OVERLAPPED`](Self::OVERLAPPED) after the last request of a share whose requests
    /// overlapped (a name read by several requests at once), and not at all after a share
    /// that only ever had one: hot names keep their lease between reads a fraction of a
    /// millisecond apart, and names read one at a time cost nothing more.
    Overlapped,
    /// This long after the last request of every share (zero: released at once).
    For(Duration),
}

impl Linger {
    /// The linger of a share whose requests overlapped, by default: one tick of tokio's timer.
    /// The gaps between the reads of a hot name are far shorter; a writer elsewhere waits
    /// for it at most once, a round trip's worth.
    pub(crate) const OVERLAPPED: Duration = Duration::from_millis(1);

    /// How long `share`, whose last request just left, lingers.
    pub(super) fn of(self, share: &Share) -> Duration {
        match self {
            Linger::For(linger) => linger,
            Linger::Overlapped if share.overlapped.load(Ordering::Relaxed) => Self::OVERLAPPED,
            Linger::Overlapped => Duration::ZERO,
        }
    }
}

impl Default for Linger {
    /// Released at once.
    fn default() -> Self {
        Linger::For(Duration::ZERO)
    }
}

/// Keeps `share`, which has no request left, for the layer's linger (at most a quarter of a
/// heartbeat interval) after its last request left, or until a write intent is heard, then
/// releases it if still no request is in it. A name's reads often end in a burst, and the next
/// burst would otherwise wait a round trip for a fresh lease.
///
/// One task per share at a time: a request that comes and goes meanwhile moves the end of the
/// linger, and one still in the share when it ends hands the share back to its own leave.
pub(super) async fn linger(reads: Arc<SharedReads>, share: Arc<Share>) {
    let Some(held) = share.held() else {
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
        if let Some(lease) = lease {
            lease.release().await;
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
    pub(crate) fn end_linger(&self, name: &[u8]) -> Option<crate::lease::kept::KeptLease> {
        let mut shares = self.lock();
        let share = shares.get(name)?;
        if share.members.load(Ordering::Relaxed) != 0 {
            return None;
        }
        let share = shares.remove(name)?;
        drop(shares);
        // Out of the registry with no request left: its linger task finds the lease gone.
        share.take_lease()
    }
}
