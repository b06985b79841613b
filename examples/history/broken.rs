//! The broken lock of `--control`: a third-party [`Backend`] over the real Redis store that takes
//! an exclusive lease whoever holds it (a `SET` without `NX`) and releases one without comparing
//! its secret (a bare `DEL`), the two mistakes of hand-written Redis locks. Correct clients over
//! it must show the checker's violations: the proof that it can catch a broken lock, not only a
//! broken client.

use tower_lease::Store;
use tower_lease::backend::{Acquisition, Backend, BoxFuture, Extended, LeaseRef, LockRef, Mode};
use tower_lease::store::{KeyLayout, KeyRole};

/// Wraps `inner`; `raw` reaches the same Redis, for the commands the real scripts would refuse.
pub fn broken(inner: Store, raw: redis::aio::ConnectionManager) -> Store {
    Store::from_backend(Broken { inner, raw })
}

struct Broken {
    inner: Store,
    raw: redis::aio::ConnectionManager,
}

impl Broken {
    /// Deletes the exclusive lease of `lease`'s name, whoever holds it.
    async fn delete(&self, lease: LeaseRef<'_>) -> tower_lease::Result<()> {
        let key = KeyLayout::default().key(KeyRole::Lock, lease.lock.namespace, lease.lock.name);
        let mut raw = self.raw.clone();
        redis::cmd("DEL")
            .arg(key)
            .query_async::<()>(&mut raw)
            .await
            .map_err(tower_lease::Error::from)
    }
}

impl Backend for Broken {
    fn acquire<'a>(
        &'a self,
        lease: LeaseRef<'a>,
    ) -> BoxFuture<'a, tower_lease::Result<Acquisition>> {
        Box::pin(async move {
            let answer = self.inner.backend().acquire(lease).await?;
            if lease.mode != Mode::Exclusive || matches!(answer, Acquisition::Acquired { .. }) {
                return Ok(answer);
            }
            // Taken: take it anyway.
            self.delete(lease).await?;
            self.inner.backend().acquire(lease).await
        })
    }

    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, tower_lease::Result<Extended>> {
        self.inner.backend().extend(lease)
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, tower_lease::Result<bool>> {
        if lease.mode != Mode::Exclusive {
            return self.inner.backend().release(lease);
        }
        Box::pin(async move {
            self.delete(lease).await?;
            Ok(true)
        })
    }

    fn withdraw_intent<'a>(
        &'a self,
        lease: LeaseRef<'a>,
    ) -> BoxFuture<'a, tower_lease::Result<bool>> {
        self.inner.backend().withdraw_intent(lease)
    }

    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, tower_lease::Result<u32>> {
        self.inner.backend().in_use(lock)
    }
}
