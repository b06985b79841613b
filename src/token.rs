//! Tokens: the proof of holding a lease, and the only way to extend or release it.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::time::Duration;

use std::sync::Mutex;

use tokio::time::Instant;

use crate::Result;
use crate::lease::Held;
use crate::lock::Spec;
use crate::name::check_name;
use crate::owned_name::OwnedName;
use crate::store::{Acquisition, Extended, LeaseRef, Mode, Secret, Store};
use crate::telemetry::{self, AcquireOutcome, ExtendOutcome, Moment};

/// The answer to an acquisition that says how long to wait when the lock is held.
#[derive(Debug)]
#[must_use]
pub enum Attempt<T> {
    /// The lease was taken.
    Acquired(T),
    /// Someone else holds the lock.
    Busy {
        /// How long until the blocking lease ends, unless its holder extends or releases it.
        retry_after: Duration,
    },
}

impl<T> Attempt<T> {
    /// The token, if the lease was taken.
    pub fn acquired(self) -> Option<T> {
        match self {
            Attempt::Acquired(token) => Some(token),
            Attempt::Busy { .. } => None,
        }
    }

    /// How long until the blocking lease ends, if the lock was held.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Attempt::Acquired(_) => None,
            Attempt::Busy { retry_after } => Some(*retry_after),
        }
    }

    /// Maps the token, keeping a `Busy` answer as it is.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Attempt<U> {
        match self {
            Attempt::Acquired(token) => Attempt::Acquired(f(token)),
            Attempt::Busy { retry_after } => Attempt::Busy { retry_after },
        }
    }
}

/// A lease we hold, of any mode: what both token types and the layer are built on.
pub(crate) struct Holding {
    store: Store,
    spec: Spec,
    mode: Mode,
    name: OwnedName,
    secret: Secret,
    fence: Option<u64>,
    /// When the last confirmed acquire or extend of this lease was sent: a [`Held`] made from
    /// the token counts the lease's validity from there.
    confirmed_at: Mutex<Instant>,
    /// When the store confirmed the lease, for `tower_lease_hold_seconds`.
    #[cfg(feature = "metrics")]
    taken: Moment,
}

