//! The suite on a backend written outside tower-lease: a wrapper that hands every call to the
//! memory store, as the crate documentation shows.

use tower_lease::Store;
use tower_lease::backend::{Acquisition, Backend, BoxFuture, Extended, LeaseRef, LockRef};
use tower_lease::store::MemoryStore;
use tower_lease_testkit::Env;

#[derive(Default)]
struct Delegating(MemoryStore);

impl Backend for Delegating {
    fn acquire<'a>(
        &'a self,
        lease: LeaseRef<'a>,
    ) -> BoxFuture<'a, tower_lease::Result<Acquisition>> {
        self.0.acquire(lease)
    }
    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, tower_lease::Result<Extended>> {
        self.0.extend(lease)
    }
    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, tower_lease::Result<bool>> {
        self.0.release(lease)
    }
    fn withdraw_intent<'a>(
        &'a self,
        lease: LeaseRef<'a>,
    ) -> BoxFuture<'a, tower_lease::Result<bool>> {
        self.0.withdraw_intent(lease)
    }
    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, tower_lease::Result<u32>> {
        self.0.in_use(lock)
    }
}

fn env() -> Env {
    Env::new(Store::from_backend(Delegating::default()))
}

// One test per scenario, under tokio's paused clock, which the memory store follows.
tower_lease_testkit::conformance!(paused: env());
