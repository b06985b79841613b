//! The conformance suite of `tower-lease-testkit` on `Store::memory()`, under tokio's paused
//! clock: the one test binary that needs no Redis, so it runs without the `redis` feature too.

use tower_lease::Store;
use tower_lease_testkit::Env;

tower_lease_testkit::conformance!(paused: Env::new(Store::memory()));
