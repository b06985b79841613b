//! The lease we hold, at each layer: as the store has it, kept alive by the heartbeat, owned by
//! a job, and read by a request's handler; what keeps it alive and says when it is lost.
//!
//! - [`raw::RawLease`] is the lease as the store has it, of any mode: taken, extended and
//!   released, with its fence; tokens, [`Held`] and the layers are built on it.
//! - [`finish_on_drop`] runs a store call (an acquisition, a release) to its end when its caller
//!   is dropped.
//! - [`LeaseState`] is what everyone knows about one held lease: until when it is valid on the
//!   monotonic clock, and whether it ended (released, or lost and why).
//! - [`Lease`] is the cloneable handle on it that handlers and jobs read.
//! - [`kept::KeptLease`] owns one lease: its place in the store's heartbeat and its release,
//!   spawned when it is dropped.
//! - [`heartbeat`] is one task per [`Store`](crate::Store) that extends every lease enrolled in
//!   it, in batches.
//! - [`Held`] is the public owner of a lease for code that is not a request.

pub(crate) mod finish_on_drop;
mod handle;
pub(crate) mod heartbeat;
mod held;
pub(crate) mod kept;
pub(crate) mod raw;
mod state;

pub use self::handle::Lease;
pub use self::held::{Held, Run};
pub(crate) use self::state::LeaseState;
