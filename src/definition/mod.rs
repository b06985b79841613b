//! What a lock is before anything is held: its definition, as every kind of lock shares it
//! (namespace, TTL, fencing, writer preference and permits, checked once: at compile time for
//! a `const` definition), and the [`Attempt`] an acquisition answers.

use std::time::Duration;

use crate::backend::LockRef;
use crate::{Error, Result};

pub(crate) mod attempt;

pub use self::attempt::Attempt;

/// The longest namespace, in bytes.
pub const MAX_NAMESPACE_LEN: usize = 128;

/// A lock definition without its name type: what [`Lock`](crate::Lock),
/// [`RwLock`](crate::RwLock), [`Semaphore`](crate::Semaphore) and
/// [`Idempotency`](crate::Idempotency) each hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Definition {
    pub(crate) namespace: &'static str,
    pub(crate) ttl: Duration,
    pub(crate) fenced: bool,
    pub(crate) writer_preferred: bool,
    /// For a [`Semaphore`](crate::Semaphore), its permits; 0 for a lock.
    pub(crate) permits: u32,
    /// Whether the attempt is a bounded wait's, whose refusal marks the name as waited on
    /// ([`LockRef::waiting`]); false in every definition, set by the wait loop per attempt.
    pub(crate) waiting: bool,
}

/// Why a definition is invalid; `const` so that [`Lock::new`](crate::Lock::new) fails at compile time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Invalid {
    EmptyNamespace,
    LongNamespace,
    NamespaceChar,
    Ttl,
}

impl Invalid {
    const fn reason(self) -> &'static str {
        match self {
            Invalid::EmptyNamespace => "it is empty",
            Invalid::LongNamespace => "it is longer than 128 bytes",
            Invalid::NamespaceChar => {
                "only printable ASCII without ':', '{', '}' or space is allowed"
            }
            Invalid::Ttl => "the TTL must be at least 1 ms",
        }
    }
}

impl Definition {
    const fn check(namespace: &'static str, ttl: Duration) -> Result<Definition, Invalid> {
        let bytes = namespace.as_bytes();
        if bytes.is_empty() {
            return Err(Invalid::EmptyNamespace);
        }
        if bytes.len() > MAX_NAMESPACE_LEN {
            return Err(Invalid::LongNamespace);
        }
        let mut i = 0;
        while i < bytes.len() {
            // ':' separates key parts and braces would move the cluster hash tag.
            if !matches!(bytes[i], b'!'..=b'~') || matches!(bytes[i], b':' | b'{' | b'}') {
                return Err(Invalid::NamespaceChar);
            }
            i += 1;
        }
        // Redis counts in whole milliseconds and stores them in an i64.
        let millis = ttl.as_millis();
        if millis == 0 || millis > i64::MAX as u128 {
            return Err(Invalid::Ttl);
        }
        Ok(Definition {
            namespace,
            ttl: Duration::from_millis(millis as u64),
            fenced: false,
            writer_preferred: false,
            permits: 0,
            waiting: false,
        })
    }

    pub(crate) const fn new(namespace: &'static str, ttl: Duration) -> Definition {
        match Definition::check(namespace, ttl) {
            Ok(definition) => definition,
            Err(Invalid::EmptyNamespace) => {
                panic!("tower-lease: a lock namespace must not be empty")
            }
            Err(Invalid::LongNamespace) => {
                panic!("tower-lease: a lock namespace must be at most 128 bytes")
            }
            Err(Invalid::NamespaceChar) => panic!(
                "tower-lease: a lock namespace may only hold printable ASCII without ':', '{{', '}}' or space"
            ),
            Err(Invalid::Ttl) => panic!("tower-lease: a lock TTL must be at least 1 ms"),
        }
    }

    /// The lock named `name` under this definition, as [`Backend`](crate::backend::Backend)
    /// calls take it.
    pub(crate) fn lock_ref<'a>(&self, name: &'a [u8]) -> LockRef<'a> {
        LockRef {
            namespace: self.namespace,
            name,
            ttl: self.ttl,
            fenced: self.fenced,
            writer_preferred: self.writer_preferred,
            permits: self.permits,
            waiting: self.waiting,
        }
    }

    pub(crate) fn try_new(namespace: &'static str, ttl: Duration) -> Result<Definition> {
        Definition::check(namespace, ttl).map_err(|invalid| match invalid {
            Invalid::Ttl => Error::InvalidTtl { ttl },
            other => Error::InvalidNamespace {
                namespace: namespace.to_owned(),
                reason: other.reason(),
            },
        })
    }
}
