//! Idempotency keys: the store side on a real `redis-server`, a local Redis Cluster and in
//! memory, and `IdempotencyLayer` as a black box over real TCP.

mod json;
mod layer;
mod once;
mod panic;
mod restart;
mod store;
mod stored;
