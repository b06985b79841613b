//! The lease we own: kept alive by the store's heartbeat, owned by a job, and read by a
//! request's handler.
//!
//! - [`finish_on_drop`] runs a store call (an acquisition, a release) to its end when its caller
//!   is dropped.
//! - [`Lease`] is the cloneable handle on a held lease that handlers and jobs read.
//! - [`kept::KeptLease`] owns one lease: its place in the store's heartbeat and its release,
//!   spawned when it is dropped.
//! - [`Held`] is the public owner of a lease for code that is not a request.
//!
//! Below them, in [`store`](crate::store): the lease as the store has it
//! ([`RawLease`](crate::store::raw::RawLease)), what everyone knows of it
//! ([`LeaseState`](crate::store::LeaseState)), and the heartbeat that extends it.

pub(crate) mod finish_on_drop;
mod handle;
mod held;
pub(crate) mod kept;
pub(crate) mod left;
#[cfg(test)]
mod tests;

pub use self::handle::Lease;
pub use self::held::{Held, Run};
