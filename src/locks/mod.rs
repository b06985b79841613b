//! What an application defines and holds: the locks ([`Lock`], [`RwLock`], [`Semaphore`], each
//! a checked [`Definition`](crate::definition::Definition) and a name type) and their tokens
//! ([`LockToken`], [`ReadToken`], [`Permit`]), and the bounded [`wait`] of those that wait for
//! a lease (the layers wait through it too).

pub(crate) mod lock;
pub(crate) mod semaphore;
pub(crate) mod token;
pub(crate) mod wait;

pub use self::lock::{Lock, RwLock};
pub use self::semaphore::Semaphore;
pub use self::token::{LockToken, Permit, ReadToken};
