//! `RwLockLayer`'s reads and writes: what each takes, reads sharing one lease, a writer among
//! them, an answered read's lease released, and the shares on a cluster.

mod answered;
mod catalog;
mod coalesce;
mod rw;
#[cfg(feature = "cluster")]
mod sharded;
mod writer;
