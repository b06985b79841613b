//! Lock definitions: [`Lock`] and [`RwLock`], each a `const` namespace, TTL and fencing choice.

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use crate::Result;
use crate::backend::{Fairness, Mode};
use crate::definition::Definition;
use crate::definition::attempt::Attempt;
use crate::locks::token::{LockToken, ReadToken};
use crate::locks::wait::acquire_within::acquire_within;
use crate::name::LockName;
use crate::store::Store;
use crate::store::raw::RawLease;
use crate::telemetry::AcquireOutcome;

impl Definition {
    /// Takes the lease on `name` if it is free.
    pub(crate) async fn acquire<N>(
        self,
        store: &Store,
        mode: Mode,
        name: &N,
    ) -> Result<Attempt<RawLease>>
    where
        N: LockName + ?Sized,
    {
        RawLease::acquire(store.clone(), self, mode, name.lock_name()).await
    }

    /// Acquires, waiting up to `wait` while the lock is busy; a zero wait is one attempt.
    pub(crate) async fn acquire_within<N>(
        self,
        store: &Store,
        mode: Mode,
        name: &N,
        wait: Duration,
    ) -> Result<Attempt<RawLease>>
    where
        N: LockName + ?Sized,
    {
        if wait.is_zero() {
            return self.acquire(store, mode, name).await;
        }
        let name = name.lock_name().into_owned().into_boxed_slice();
        let on_store_error = AcquireOutcome::StoreError;
        let (_, attempt) =
            acquire_within(store.clone(), self, mode, name, wait, on_store_error).await;
        attempt
    }
}

macro_rules! definition {
    ($(#[$doc:meta])* $ty:ident) => {
        $(#[$doc])*
        pub struct $ty<N: ?Sized> {
            definition: Definition,
            name: PhantomData<fn(&N)>,
        }

        impl<N: ?Sized> $ty<N> {
            /// Defines a lock in `namespace` whose leases last `ttl` unless extended.
            ///
            /// The TTL is counted in whole milliseconds (rounded down).
            ///
            /// # Panics
            ///
            /// If `namespace` is empty, longer than 128 bytes, or holds anything but printable
            /// ASCII without `:`, `{`, `}` and space, or if `ttl` is shorter than 1 ms. In a
            /// `const` item this is a compile error. Use `try_new` for values read at run time.
            pub const fn new(namespace: &'static str, ttl: Duration) -> Self {
                Self { definition: Definition::new(namespace, ttl), name: PhantomData }
            }

            /// Like `new`, but answers
            /// [`Error::InvalidNamespace`](crate::Error::InvalidNamespace) or
            /// [`Error::InvalidTtl`](crate::Error::InvalidTtl) instead of panicking, for
            /// definitions built from configuration.
            pub fn try_new(namespace: &'static str, ttl: Duration) -> Result<Self> {
                Ok(Self { definition: Definition::try_new(namespace, ttl)?, name: PhantomData })
            }

            /// Makes every exclusive acquisition take a *fencing token*, available as `fence()` on
            /// the token, that the protected resource can check to refuse writes from a holder
            /// whose lease has already run out.
            ///
            /// Per name, each fence is larger than every fence before it: it is
            /// `max(last + 1, the store's clock in µs)`, so it keeps growing even when Redis
            /// loses the counter (a restart without persistence, a failover, a flush), as long
            /// as the clock of the Redis that issues it is not behind the last one's.
            pub const fn fenced(self) -> Self {
                Self { definition: Definition { fenced: true, ..self.definition }, name: PhantomData }
            }

            /// How long a lease lasts unless extended.
            pub const fn ttl(&self) -> Duration {
                self.definition.ttl
            }

            /// The namespace this lock's names live in.
            pub const fn namespace(&self) -> &'static str {
                self.definition.namespace
            }

            /// Whether acquisitions take fencing tokens; see [`fenced`](Self::fenced).
            pub const fn is_fenced(&self) -> bool {
                self.definition.fenced
            }

            pub(crate) const fn definition(&self) -> Definition {
                self.definition
            }
        }

        impl<N: ?Sized> Clone for $ty<N> {
            fn clone(&self) -> Self {
                *self
            }
        }

        impl<N: ?Sized> Copy for $ty<N> {}

        impl<N: ?Sized> fmt::Debug for $ty<N> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($ty))
                    .field("namespace", &self.definition.namespace)
                    .field("ttl", &self.definition.ttl)
                    .field("fenced", &self.definition.fenced)
                    .finish()
            }
        }

        impl<N: ?Sized> PartialEq for $ty<N> {
            fn eq(&self, other: &Self) -> bool {
                self.definition == other.definition
            }
        }

        impl<N: ?Sized> Eq for $ty<N> {}
    };
}

