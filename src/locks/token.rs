//! Tokens: the proof of holding a lease, and the only way to extend or release it.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use crate::Result;
use crate::lease::Held;
use crate::lease::finish_on_drop::FinishOnDrop;
use crate::store::raw::RawLease;

macro_rules! token {
    ($(#[$doc:meta])* $ty:ident) => {
        $(#[$doc])*
        #[must_use = "a lease that is not released blocks others until its TTL runs out"]
        pub struct $ty<L> {
            holding: RawLease,
            lock: PhantomData<fn() -> L>,
        }

        impl<L> $ty<L> {
            pub(crate) fn new(holding: RawLease) -> Self {
                Self { holding, lock: PhantomData }
            }

            /// Gives the lease up so others can take it at once.
            ///
            /// Answers `false` when the lease had already run out (someone else may hold the lock
            /// now, and their lease is left alone). Once polled, the release runs to its end even
            /// if this future is dropped (a `select!` whose other branch won, a timeout): it goes
            /// on in a spawned task.
            pub async fn release(self) -> Result<bool> {
                let holding = self.holding;
                FinishOnDrop::to_the_end(Box::pin(async move { holding.release().await })).await
            }

            /// Restarts the lease for one full TTL from now.
            ///
            /// Answers `false` when the lease had already run out; it is then *not* taken again.
            pub async fn extend(&self) -> Result<bool> {
                self.holding.extend().await
            }

            /// The locked name, as encoded by [`LockName`](crate::LockName).
            pub fn name(&self) -> &[u8] {
                self.holding.name()
            }

            /// The namespace of the lock.
            pub fn namespace(&self) -> &'static str {
                self.holding.namespace()
            }

            /// How long the lease lasts from an acquisition or extension.
            pub fn ttl(&self) -> Duration {
                self.holding.ttl()
            }

            /// Hands the lease to the store's heartbeat, which extends it every third of its
            /// TTL until the [`Held`] is released or dropped (dropping it releases the lease in
            /// the background). See [`Held`] for the rules of losing it.
            ///
            /// # Panics
            ///
            /// Outside a tokio runtime (the heartbeat is a task).
            pub fn keep_alive(self) -> Held<Self> {
                Held::new(self.holding)
            }
        }

        impl<L> Held<$ty<L>> {
            /// Stops the heartbeat and gives the token back, without releasing: the lease runs
            /// to its TTL from its last extension unless the token releases (or extends) it.
            ///
            /// For a job that runs at most once per interval however long it takes (the
            /// `cron` example): take the lock with the interval as its TTL, keep it alive while
            /// the job works, then let it run out, so the next run starts an interval after
            /// the last extension at the soonest.
            ///
            /// The [`Lease`](crate::Lease) handles of this `Held` see the lease ended (not
            /// lost) from now on.
            pub fn into_token(self) -> $ty<L> {
                $ty::new(self.into_holding())
            }
        }

        impl<L> fmt::Debug for $ty<L> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.holding.debug_as(f, stringify!($ty))
            }
        }
    };
}

token! {
    /// Proof of holding an exclusive lease: of a [`Lock`](crate::Lock), or the writer's lease of
    /// an [`RwLock`](crate::RwLock).
    ///
    /// Dropping a token does not talk to the store (it cannot, in a panic or a cancelled future):
    /// the lock stays held until its TTL runs out. Call [`release`](Self::release) to free it at
    /// once.
    LockToken
}

token! {
    /// Proof of holding one permit of a [`Semaphore`](crate::Semaphore).
    ///
    /// Dropping a permit does not talk to the store: its slot stays taken until its TTL runs
    /// out. Call [`release`](Self::release) to free it at once.
    Permit
}

impl<L> LockToken<L> {
    /// The fencing token of this acquisition, when the lock is [fenced](crate::Lock::fenced).
    pub fn fence(&self) -> Option<u64> {
        self.holding.fence()
    }
}

impl<L> ReadToken<L> {
    /// For a [fenced](crate::RwLock::fenced) lock, the fencing token of the last writer (0
    /// before any): the generation this reader sees.
    pub fn fence(&self) -> Option<u64> {
        self.holding.fence()
    }
}

token! {
    /// Proof of holding one reader's lease of an [`RwLock`](crate::RwLock).
    ///
    /// For a [fenced](crate::RwLock::fenced) lock, [`fence`](Self::fence) is the fencing token of
    /// the last writer (0 when nobody has written yet): the generation this reader sees.
    ///
    /// Dropping a token does not talk to the store: the reader's lease stays until its TTL runs
    /// out. Call [`release`](Self::release) to free it at once.
    ReadToken
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::{Lock, RwLock, Semaphore, Store};

    #[tokio::test]
    async fn a_token_prints_as_what_it_is_without_its_secret() {
        let store = Store::memory();
        let lock = Lock::new("jobs", Duration::from_secs(1)).fenced();
        let token = lock.try_lock(&store, "a").await.unwrap().expect("free");
        let printed = format!("{token:?}");
        assert!(printed.starts_with("LockToken {"), "{printed}");
        assert!(printed.contains("namespace: \"jobs\""), "{printed}");
        assert!(printed.contains("fence: Some("), "{printed}");
        assert!(!printed.contains("secret"), "{printed}");

        let docs = RwLock::new("docs", Duration::from_secs(1));
        let reader = docs.try_read(&store, "a").await.unwrap().expect("free");
        assert!(format!("{reader:?}").starts_with("ReadToken {"));
        let slots = Semaphore::new("slots", 1, Duration::from_secs(1));
        let permit = slots.try_acquire(&store, "a").await.unwrap().expect("free");
        assert!(format!("{permit:?}").starts_with("Permit {"));
    }
}
