//! Failure behaviour, against real `redis-server` processes (and, where needed, the TCP fault
//! proxy of the test harness, or replica processes of `examples/replica.rs`): the store when
//! Redis or the network misbehaves and how soon it answers again, fences across data loss,
//! memory pressure, several replicas under contention, and the layer when Redis or its clients
//! misbehave.

mod eviction;
mod fences;
mod ghosts;
mod layer;
mod pools;
mod recovery;
mod replicas;
mod restart;
mod rw_replicas;
mod store;
mod waits;
