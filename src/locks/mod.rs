//! What an application defines and holds: the locks ([`Lock`], [`RwLock`], [`Semaphore`], each
//! a checked [`Definition`](crate::definition::Definition) and a name type) and their tokens
//! ([`LockToken`], [`ReadToken`], [`Permit`]).

pub(crate) mod lock;
pub(crate) mod semaphore;
pub(crate) mod token;

pub use self::lock::{Lock, RwLock};
pub use self::semaphore::Semaphore;
pub use self::token::{LockToken, Permit, ReadToken};
