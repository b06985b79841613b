//! Where leases live: the [`Store`] handle, and the stores that ship with the crate
//! ([`MemoryStore`], and `RedisStore` with the `redis` feature).
//!
//! Applications need only [`Store`] (re-exported at the crate root, with `RedisStore` for its
//! options). To keep leases somewhere else, implement [`Backend`](crate::backend::Backend):
//! [`MemoryStore`] is a short example, and `tower-lease-testkit` runs the scenarios every
//! backend must pass.

// Beside the handle, what it keeps for every lease taken through it: the lease as the store has
// it (`raw::RawLease`: taken, extended and released, with its fence), what everyone knows about
// one held lease (`LeaseState`: until when it is valid on the monotonic clock, whether it ended
// and why), the heartbeat that extends them in batches, and this process's waiting rooms.
mod calls;
mod ghosts;
mod handle;
pub(crate) mod heartbeat;
mod memory;
pub(crate) mod raw;
#[cfg(feature = "redis")]
mod redis;
pub(crate) mod rooms;
mod state;
mod watch;

pub use self::handle::Store;
pub use self::memory::MemoryStore;
#[cfg(feature = "sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
pub use self::redis::SentinelConnection;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use self::redis::{KeyLayout, KeyRole, RedisStore};
pub(crate) use self::state::LeaseState;
pub(crate) use self::watch::Watch;
