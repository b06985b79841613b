//! The crate's one error type.

use std::time::Duration;

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when taking, extending or releasing a lease.
///
/// "The lock is held" is not an error: acquisition answers it with `None` (or
/// [`Attempt::Busy`](crate::Attempt::Busy)), and `release`/`extend` answer `false` when the lease
/// had already run out.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Redis answered with an error or the connection to it failed.
    #[cfg(feature = "redis")]
    #[error("redis command failed: {0}")]
    Redis(#[from] redis::RedisError),

    /// A lock name was empty or longer than [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes.
    #[error("lock names must be 1 to 1024 bytes long, this one is {len} bytes")]
    InvalidName {
        /// The length of the rejected name, in bytes.
        len: usize,
    },

    /// A namespace given to [`Lock::try_new`](crate::Lock::try_new) or
    /// [`RwLock::try_new`](crate::RwLock::try_new) is not usable in a key.
    #[error("lock namespace {namespace:?} is invalid: {reason}")]
    InvalidNamespace {
        /// The rejected namespace.
        namespace: String,
        /// Why it was rejected.
        reason: &'static str,
    },

    /// A TTL given to [`Lock::try_new`](crate::Lock::try_new) or
    /// [`RwLock::try_new`](crate::RwLock::try_new) is shorter than 1 ms or too long for Redis.
    #[error(
        "lock TTL must be at least 1 ms and fit in a signed 64-bit millisecond count, got {ttl:?}"
    )]
    InvalidTtl {
        /// The rejected TTL.
        ttl: Duration,
    },

    /// A semaphore was given no permits: [`Semaphore::try_new`](crate::Semaphore::try_new) or
    /// [`Semaphore::with_permits`](crate::Semaphore::with_permits) with 0.
    #[error("a semaphore needs at least 1 permit, got 0")]
    InvalidPermits,

    /// The store did not answer within its timeout
    /// ([`RedisStore::timeout`](crate::RedisStore::timeout), or a backend's
    /// [`Backend::timeout`](crate::backend::Backend::timeout)), or its server ended the call at
    /// that bound: the server is slow, busy with a lock, or unreachable.
    #[error(
        "the lock store did not answer within {0:?}; check that its server is reachable and not overloaded"
    )]
    Timeout(Duration),

    /// The store answered with something this crate does not understand, such as a key that
    /// another program overwrote with a value of the wrong type.
    #[error("the lock store answered unexpectedly: {0}")]
    UnexpectedReply(String),

    /// A write of an acquisition or an extension reached fewer replicas than
    /// [`RedisStore::wait_for_replicas`](crate::RedisStore::wait_for_replicas) asks for within
    /// its timeout (`WAIT`). A failover now could lose it, so the acquisition does not count (its
    /// lease was released again) and the extension is a store error for the heartbeat.
    #[error("the lease reached {acked} of the {wanted} replicas it must reach before it counts")]
    NotReplicated {
        /// How many replicas acknowledged the write in time.
        acked: u32,
        /// How many the store waits for.
        wanted: u32,
    },

    /// An error from a third-party [`Backend`](crate::backend::Backend).
    #[error(transparent)]
    Backend(Box<dyn std::error::Error + Send + Sync + 'static>),
}
