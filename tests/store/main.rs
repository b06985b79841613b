//! The store: lock definitions and the key layout (no store needed), the conformance suite on a
//! real `redis-server` and on a local Redis Cluster (in memory: `tests/memory`),
//! `Backend::extend_many`, native compare-and-set, and what only a cluster shows. Each Redis-backed test starts its own servers
//! on free loopback ports.

#[cfg(feature = "cluster")]
mod cluster;
mod conformance;
mod definitions;
mod echo;
mod extend_many;
mod keys;
mod live_release;
mod native;
mod publishes;
mod script_calls;
#[cfg(feature = "cluster")]
mod sharded;
mod wait;
