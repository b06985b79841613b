//! The lease engine: what keeps a held lease alive and says when it is lost, for the layers'
//! requests and for any code through [`Held`].
//!
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
