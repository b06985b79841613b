//! The layers over real TCP (axum servers on 127.0.0.1:0), on a real `redis-server`, a local
//! Redis Cluster and in memory: `LockLayer`'s answers, `RwLockLayer`, the lease while a request
//! runs, untrusted names, and the options a production service needs (a required name, names
//! from several segments, typed names, a bounded wait for the release).

mod bodies;
mod clients;
mod lease;
mod names;
mod options;
mod reads;
mod responses;
mod semaphore;
mod wait;
