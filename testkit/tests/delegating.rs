//! The suite on a backend written outside tower-lease: a wrapper that hands every call to the
//! memory store, as the crate documentation shows, and wipes it for the data-loss hook.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tower_lease::Store;
use tower_lease::backend::{
    Acquisition, Backend, Begin, BoxFuture, Completion, Extended, FINGERPRINT_LEN, LeaseRef,
    LockRef,
};
use tower_lease::store::MemoryStore;
use tower_lease_testkit::Env;

/// The memory store it hands calls to, replaced by an empty one when the data is lost.
#[derive(Clone, Default)]
struct Delegating(Arc<Mutex<Arc<MemoryStore>>>);

impl Delegating {
    fn inner(&self) -> Arc<MemoryStore> {
        self.0.lock().unwrap().clone()
    }

    fn lose_data(&self) {
        *self.0.lock().unwrap() = Arc::default();
    }
}

impl Backend for Delegating {
    fn acquire<'a>(
        &'a self,
        lease: LeaseRef<'a>,
    ) -> BoxFuture<'a, tower_lease::Result<Acquisition>> {
        let inner = self.inner();
        Box::pin(async move { inner.acquire(lease).await })
    }
    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, tower_lease::Result<Extended>> {
        let inner = self.inner();
        Box::pin(async move { inner.extend(lease).await })
    }
    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, tower_lease::Result<bool>> {
        let inner = self.inner();
        Box::pin(async move { inner.release(lease).await })
    }
    fn withdraw_intent<'a>(
        &'a self,
        lease: LeaseRef<'a>,
    ) -> BoxFuture<'a, tower_lease::Result<bool>> {
        let inner = self.inner();
        Box::pin(async move { inner.withdraw_intent(lease).await })
    }
    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, tower_lease::Result<u32>> {
        let inner = self.inner();
        Box::pin(async move { inner.in_use(lock).await })
    }
    fn idempotency_begin<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        fingerprint: &'a [u8; FINGERPRINT_LEN],
    ) -> BoxFuture<'a, tower_lease::Result<Begin>> {
        let inner = self.inner();
        Box::pin(async move { inner.idempotency_begin(lease, fingerprint).await })
    }
    fn idempotency_begin_once<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        fingerprint: &'a [u8; FINGERPRINT_LEN],
        retention: Duration,
    ) -> BoxFuture<'a, tower_lease::Result<Begin>> {
        let inner = self.inner();
        Box::pin(async move {
            inner
                .idempotency_begin_once(lease, fingerprint, retention)
                .await
        })
    }
    fn idempotency_complete<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        completion: Completion<'a>,
    ) -> BoxFuture<'a, tower_lease::Result<bool>> {
        let inner = self.inner();
        Box::pin(async move { inner.idempotency_complete(lease, completion).await })
    }
    fn idempotency_free<'a>(
        &'a self,
        lease: LeaseRef<'a>,
    ) -> BoxFuture<'a, tower_lease::Result<bool>> {
        let inner = self.inner();
        Box::pin(async move { inner.idempotency_free(lease).await })
    }
}

fn env() -> Env {
    let backend = Delegating::default();
    let wipe = backend.clone();
    Env::new(Store::from_backend(backend)).with_data_loss(move || {
        wipe.lose_data();
        Box::pin(async {})
    })
}

// One test per scenario, under tokio's paused clock, which the memory store follows.
tower_lease_testkit::conformance!(paused: env());
