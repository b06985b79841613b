//! Replicated safety, on a real primary, one replica and (for failovers) three sentinels that
//! the tests start: `RedisStore::wait_for_replicas` with the replica frozen, and leases across
//! a Sentinel failover with and without it.

#[path = "../support/mod.rs"]
mod support;

mod failover;
mod idempotency;
mod wait;
