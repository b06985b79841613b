//! A share with no request left, kept for the next read of its name a moment.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::{Share, SharedReads};

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
    let linger = reads.linger.min(held.timing.every / 4);
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
