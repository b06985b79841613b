//! The backend calls of the [`Store`] handle, each bounded by the backend's
//! [`timeout`](crate::backend::Backend::timeout) when the handle keeps it: a stalled backend
//! costs a caller an [`Error::Timeout`] within it, never a hang.
//!
//! A call that takes something (an acquisition, an idempotency reservation) is not dropped
//! when its time is up, since a backend's server may still run it: it is finished in a task
//! of its own, and what it took then is released at once. Other calls are dropped: what they
//! would have done (extend, release) the lease's TTL settles.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::Store;
use crate::backend::{
    Acquisition, Backend, Begin, Completion, Extended, FINGERPRINT_LEN, Fairness, LeaseRef,
    LockRef, Mode, Secret,
};
use crate::coarse_timer::Timeout;
use crate::{Error, Result};

impl Store {
    /// `call`, bounded by the timeout.
    async fn bounded<T>(&self, call: impl Future<Output = Result<T>>) -> Result<T> {
        match &self.timer {
            None => call.await,
            Some(timer) => Timeout::new(timer, call)
                .await
                .unwrap_or(Err(Error::Timeout(self.timeout))),
        }
    }

    /// [`Backend::acquire`], bounded; a late acquisition is given back.
    pub(crate) async fn acquire(&self, lease: LeaseRef<'_>) -> Result<Acquisition> {
        if self.timer.is_none() {
            return self.backend.acquire(lease).await;
        }
        match self.taking(lease, Taking::Lease).await? {
            Taken::Lease(acquisition) => Ok(acquisition),
            Taken::Reservation(_) => unreachable!("an acquisition answers one"),
        }
    }

    /// [`Backend::idempotency_begin`], or with `once`'s retention
    /// [`Backend::idempotency_begin_once`], bounded; a late reservation is given back.
    pub(crate) async fn begin(
        &self,
        lease: LeaseRef<'_>,
        fingerprint: &[u8; FINGERPRINT_LEN],
        once: Option<Duration>,
    ) -> Result<Begin> {
        if self.timer.is_none() {
            return Taking::Reservation(*fingerprint, once)
                .call(&*self.backend, lease)
                .await
                .map(Taken::into_begin);
        }
        let taken = self.taking(lease, Taking::Reservation(*fingerprint, once));
        taken.await.map(Taken::into_begin)
    }

    /// A call that may take `lease`, bounded by the timeout; when its time is up it goes on in
    /// a task of its own (for at most the lease's TTL: what it takes later than that would
    /// have ended by now had it landed in time), and if it took the lease, the lease is
    /// released at once.
    async fn taking(&self, lease: LeaseRef<'_>, taking: Taking) -> Result<Taken> {
        let late = Arc::new(AtomicBool::new(false));
        let owned = OwnedLease::new(lease);
        let ttl = lease.lock.ttl;
        let mut call = {
            let (backend, late) = (self.backend.clone(), late.clone());
            let rooms = self.wait_rooms().clone();
            Box::pin(async move {
                let lease = owned.lease();
                let answer = taking.call(&*backend, lease).await;
                if late.load(Ordering::Acquire) && answer.as_ref().is_ok_and(Taken::took) {
                    tracing::debug!(
                        namespace = lease.lock.namespace,
                        "a call that had timed out took its lease after all; giving it back"
                    );
                    let released = match lease.mode {
                        Mode::Reservation => backend.idempotency_free(lease).await,
                        _ => backend.release(lease).await,
                    };
                    let lock = lease.lock;
                    rooms.given_back(lease.mode, lock.namespace, lock.name);
                    if let Err(error) = released {
                        tracing::debug!(%error, "giving back a late lease failed; it ends with its TTL");
                    }
                }
                answer
            })
        };
        let timer = self
            .timer
            .as_ref()
            .expect("only a bounded store takes this way");
        if let Some(answer) = Timeout::new(timer, call.as_mut()).await {
            return answer;
        }
        late.store(true, Ordering::Release);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (store, owned) = (self.clone(), OwnedLease::new(lease));
            runtime.spawn(async move {
                // A backend that keeps a deadline of its own may end the call itself a little
                // after this handle's timer, its statement still on the wire, and orders a
                // release with the secret behind that statement only from then on (a SQL
                // store's kept connection): the caller's give-back, sent at this handle's
                // timeout, may have found nothing yet. So the lease is given back again once
                // the backend answered.
                if let Ok(Err(error)) = tokio::time::timeout(ttl, call).await {
                    store.give_back(owned.lease(), &error);
                }
            });
        }
        Err(Error::Timeout(self.timeout))
    }

    /// [`Backend::extend`], bounded.
    pub(crate) async fn extend(&self, lease: LeaseRef<'_>) -> Result<Extended> {
        self.bounded(self.backend.extend(lease)).await
    }

    /// [`Backend::extend_many`], bounded: every answer is the timeout when its time is up.
    pub(crate) async fn extend_many(&self, leases: &[LeaseRef<'_>]) -> Vec<Result<Extended>> {
        let call = self.backend.extend_many(leases);
        match &self.timer {
            None => call.await,
            Some(timer) => match Timeout::new(timer, call).await {
                Some(answers) => answers,
                None => leases
                    .iter()
                    .map(|_| Err(Error::Timeout(self.timeout)))
                    .collect(),
            },
        }
    }

    /// [`Backend::release`], bounded.
    pub(crate) async fn release(&self, lease: LeaseRef<'_>) -> Result<bool> {
        self.bounded(self.backend.release(lease)).await
    }

    /// [`Backend::release_live`], bounded.
    pub(crate) async fn release_live(&self, lease: LeaseRef<'_>) -> Result<bool> {
        self.bounded(self.backend.release_live(lease)).await
    }

    /// [`Backend::withdraw_intent`], bounded.
    pub(crate) async fn withdraw_intent(&self, lease: LeaseRef<'_>) -> Result<bool> {
        self.bounded(self.backend.withdraw_intent(lease)).await
    }

    /// [`Backend::in_use`], bounded.
    pub(crate) async fn in_use(&self, lock: LockRef<'_>) -> Result<u32> {
        self.bounded(self.backend.in_use(lock)).await
    }

    /// [`Backend::idempotency_complete`], bounded.
    pub(crate) async fn complete(
        &self,
        lease: LeaseRef<'_>,
        completion: Completion<'_>,
    ) -> Result<bool> {
        self.bounded(self.backend.idempotency_complete(lease, completion))
            .await
    }

    /// [`Backend::idempotency_free`], bounded.
    pub(crate) async fn free(&self, lease: LeaseRef<'_>) -> Result<bool> {
        self.bounded(self.backend.idempotency_free(lease)).await
    }
}

