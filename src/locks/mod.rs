//! What an application defines and holds: the lock definitions ([`Lock`], [`RwLock`],
//! [`Semaphore`], each a checked [`definition::Definition`] and a name type), their tokens
//! ([`LockToken`], [`ReadToken`], [`Permit`]) and an acquisition's [`Attempt`].

pub(crate) mod attempt;
pub(crate) mod definition;
pub(crate) mod lock;
pub(crate) mod semaphore;
pub(crate) mod token;

pub use self::attempt::Attempt;
pub use self::definition::MAX_NAMESPACE_LEN;
pub use self::lock::{Lock, RwLock};
pub use self::semaphore::Semaphore;
pub use self::token::{LockToken, Permit, ReadToken};