impl Holding {
    /// Takes the lease on `name` if it is free; a store failure counts as `store_error`.
    pub(crate) fn acquire(
        store: Store,
        spec: Spec,
        mode: Mode,
        name: Cow<'_, [u8]>,
    ) -> impl Future<Output = Result<Attempt<Holding>>> + Send + '_ {
        Self::acquire_as(store, spec, mode, name, Some(AcquireOutcome::StoreError))
    }

    /// Like [`acquire`](Self::acquire), with the outcome a store failure counts as (the layer
    /// runs the request unlocked under `fail_open`), or `None` when the caller counts the
    /// outcome itself (a bounded wait counts once, at its end).
    ///
    /// A function returning a block rather than an `async fn`: an `async fn` keeps each of its
    /// arguments twice across an await (as it was passed, and as the local it is moved into),
    /// and this future is alive for every acquisition in flight, inside the layer's.
    ///
    /// The name is any form that can be kept ([`OwnedName`]: a borrowed one is copied once the
    /// lease is taken, a short one into the lease itself).
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn would keep its arguments twice"
    )]
    pub(crate) fn acquire_as<N>(
        store: Store,
        spec: Spec,
        mode: Mode,
        name: N,
        on_store_error: Option<AcquireOutcome>,
    ) -> impl Future<Output = Result<Attempt<Holding>>> + Send
    where
        N: AsRef<[u8]> + Into<OwnedName> + Send,
    {
        Self::acquire_with(store, spec, mode, name, on_store_error, Secret::random())
    }

    /// Like [`acquire_as`](Self::acquire_as), with the lease's `secret`: a waiting writer's
    /// attempts all carry one, so that the write intent they leave can be told from another
    /// writer's when it withdraws it.
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn would keep its arguments twice"
    )]
    pub(crate) fn acquire_with<N>(
        store: Store,
        spec: Spec,
        mode: Mode,
        name: N,
        on_store_error: Option<AcquireOutcome>,
        secret: Secret,
    ) -> impl Future<Output = Result<Attempt<Holding>>> + Send
    where
        N: AsRef<[u8]> + Into<OwnedName> + Send,
    {
        async move {
            if let Err(invalid) = check_name(name.as_ref()) {
                if on_store_error.is_some() {
                    telemetry::refused(spec.namespace, mode, AcquireOutcome::InvalidName);
                }
                return Err(invalid);
            }
            // Taken before the command leaves, so the lease's end is never overestimated.
            let sent_at = Instant::now();
            let sent = Moment::now();
            let acquisition = store
                .backend()
                .acquire(LeaseRef::new(spec.lock_ref(name.as_ref()), mode, &secret))
                .await;
            let answered = Moment::now();
            let acquired = matches!(acquisition, Ok(Acquisition::Acquired { .. }));
            let outcome = on_store_error.map(|on_store_error| match &acquisition {
                Ok(Acquisition::Acquired { .. }) => AcquireOutcome::Acquired,
                Ok(Acquisition::Busy { .. }) => AcquireOutcome::Held,
                Err(_) => on_store_error,
            });
            let namespace = spec.namespace;
            telemetry::store_answered(namespace, mode, outcome, acquired, sent, answered);
            if mode == Mode::Write
                && matches!(acquisition, Ok(Acquisition::Busy { .. }))
                && spec.lock_ref(name.as_ref()).write_intent().is_some()
            {
                // This process's shares of the name hear of the intent at once; other
                // processes' through the store's message.
                let key = store.intent_key(namespace, name.as_ref());
                store.intents().raise(&key);
            }
            match acquisition? {
                Acquisition::Acquired { fence } => Ok(Attempt::Acquired(Holding {
                    store,
                    spec,
                    mode,
                    name: name.into(),
                    secret,
                    fence,
                    confirmed_at: Mutex::new(sent_at),
                    #[cfg(feature = "metrics")]
                    taken: answered,
                })),
                Acquisition::Busy { retry_after } => Ok(Attempt::Busy { retry_after }),
            }
        }
    }

    /// This lease, as [`Backend`](crate::store::Backend) calls take it.
    pub(crate) fn lease_ref(&self) -> LeaseRef<'_> {
        LeaseRef::new(
            self.spec.lock_ref(self.name.as_bytes()),
            self.mode,
            &self.secret,
        )
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    pub(crate) async fn extend(&self) -> Result<bool> {
        let sent_at = Instant::now();
        let extended = self.store.backend().extend(self.lease_ref()).await;
        if matches!(extended, Ok(Extended::Held | Extended::HeldWriterWaiting)) {
            *self.confirmed_at.lock().unwrap_or_else(|e| e.into_inner()) = sent_at;
        }
        let outcome = match extended {
            Ok(Extended::Gone) => ExtendOutcome::Lost,
            Ok(_) => ExtendOutcome::Ok,
            Err(_) => ExtendOutcome::Error,
        };
        telemetry::extend(self.spec.namespace, self.mode, outcome);
        extended.map(Extended::is_held)
    }

    pub(crate) async fn release(&self) -> Result<bool> {
        let released = self.store.backend().release(self.lease_ref()).await;
        // Whatever the answer, the lease is not ours any more: a waiter here may try now.
        let rooms = self.store.wait_rooms();
        rooms.released(self.mode, self.spec.namespace, self.name.as_bytes());
        released
    }

    pub(crate) fn fence(&self) -> Option<u64> {
        self.fence
    }

    /// When the last confirmed acquire or extend of this lease was sent.
    pub(crate) fn confirmed_at(&self) -> Instant {
        *self.confirmed_at.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn name(&self) -> &[u8] {
        self.name.as_bytes()
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.spec.ttl
    }

    pub(crate) fn namespace(&self) -> &'static str {
        self.spec.namespace
    }

    pub(crate) fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether a refused writer of this lock leaves a write intent.
    pub(crate) fn writer_preferred(&self) -> bool {
        self.spec.writer_preferred
    }
}

#[cfg(feature = "metrics")]
impl Drop for Holding {
    fn drop(&mut self) {
        telemetry::lease_ended(self.spec.namespace, self.mode, self.taken);
    }
}

impl fmt::Debug for Holding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The secret stays out: whoever has it can release the lock.
        f.debug_struct("Lease")
            .field("namespace", &self.spec.namespace)
            .field("name", &self.name)
            .field("mode", &self.mode)
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}

macro_rules! token {
    ($(#[$doc:meta])* $ty:ident) => {
        $(#[$doc])*
        #[must_use = "a lease that is not released blocks others until its TTL runs out"]
        pub struct $ty<L> {
            holding: Holding,
            lock: PhantomData<fn() -> L>,
        }

        impl<L> $ty<L> {
            pub(crate) fn new(holding: Holding) -> Self {
                Self { holding, lock: PhantomData }
            }

            /// Gives the lease up so others can take it at once.
            ///
            /// Answers `false` when the lease had already run out (someone else may hold the lock
            /// now, and their lease is left alone).
            pub async fn release(self) -> Result<bool> {
                self.holding.release().await
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

        impl<L> fmt::Debug for $ty<L> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.holding, f)
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
