//! The key layout of a [`RedisStore`](super::RedisStore): which Redis keys hold a name's leases.

use std::borrow::Cow;
use std::sync::Arc;

use redis::{RedisWrite, ToRedisArgs};

const DEFAULT_PREFIX: &str = "tower-lease";

/// The key layout of a [`RedisStore`](super::RedisStore): its prefix, and how keys are built from it.
///
/// ```
/// use tower_lease::store::{KeyLayout, KeyRole};
///
/// let layout = KeyLayout::default();
/// assert_eq!(layout.key(KeyRole::Lock, "invoice", b"42"), b"tower-lease:lock:{invoice:42}");
/// assert_eq!(layout.key(KeyRole::Readers, "catalog", b"s1"), b"tower-lease:rwlock:{catalog:s1}:r");
/// assert_eq!(layout.key(KeyRole::Permits, "export", b"t1"), b"tower-lease:sem:{export:t1}");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyLayout {
    prefix: Arc<str>,
}

impl Default for KeyLayout {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.into(),
        }
    }
}

impl KeyLayout {
    /// A layout that puts every key under `prefix` (the default is `tower-lease`).
    ///
    /// # Panics
    ///
    /// If `prefix` is empty or holds `{` or `}` (they would move the cluster hash tag).
    pub fn new(prefix: impl Into<String>) -> Self {
        let prefix = prefix.into();
        assert!(
            !prefix.is_empty() && !prefix.contains(['{', '}']),
            "tower-lease: a key prefix must be non-empty and hold no '{{' or '}}', got {prefix:?}"
        );
        Self {
            prefix: prefix.into(),
        }
    }

    /// The prefix of every key.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The key that holds `role` for `name` in `namespace`, as the scripts use it; for inspecting
    /// leases with `redis-cli`.
    pub fn key(&self, role: KeyRole, namespace: &str, name: &[u8]) -> Vec<u8> {
        let parts = self.parts(role, namespace, name);
        let mut key = Vec::with_capacity(parts.iter().map(|part| part.len()).sum());
        parts.iter().for_each(|part| key.extend_from_slice(part));
        key
    }

    /// The pieces of a key, in order: [`key`](Self::key) joins them, and [`Key`] writes them
    /// straight into a command without building the key on its own first.
    pub(super) fn parts<'a>(
        &'a self,
        role: KeyRole,
        namespace: &'a str,
        name: &'a [u8],
    ) -> [&'a [u8]; 7] {
        let (family, suffix): (&[u8], &[u8]) = match role {
            KeyRole::Lock => (b":lock:{", b""),
            KeyRole::LockFence => (b":lock:{", b":fence"),
            KeyRole::Writer => (b":rwlock:{", b":w"),
            KeyRole::Readers => (b":rwlock:{", b":r"),
            KeyRole::WriteIntent => (b":rwlock:{", b":wi"),
            KeyRole::WaitingReaders => (b":rwlock:{", b":wr"),
            KeyRole::ReadPhase => (b":rwlock:{", b":rp"),
            KeyRole::RwLockFence => (b":rwlock:{", b":fence"),
            KeyRole::RwLockWaited => (b":rwlock:{", b":waited"),
            KeyRole::Permits => (b":sem:{", b""),
            KeyRole::PermitsWaited => (b":sem:{", b":waited"),
            KeyRole::Idempotency => (b":idem:{", b""),
            KeyRole::IdempotencyFence => (b":idem:{", b":fence"),
            KeyRole::IdempotencyUnknown => (b":idem:{", b":unknown"),
        };
        let prefix = self.prefix.as_bytes();
        [
            prefix,
            family,
            namespace.as_bytes(),
            b":",
            name,
            b"}",
            suffix,
        ]
    }
}

/// A key as a command argument, written into the command without a `Vec` of its own.
#[derive(Clone, Copy)]
pub(super) struct Key<'a>(pub(super) [&'a [u8]; 7]);

/// The room [`Key::join_in`] joins a key in without allocating.
pub(super) const ON_STACK: usize = 256;

