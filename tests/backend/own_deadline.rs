//! A backend that keeps a deadline of its own, as a SQL store does with its statement's: a
//! call it gives up on answers [`Error::Timeout`] a little after the [`Store`] handle's timer
//! gave up on it, while the statement it sent is still on its connection and takes the lease
//! later. The backend orders a release with that secret behind it (as one connection runs its
//! statements in order), but only once its own deadline passed: a give-back sent before then
//! finds nothing and leaves the late lease held for its whole TTL. The handle gives the lease
//! back once the backend answered, so the name is free right after the late acquisition lands.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tower_lease::backend::{
    Acquisition, Backend, BoxFuture, Extended, LeaseRef, LockRef, Mode, Secret,
};
use tower_lease::store::MemoryStore;
use tower_lease::{Error, Lock, Result, Store};

/// The backend's own deadline, and the handle's.
const TIMEOUT: Duration = Duration::from_millis(100);
/// When the backend's own deadline ends a stalled call: after the handle's timer.
const OWN_DEADLINE: Duration = Duration::from_millis(250);
/// When a stalled acquisition reaches the server and takes the lease.
const LANDS: Duration = Duration::from_millis(500);
/// Long, so that only a give-back frees the name in time.
const LOCK: Lock<str> = Lock::new("own-deadline", Duration::from_secs(30));

/// The backend: a memory "server", acquisitions that stall while `stalled` is set, and for
/// each stalled acquisition the moment it landed, for the release that goes behind it on its
/// connection.
#[derive(Clone, Default)]
struct OwnDeadline {
    server: Arc<MemoryStore>,
    stalled: Arc<AtomicBool>,
    /// Set once a stalled acquisition landed and took its lease.
    took_late: Arc<AtomicBool>,
    on_the_wire: Arc<Mutex<HashMap<Secret, watch::Receiver<bool>>>>,
}

/// A lease's parts, owned, for what the "server" runs after its caller left.
struct Owned {
    namespace: String,
    name: Vec<u8>,
    ttl: Duration,
    mode: Mode,
    secret: Secret,
}

impl From<LeaseRef<'_>> for Owned {
    fn from(lease: LeaseRef<'_>) -> Self {
        Owned {
            namespace: lease.lock.namespace.to_owned(),
            name: lease.lock.name.to_vec(),
            ttl: lease.lock.ttl,
            mode: lease.mode,
            secret: lease.secret.clone(),
        }
    }
}

impl Owned {
    fn lease(&self) -> LeaseRef<'_> {
        let lock = LockRef::new(&self.namespace, &self.name, self.ttl);
        LeaseRef::new(lock, self.mode, &self.secret)
    }
}

impl Backend for OwnDeadline {
    fn timeout(&self) -> Duration {
        TIMEOUT
    }

    fn acquire<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Acquisition>> {
        Box::pin(async move {
            if !self.stalled.load(Ordering::SeqCst) {
                return self.server.acquire(lease).await;
            }
            let started = tokio::time::Instant::now();
            // The statement is on the wire: it lands at `LANDS`, whoever gave up on it.
            let (landed, landing) = watch::channel(false);
            let (server, took_late) = (self.server.clone(), self.took_late.clone());
            let owned = Owned::from(lease);
            tokio::spawn(async move {
                tokio::time::sleep_until(started + LANDS).await;
                let taken = server.acquire(owned.lease()).await;
                if let Ok(Acquisition::Acquired { .. }) = taken {
                    took_late.store(true, Ordering::SeqCst);
                }
                let _ = landed.send(true);
            });
            // Its own deadline: the connection is kept for the release from then on.
            tokio::time::sleep_until(started + OWN_DEADLINE).await;
            self.on_the_wire
                .lock()
                .unwrap()
                .insert(lease.secret.clone(), landing);
            Err(Error::Timeout(TIMEOUT))
        })
    }

    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Extended>> {
        self.server.extend(lease)
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let behind = self.on_the_wire.lock().unwrap().remove(lease.secret);
            let Some(mut landing) = behind else {
                return self.server.release(lease).await;
            };
            // Sent on the stalled call's connection: the server runs it after that call,
            // whether or not the caller still waits for its answer.
            let server = self.server.clone();
            let owned = Owned::from(lease);
            let on_the_wire = tokio::spawn(async move {
                let _ = landing.wait_for(|landed| *landed).await;
                server.release(owned.lease()).await
            });
            on_the_wire.await.expect("the release runs")
        })
    }

    fn withdraw_intent<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        self.server.withdraw_intent(lease)
    }

    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, Result<u32>> {
        self.server.in_use(lock)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_backend_ends_after_the_handle_is_given_back_behind_what_it_took() {
    let backend = OwnDeadline::default();
    let store = Store::from_backend(backend.clone());
    backend.stalled.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let attempt = LOCK.try_lock(&store, "invoice").await;
    assert!(
        matches!(attempt, Err(Error::Timeout(_))),
        "{:?}",
        attempt.map(|t| t.is_some())
    );
    backend.stalled.store(false, Ordering::SeqCst);
    // The late acquisition lands at `LANDS` and takes the name; the give-back, queued behind
    // it, frees it right after. Bounded from the landing, which the test saw happen.
    let deadline = started + LANDS + Duration::from_secs(2);
    let lock = LockRef::new("own-deadline", b"invoice", LOCK.ttl());
    let probe = Secret::random();
    loop {
        let landed = backend.took_late.load(Ordering::SeqCst);
        if landed {
            // Free once a stranger gets in (and leaves at once).
            let look = LeaseRef::new(lock, Mode::Exclusive, &probe);
            if let Acquisition::Acquired { .. } = backend.server.acquire(look).await.unwrap() {
                assert!(backend.server.release(look).await.unwrap());
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{:?} after the call: {}",
            started.elapsed(),
            if landed {
                "the acquisition given up on still holds the lease"
            } else {
                "the acquisition never landed: the test shows nothing"
            }
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let token = LOCK.try_lock(&store, "invoice").await.unwrap();
    assert!(token.expect("free").release().await.unwrap());
}
