//! Where leases live: the [`Store`] handle, the built-in stores ([`MemoryStore`], and
//! `RedisStore` with the `redis` feature), and the [`Backend`] trait with the types a store of
//! your own implements.
//!
//! Applications need only [`Store`] (re-exported at the crate root, with `RedisStore` for its
//! options). Implement [`Backend`] to keep leases somewhere else: [`MemoryStore`] is a short
//! example, and `tower-lease-testkit` runs the scenarios every backend must pass.

mod ghosts;
mod handle;
mod intents;
mod memory;
mod notifications;
#[cfg(feature = "redis")]
mod redis;

pub use crate::backend::{
    Acquisition, Backend, Begin, BoxFuture, Completion, Extended, FINGERPRINT_LEN, LeaseRef,
    LockRef, Mode, Secret, Warning,
};

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
