//! Replicated safety, on a real primary, one replica and (for failovers) three sentinels that
//! the tests start: `RedisStore::wait_for_replicas` with the replica frozen, and leases across
//! a Sentinel failover with and without it.

mod check;
mod failover;
mod gap;
mod idempotency;
mod wait;

use std::time::Duration;

use tower_lease::{RedisStore, Store};
use tower_lease_harness::{Endpoint, RedisServer};

/// How long `WAIT` waits for the replica.
const WAIT: Duration = Duration::from_millis(200);

/// A store on `server` that counts a write once one replica acknowledged it within [`WAIT`].
async fn replicated(server: &RedisServer) -> Store {
    RedisStore::connect(&server.url())
        .await
        .unwrap()
        .wait_for_replicas(1, WAIT)
        .into()
}
