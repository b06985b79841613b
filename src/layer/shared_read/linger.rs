//! A share with no request left, kept for the next read of its name a moment.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::{Share, SharedReads};

/// Keeps `share`, which has no request left, for the layer's linger (at most a quarter of a
/// heartbeat interval) or until a write intent is heard, then releases it if still no request
/// joined meanwhile. A name's reads often end in a burst, and the next burst would otherwise
/// wait a round trip for a fresh lease.
pub(super) async fn linger(reads: Arc<SharedReads>, share: Arc<Share>) {
    let Some(held) = share.held() else {
        return;
    };
    let linger = reads.linger.min(held.timing.every / 4);
    match &held.intent {
        Some(intent) => {
            let heard = intent.notified();
            if !intent.raised() {
                let _ = tokio::time::timeout(linger, heard).await;
            }
        }
        None => tokio::time::sleep(linger).await,
    }
    let lease = {
        let mut shares = reads.lock();
        if share.members.load(Ordering::Relaxed) != 0 {
            // Joined meanwhile: its last request's leave decides again.
            return;
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
}
