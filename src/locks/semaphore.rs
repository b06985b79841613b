//! [`Semaphore`]: at most K leases per name, each a [`Permit`].

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use crate::backend::Mode;
use crate::definition::Definition;
use crate::definition::attempt::Attempt;
use crate::locks::token::Permit;
use crate::name::{LockName, check_name};
use crate::store::Store;
use crate::{Error, Result};

/// A counting lock: per name, at most `permits` holders at once across every process that
/// shares the store, each holding a [`Permit`] with a lease of its own.
///
/// K exports per tenant, K calls at once into a fragile partner API, K seats of a section: a
/// permit is taken while fewer than `permits` permits of the name are live, and a permit whose
/// holder crashed frees its slot when its TTL runs out.
///
/// ```
/// use std::time::Duration;
/// use tower_lease::{Semaphore, Store};
///
/// const EXPORTS: Semaphore<str> = Semaphore::new("export", 2, Duration::from_secs(30));
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), tower_lease::Error> {
/// let store = Store::memory();
/// let a = EXPORTS.try_acquire(&store, "tenant-7").await?.unwrap();
/// let b = EXPORTS.try_acquire(&store, "tenant-7").await?.unwrap();
/// assert!(EXPORTS.try_acquire(&store, "tenant-7").await?.is_none());
/// assert_eq!(EXPORTS.in_use(&store, "tenant-7").await?, 2);
/// a.release().await?;
/// assert!(EXPORTS.try_acquire(&store, "tenant-7").await?.is_some());
/// # b.release().await?;
/// # Ok(())
/// # }
/// ```
///
/// The limit is checked by each acquisition, against the permits live at that moment: a
/// definition used with different limits for one name ([`with_permits`](Self::with_permits), a
/// layer's per-request [`permits`](crate::SemaphoreLayer::permits)) lets each caller in while
/// fewer than *its* limit are live, whoever holds them. Semaphores take no fencing tokens.
///
/// A semaphore without permits does not compile:
///
/// ```compile_fail
/// use std::time::Duration;
/// use tower_lease::Semaphore;
///
/// const NONE: Semaphore<str> = Semaphore::new("export", 0, Duration::from_secs(30));
/// ```
pub struct Semaphore<N: ?Sized> {
    definition: Definition,
    name: PhantomData<fn(&N)>,
}

impl<N: ?Sized> Semaphore<N> {
    /// Defines a semaphore in `namespace` of `permits` permits per name, whose leases last `ttl`
    /// unless extended.
    ///
    /// # Panics
    ///
    /// If `permits` is 0, or for the namespace and TTL rules of [`Lock::new`](crate::Lock::new).
    /// In a `const` item this is a compile error. Use [`try_new`](Self::try_new) for values read
    /// at run time.
    pub const fn new(namespace: &'static str, permits: u32, ttl: Duration) -> Self {
        assert!(
            permits > 0,
            "tower-lease: a semaphore needs at least 1 permit"
        );
        let definition = Definition {
            permits,
            ..Definition::new(namespace, ttl)
        };
        Self {
            definition,
            name: PhantomData,
        }
    }

    /// Like [`new`](Self::new), but answers [`Error::InvalidPermits`],
    /// [`Error::InvalidNamespace`] or [`Error::InvalidTtl`] instead of panicking.
    pub fn try_new(namespace: &'static str, permits: u32, ttl: Duration) -> Result<Self> {
        let definition = Definition::try_new(namespace, ttl)?;
        Self {
            definition,
            name: PhantomData,
        }
        .with_permits(permits)
    }

    /// The same semaphore with another number of permits, for a limit known at run time (a
    /// tenant's plan); [`Error::InvalidPermits`] for 0.
    pub fn with_permits(self, permits: u32) -> Result<Self> {
        if permits == 0 {
            return Err(Error::InvalidPermits);
        }
        let definition = Definition {
            permits,
            ..self.definition
        };
        Ok(Self {
            definition,
            name: PhantomData,
        })
    }

    /// How many permits each name has.
    pub const fn permits(&self) -> u32 {
        self.definition.permits
    }

    /// How long a permit's lease lasts unless extended.
    pub const fn ttl(&self) -> Duration {
        self.definition.ttl
    }

    /// The namespace this semaphore's names live in.
    pub const fn namespace(&self) -> &'static str {
        self.definition.namespace
    }

    pub(crate) const fn definition(&self) -> Definition {
        self.definition
    }
}

impl<N: LockName + ?Sized> Semaphore<N> {
    /// Takes a permit on `name` if fewer than [`permits`](Self::permits) are live, in one round
    /// trip.
    ///
    /// Answers `None` when all are taken. Errors only when the name is invalid or the store
    /// fails.
    pub async fn try_acquire(&self, store: &Store, name: &N) -> Result<Option<Permit<Self>>> {
        Ok(self.attempt(store, name).await?.acquired())
    }

    /// Like [`try_acquire`](Self::try_acquire), but while all permits are taken, waits up to
    /// `wait` for one: woken by a release as [`Lock::try_lock_for`](crate::Lock::try_lock_for)
    /// describes, or at the end of the earliest live permit's lease. A zero wait is exactly
    /// `try_acquire`.
    pub async fn try_acquire_for(
        &self,
        store: &Store,
        name: &N,
        wait: Duration,
    ) -> Result<Option<Permit<Self>>> {
        let attempt = self
            .definition
            .acquire_within(store, Mode::Permit, name, wait)
            .await?;
        Ok(attempt.map(Permit::new).acquired())
    }

    /// Like [`try_acquire`](Self::try_acquire), but when all permits are taken it also says
    /// how long until the earliest live permit's lease ends.
    pub async fn attempt(&self, store: &Store, name: &N) -> Result<Attempt<Permit<Self>>> {
        let attempt = self.definition.acquire(store, Mode::Permit, name).await?;
        Ok(attempt.map(Permit::new))
    }

    /// How many permits of `name` are live now, across every process.
    pub async fn in_use(&self, store: &Store, name: &N) -> Result<u32> {
        let name = name.lock_name();
        check_name(&name)?;
        store.in_use(self.definition.lock_ref(&name)).await
    }
}

impl<N: ?Sized> Clone for Semaphore<N> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<N: ?Sized> Copy for Semaphore<N> {}

impl<N: ?Sized> fmt::Debug for Semaphore<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("namespace", &self.definition.namespace)
            .field("permits", &self.definition.permits)
            .field("ttl", &self.definition.ttl)
            .finish()
    }
}

impl<N: ?Sized> PartialEq for Semaphore<N> {
    fn eq(&self, other: &Self) -> bool {
        self.definition == other.definition
    }
}

impl<N: ?Sized> Eq for Semaphore<N> {}
