//! A store seen through a hook: the answer of every acquisition passes through a function of
//! the test's, that counts, times or changes it; everything else goes to the store behind as it
//! is.

use tower_lease::Store;
use tower_lease::backend::{Acquisition, Backend, BoxFuture, Extended, LeaseRef, LockRef, Warning};

/// A [`Store`] over `inner`'s backend whose acquisitions answer `on_acquire(answer)`.
///
/// The new store has waiting rooms of its own: holders and waiters that must meet (a release
/// that wakes a waiter) use this one.
pub fn hooked<F>(inner: Store, on_acquire: F) -> Store
where
    F: Fn(Acquisition) -> Acquisition + Send + Sync + 'static,
{
    Store::from_backend(Hooked { inner, on_acquire })
}

struct Hooked<F> {
    inner: Store,
    on_acquire: F,
}

impl<F> Backend for Hooked<F>
where
    F: Fn(Acquisition) -> Acquisition + Send + Sync + 'static,
{
    fn acquire<'a>(
        &'a self,
        lease: LeaseRef<'a>,
    ) -> BoxFuture<'a, tower_lease::Result<Acquisition>> {
        Box::pin(async move {
            let answer = self.inner.backend().acquire(lease).await?;
            Ok((self.on_acquire)(answer))
        })
    }

    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, tower_lease::Result<Extended>> {
        self.inner.backend().extend(lease)
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, tower_lease::Result<bool>> {
        self.inner.backend().release(lease)
    }

    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, tower_lease::Result<u32>> {
        self.inner.backend().in_use(lock)
    }

    fn extend_many<'a>(
        &'a self,
        leases: &'a [LeaseRef<'a>],
    ) -> BoxFuture<'a, Vec<tower_lease::Result<Extended>>> {
        self.inner.backend().extend_many(leases)
    }

    fn check(&self) -> BoxFuture<'_, tower_lease::Result<Vec<Warning>>> {
        self.inner.backend().check()
    }
}