/// A call that may take a lease.
enum Taking {
    /// [`Backend::acquire`].
    Lease,
    /// [`Backend::idempotency_begin`], or with a retention [`Backend::idempotency_begin_once`].
    Reservation([u8; FINGERPRINT_LEN], Option<Duration>),
}

/// What a [`Taking`] call answered.
enum Taken {
    Lease(Acquisition),
    Reservation(Begin),
}

impl Taking {
    async fn call(&self, backend: &dyn Backend, lease: LeaseRef<'_>) -> Result<Taken> {
        match self {
            Taking::Lease => backend.acquire(lease).await.map(Taken::Lease),
            Taking::Reservation(fingerprint, Some(retention)) => backend
                .idempotency_begin_once(lease, fingerprint, *retention)
                .await
                .map(Taken::Reservation),
            Taking::Reservation(fingerprint, None) => backend
                .idempotency_begin(lease, fingerprint)
                .await
                .map(Taken::Reservation),
        }
    }
}

impl Taken {
    /// Whether the call took the lease.
    fn took(&self) -> bool {
        matches!(
            self,
            Taken::Lease(Acquisition::Acquired { .. }) | Taken::Reservation(Begin::Reserved { .. })
        )
    }

    fn into_begin(self) -> Begin {
        match self {
            Taken::Reservation(begin) => begin,
            Taken::Lease(_) => unreachable!("a reservation answers one"),
        }
    }
}

/// A [`LeaseRef`]'s parts, owned, for a call that outlives its caller.
struct OwnedLease {
    namespace: Box<str>,
    name: Box<[u8]>,
    lock: (Duration, bool, Fairness, u32),
    waiting: bool,
    mode: Mode,
    secret: Secret,
}

impl OwnedLease {
    fn new(lease: LeaseRef<'_>) -> Self {
        let LockRef {
            namespace,
            name,
            ttl,
            fenced,
            fairness,
            permits,
        } = lease.lock;
        OwnedLease {
            namespace: namespace.into(),
            name: name.into(),
            lock: (ttl, fenced, fairness, permits),
            waiting: lease.waiting,
            mode: lease.mode,
            secret: lease.secret.clone(),
        }
    }

    fn lease(&self) -> LeaseRef<'_> {
        let (ttl, fenced, fairness, permits) = self.lock;
        let lock = LockRef {
            namespace: &self.namespace,
            name: &self.name,
            ttl,
            fenced,
            fairness,
            permits,
        };
        let lease = LeaseRef::new(lock, self.mode, &self.secret);
        if self.waiting { lease.waiting() } else { lease }
    }
}
