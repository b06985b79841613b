//! Where leases live: the [`Store`] handle, and the stores that ship with the crate
//! ([`MemoryStore`], and `RedisStore` with the `redis` feature).
//!
//! Applications need only [`Store`] (re-exported at the crate root, with `RedisStore` for its
//! options). To keep leases somewhere else, implement [`Backend`](crate::backend::Backend):
//! [`MemoryStore`] is a short example, and `tower-lease-testkit` runs the scenarios every
//! backend must pass.

mod ghosts;
mod handle;
mod intents;
mod memory;
mod notifications;
#[cfg(feature = "redis")]
mod redis;

pub use self::handle::Store;
pub(crate) use self::intents::IntentListener;
pub use self::memory::MemoryStore;
pub(crate) use self::notifications::Watch;
#[cfg(feature = "sentinel")]
#[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
pub use self::redis::SentinelConnection;
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use self::redis::{KeyLayout, KeyRole, RedisStore};
