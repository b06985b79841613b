//! What an application defines and holds: the lock kinds ([`Lock`], [`RwLock`], [`Semaphore`],
//! made of a checked [`spec::Spec`]), their tokens ([`LockToken`], [`ReadToken`], [`Permit`]) and
//! an acquisition's [`Attempt`].

pub(crate) mod attempt;
pub(crate) mod lock;
pub(crate) mod semaphore;
pub(crate) mod spec;
pub(crate) mod token;

pub use self::attempt::Attempt;
pub use self::lock::{Lock, RwLock};
pub use self::semaphore::Semaphore;
pub use self::spec::MAX_NAMESPACE_LEN;
pub use self::token::{LockToken, Permit, ReadToken};