definition! {
    /// A lock with at most one holder per name.
    ///
    /// A definition is a `const`: namespace, TTL and whether it is [fenced](Self::fenced).
    /// The name type `N` is what callers lock on, encoded by [`LockName`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_lease::{Lock, Store};
    ///
    /// const INVOICES: Lock<u64> = Lock::new("invoice", Duration::from_secs(30));
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lease::Error> {
    /// let store = Store::memory();
    /// let token = INVOICES.try_lock(&store, &42).await?.expect("nobody else holds it");
    /// assert!(INVOICES.try_lock(&store, &42).await?.is_none());
    /// assert!(token.release().await?);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// A bad definition does not compile:
    ///
    /// ```compile_fail
    /// use std::time::Duration;
    /// use tower_lease::Lock;
    ///
    /// const BAD: Lock<str> = Lock::new("with:colon", Duration::from_secs(1));
    /// ```
    ///
    /// ```compile_fail
    /// use std::time::Duration;
    /// use tower_lease::Lock;
    ///
    /// const BAD: Lock<str> = Lock::new("jobs", Duration::ZERO);
    /// ```
    Lock
}

definition! {
    /// A readers–writer lock: per name, one writer or any number of readers, each reader holding
    /// a lease of its own.
    ///
    /// By default reads and writes take turns ([`Fairness::PhaseFair`]): a waiting writer holds
    /// off the reads that come after it, and the reads that waited for a write go before the
    /// next writer; see [`fairness`](Self::fairness) for the other policies.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_lease::{RwLock, Store};
    ///
    /// const CATALOG: RwLock<str> = RwLock::new("catalog", Duration::from_secs(10));
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), tower_lease::Error> {
    /// let store = Store::memory();
    /// let a = CATALOG.try_read(&store, "shop-1").await?.unwrap();
    /// let b = CATALOG.try_read(&store, "shop-1").await?.unwrap();
    /// assert!(CATALOG.try_write(&store, "shop-1").await?.is_none());
    /// a.release().await?;
    /// b.release().await?;
    /// assert!(CATALOG.try_write(&store, "shop-1").await?.is_some());
    /// # Ok(())
    /// # }
    /// ```
    RwLock
}

impl<N: LockName + ?Sized> Lock<N> {
    /// Takes the lease on `name` if nobody holds it, in one round trip.
    ///
    /// Answers `None` when it is held. Errors only when the name is invalid or the store fails.
    pub async fn try_lock(&self, store: &Store, name: &N) -> Result<Option<LockToken<Self>>> {
        Ok(self.attempt(store, name).await?.acquired())
    }

    /// Like [`try_lock`](Self::try_lock), but while the lock is busy, waits up to `wait` for it:
    /// woken at once by a release in this process, or in any process when the store has
    /// [release notifications](crate::RedisStore::notifications) (as `RedisStore::connect` makes
    /// it); at the holder's lease end; and otherwise by polling (from 5 ms, backing off to
    /// 100 ms, with jitter). Answers `None` when the wait ran out; it never waits much longer
    /// than `wait` (one store round trip). A zero wait is exactly `try_lock`.
    ///
    /// Within one process, waiters of one name queue first come, first served, and only the
    /// first of them asks the store; across processes no order is promised. Dropping the future
    /// leaves nothing behind: a lease an attempt on the wire took is given back.
    pub async fn try_lock_for(
        &self,
        store: &Store,
        name: &N,
        wait: Duration,
    ) -> Result<Option<LockToken<Self>>> {
        let attempt = self
            .definition
            .acquire_within(store, Mode::Exclusive, name, wait)
            .await?;
        Ok(attempt.map(LockToken::new).acquired())
    }

    /// Like [`try_lock`](Self::try_lock), but when the lock is busy it also says how long the
    /// holder's lease has left.
    pub async fn attempt(&self, store: &Store, name: &N) -> Result<Attempt<LockToken<Self>>> {
        let attempt = self
            .definition
            .acquire(store, Mode::Exclusive, name)
            .await?;
        Ok(attempt.map(LockToken::new))
    }
}

impl<N: ?Sized> RwLock<N> {
    /// Sets who goes first when readers and writers contend, in every process; the default is
    /// [`Fairness::PhaseFair`]: reads and writes take turns, so neither side starves.
    ///
    /// Under [`PhaseFair`](Fairness::PhaseFair) and [`WritersFirst`](Fairness::WritersFirst), a
    /// write attempt refused by live readers leaves a *write intent* while which new readers
    /// are refused (under `PhaseFair`, until the write ends; under `WritersFirst`, with the
    /// intent's remaining time as their `retry_after`). The readers already in finish, and the
    /// writer gets in. Under `PhaseFair`, the readers that waited for that write
    /// ([`try_read_for`](Self::try_read_for), the layer's `.max_wait(..)`) then go before the
    /// next writer.
    ///
    /// An intent lives only while its writer waits, or retries within a short window. A refused
    /// attempt of a writer waiting with [`try_write_for`](Self::try_write_for) or the layer's
    /// `.max_wait(..)` leaves it for 500 ms (the TTL, if shorter); such a writer attempts at
    /// least twice per window, so its intent lasts as long as it waits, and withdraws it when it
    /// gives up: its wait runs out, the store fails, or its future is dropped (the client left;
    /// the withdrawal then finishes in the background, within the store's timeout), or crashes
    /// (the intent then ends with its window). An intent that another writer has written since
    /// stays. A refused attempt that does not wait (`try_write`, a layer without a wait) leaves
    /// it for 1.5 s, whatever the TTL: a writer that comes back within that finds its place
    /// kept, and gets in once the reads in flight end. That covers an HTTP client that obeys the
    /// layer's `Retry-After`, which for a refused write says 1 s (it counts whole seconds, and
    /// never says 0); a caller of [`attempt_write`](Self::attempt_write) is told how long the
    /// readers' leases have left, and should come back within the 1.5 s all the same, or find the
    /// intent gone and the reads that came meanwhile in its way. A writer that never comes back
    /// keeps readers out for those 1.5 s.
    ///
    /// Under [`ReadersFirst`](Fairness::ReadersFirst), a writer is refused as long as any
    /// reader lease lives, and overlapping readers can keep it out for good.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_lease::{Fairness, RwLock};
    ///
    /// const CATALOG: RwLock<str> = RwLock::new("catalog", Duration::from_secs(10));
    /// const REPORTS: RwLock<str> =
    ///     RwLock::new("reports", Duration::from_secs(10)).fairness(Fairness::ReadersFirst);
    /// assert_eq!(CATALOG.fairness_policy(), Fairness::PhaseFair);
    /// assert_eq!(REPORTS.fairness_policy(), Fairness::ReadersFirst);
    /// ```
    pub const fn fairness(self, fairness: Fairness) -> Self {
        Self {
            definition: Definition {
                fairness,
                ..self.definition
            },
            name: PhantomData,
        }
    }

    /// Who goes first when readers and writers contend; see [`fairness`](Self::fairness).
    pub const fn fairness_policy(&self) -> Fairness {
        self.definition.fairness
    }
}

impl<N: LockName + ?Sized> RwLock<N> {
    /// Takes a shared (reader) lease on `name` unless a writer holds it.
    pub async fn try_read(&self, store: &Store, name: &N) -> Result<Option<ReadToken<Self>>> {
        Ok(self.attempt_read(store, name).await?.acquired())
    }

    /// Takes the exclusive (writer) lease on `name` unless a writer or any live reader holds it.
    pub async fn try_write(&self, store: &Store, name: &N) -> Result<Option<LockToken<Self>>> {
        Ok(self.attempt_write(store, name).await?.acquired())
    }

    /// Like [`try_read`](Self::try_read), but waits up to `wait` while a writer holds the lock;
    /// see [`Lock::try_lock_for`].
    pub async fn try_read_for(
        &self,
        store: &Store,
        name: &N,
        wait: Duration,
    ) -> Result<Option<ReadToken<Self>>> {
        let attempt = self
            .definition
            .acquire_within(store, Mode::Read, name, wait)
            .await?;
        Ok(attempt.map(ReadToken::new).acquired())
    }

    /// Like [`try_write`](Self::try_write), but waits up to `wait` while a writer or readers
    /// hold the lock; see [`Lock::try_lock_for`].
    pub async fn try_write_for(
        &self,
        store: &Store,
        name: &N,
        wait: Duration,
    ) -> Result<Option<LockToken<Self>>> {
        let attempt = self
            .definition
            .acquire_within(store, Mode::Write, name, wait)
            .await?;
        Ok(attempt.map(LockToken::new).acquired())
    }

    /// Like [`try_read`](Self::try_read), also answering how long the writer's lease has left.
    pub async fn attempt_read(&self, store: &Store, name: &N) -> Result<Attempt<ReadToken<Self>>> {
        let attempt = self.definition.acquire(store, Mode::Read, name).await?;
        Ok(attempt.map(ReadToken::new))
    }

    /// Like [`try_write`](Self::try_write), also answering how long until the blocking leases
    /// (the writer's, or the last live reader's) end.
    pub async fn attempt_write(&self, store: &Store, name: &N) -> Result<Attempt<LockToken<Self>>> {
        let attempt = self.definition.acquire(store, Mode::Write, name).await?;
        Ok(attempt.map(LockToken::new))
    }
}