impl Key<'_> {
    pub(super) fn len(&self) -> usize {
        self.0.iter().map(|part| part.len()).sum()
    }

    /// The key joined in `buf`, or in a `Vec` of its own when it does not fit: for a key or a
    /// channel needed whole on a hot path, where a `Vec` would be an allocation per call.
    pub(super) fn join_in<'b>(&self, buf: &'b mut [u8; ON_STACK]) -> Cow<'b, [u8]> {
        let len = self.len();
        if len > buf.len() {
            return Cow::Owned(self.0.concat());
        }
        let mut at = 0;
        for part in self.0 {
            buf[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        Cow::Borrowed(&buf[..len])
    }
}

impl ToRedisArgs for Key<'_> {
    fn write_redis_args<W: ?Sized + RedisWrite>(&self, out: &mut W) {
        // Joined on the stack and handed over whole: writing the pieces one by one through
        // `writer_for_next_arg` costs twice as much.
        out.write_arg(&self.join_in(&mut [0; ON_STACK]));
    }
}

/// Which of a name's keys [`KeyLayout::key`] builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyRole {
    /// The holder's key of a [`Lock`](crate::Lock): the holder's secret (16 bytes), followed
    /// by `!` once a waiting attempt was refused by it, so that its release publishes.
    Lock,
    /// The fence counter of a [`Lock`](crate::Lock).
    LockFence,
    /// The writer's key of an [`RwLock`](crate::RwLock).
    Writer,
    /// The reader set of an [`RwLock`](crate::RwLock).
    Readers,
    /// The write intent of an [`RwLock`](crate::RwLock) whose writers leave one
    /// ([`Fairness::PhaseFair`](crate::Fairness::PhaseFair),
    /// [`Fairness::WritersFirst`](crate::Fairness::WritersFirst)): a refused writer's secret,
    /// `PX` about two heartbeats, while new readers are refused.
    WriteIntent,
    /// The waiting readers of a [phase-fair](crate::Fairness::PhaseFair)
    /// [`RwLock`](crate::RwLock): a sorted set of the secrets of readers refused by a writer or
    /// an intent, scored by when each note ends (server ms).
    WaitingReaders,
    /// The read phase of a [phase-fair](crate::Fairness::PhaseFair) [`RwLock`](crate::RwLock):
    /// the waiting readers a write's release let in before the next writer (the sorted set of
    /// [`WaitingReaders`](Self::WaitingReaders), renamed), `PX` the phase's length.
    ReadPhase,
    /// The fence counter of an [`RwLock`](crate::RwLock).
    RwLockFence,
    /// The waited mark of an [`RwLock`](crate::RwLock): set (`PX` a few seconds) by a waiting
    /// writer refused by readers or an intent, or a waiting reader refused by an intent, so
    /// that the release they wait for publishes; releases publish nothing while no mark lives.
    /// (A waiter refused by a writer marks the writer's key instead: its value is then the
    /// holder's secret and `!`.)
    RwLockWaited,
    /// The permits of a [`Semaphore`](crate::Semaphore): a sorted set of permit secrets scored
    /// by lease end (server ms).
    Permits,
    /// The waited mark of a [`Semaphore`](crate::Semaphore): set (`PX` a few seconds) by a
    /// waiting attempt refused for want of a permit, so that releases publish while it lives.
    PermitsWaited,
    /// An idempotency key: while its first request runs, the reservation (the holder's
    /// secret, `PX ttl`); once that completed, its record (the request fingerprint, 16 bytes,
    /// the completing reservation's secret, 16 bytes, then the stored response, `PX` the
    /// retention). The name is the encoded scope and key.
    Idempotency,
    /// The fence counter of a [fenced](crate::Idempotency::fenced) idempotency key.
    IdempotencyFence,
    /// The marker of an [at-most-once](crate::Idempotency::at_most_once) idempotency key,
    /// `PX` the retention from its reservation on: a key found free while it lives had a
    /// holder that died, and its outcome is unknown.
    IdempotencyUnknown,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Joined on the stack or in a `Vec`, a key is the one `KeyLayout::key` builds.
    #[test]
    fn join_in_is_the_whole_key_on_the_stack_or_not() {
        let layout = KeyLayout::new("p");
        let long = vec![b'x'; ON_STACK];
        for name in [&b"42"[..], &long] {
            let key = Key(layout.parts(KeyRole::Lock, "invoice", name));
            let mut buf = [0; ON_STACK];
            let joined = key.join_in(&mut buf);
            assert_eq!(&*joined, layout.key(KeyRole::Lock, "invoice", name));
            assert_eq!(matches!(joined, Cow::Borrowed(_)), name.len() < 100);
        }
    }
}
