//! [`Backend`] for [`MemoryStore`]: each call done at once under the store's lock.

use std::time::Duration;

use tokio::time::Instant;

use super::MemoryStore;
use tower_lease::Result;
use tower_lease::backend::{
    Acquisition, Backend, Begin, BoxFuture, Completion, Extended, FINGERPRINT_LEN, LeaseRef,
    LockRef, Mode, NotificationSink,
};

use super::Bug;

fn unsupported() -> tower_lease::Error {
    tower_lease::Error::Backend("reservations are taken by idempotency_begin".into())
}

impl Backend for MemoryStore {
    fn acquire<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Acquisition>> {
        if lease.mode == Mode::Reservation {
            return Box::pin(async { Err(unsupported()) });
        }
        Box::pin(async move {
            if self.bug == Bug::AcquireHangs && lease.mode == Mode::Exclusive {
                std::future::pending::<()>().await;
            }
            let connection = self.connection().await;
            let acquisition = self.acquire_now(lease);
            if let (Some(connection), Acquisition::Acquired { .. }) = (connection, &acquisition) {
                connection.forget();
            }
            Ok(acquisition)
        })
    }

    fn idempotency_begin<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        fingerprint: &'a [u8; FINGERPRINT_LEN],
    ) -> BoxFuture<'a, Result<Begin>> {
        Box::pin(async move {
            let _connection = self.connection().await;
            Ok(self.idempotency.begin(lease, fingerprint, None))
        })
    }

    fn idempotency_begin_once<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        fingerprint: &'a [u8; FINGERPRINT_LEN],
        retention: Duration,
    ) -> BoxFuture<'a, Result<Begin>> {
        let once = Some(retention);
        Box::pin(async move {
            let _connection = self.connection().await;
            Ok(self.idempotency.begin(lease, fingerprint, once))
        })
    }

    fn idempotency_free<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let _connection = self.connection().await;
            let freed = self.idempotency.free(lease);
            if freed {
                self.announce_release(lease);
            }
            Ok(freed)
        })
    }

    fn idempotency_complete<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        completion: Completion<'a>,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let _connection = self.connection().await;
            let completed = self.idempotency.complete(lease, completion);
            if completed {
                self.announce_release(lease);
            }
            Ok(completed)
        })
    }

    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Extended>> {
        Box::pin(async move {
            let _connection = self.connection().await;
            Ok(match self.update_now(lease, true) {
                false => Extended::Gone,
                true if self.writer_waits(lease) => Extended::HeldWriterWaiting,
                true => Extended::Held,
            })
        })
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let _connection = self.connection().await;
            let release = || self.update_now(lease, false);
            Ok(self.release_and_announce(lease, release).await)
        })
    }

    fn withdraw_intent<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let _connection = self.connection().await;
            let withdrawn = lease.mode == Mode::Write && self.withdraw_now(lease);
            if withdrawn {
                self.announce_release(lease);
            }
            Ok(withdrawn)
        })
    }

    fn notify_to(&self, sink: NotificationSink) -> bool {
        self.listen(sink)
    }

    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, Result<u32>> {
        Box::pin(async move {
            if self.bug == Bug::Hangs {
                std::future::pending::<()>().await;
            }
            let _connection = self.connection().await;
            let now = Instant::now();
            let state = self.lock();
            let permits = state
                .namespaces
                .get(lock.namespace)
                .and_then(|ns| ns.semaphores.get(lock.name));
            let live = permits.map_or(0, |permits| {
                let counted = |ends: &Instant| ends > &now || self.bug == Bug::InUseCountsExpired;
                permits.values().filter(|ends| counted(ends)).count()
            });
            Ok(live as u32)
        })
    }
}
