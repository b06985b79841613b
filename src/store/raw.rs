//! [`RawLease`]: a lease we hold, of any mode, and how it is taken, extended and released.

use std::borrow::Cow;
use std::fmt;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::Result;
use crate::backend::{Acquisition, Extended, Hub, LeaseRef, Mode, Secret};
use crate::definition::Definition;
use crate::definition::attempt::{Attempt, outcome};
use crate::name::check_name;
use crate::name::owned::OwnedName;
use crate::store::Store;
use crate::telemetry::{self, AcquireOutcome, ExtendOutcome, Moment};

/// How long a lease whose acquire or extend was sent at some moment is surely still held from
/// that moment: its TTL less Redlock's allowance for the store's clock running faster than ours.
pub(crate) fn valid_for(ttl: Duration) -> Duration {
    ttl.saturating_sub(ttl / 100 + Duration::from_millis(2))
}

/// A lease we hold, of any mode: what both token types and the layer are built on.
pub(crate) struct RawLease {
    store: Store,
    definition: Definition,
    mode: Mode,
    name: OwnedName,
    secret: Secret,
    fence: Option<u64>,
    /// When the last confirmed acquire or extend of this lease was sent: a [`Held`](crate::Held) made from
    /// the token counts the lease's validity from there.
    confirmed_at: Mutex<Instant>,
    /// When the store confirmed the lease, for `tower_lease_hold_seconds`.
    #[cfg(feature = "metrics")]
    taken: Moment,
    /// Whether this holding's drop ends the lease in the metrics: not once it was handed over
    /// (see [`hand_over`](Self::hand_over)).
    #[cfg(feature = "metrics")]
    counted: std::sync::atomic::AtomicBool,
}

impl RawLease {
    /// Takes the lease on `name` if it is free; a store failure counts as `store_error`.
    pub(crate) fn acquire(
        store: Store,
        definition: Definition,
        mode: Mode,
        name: Cow<'_, [u8]>,
    ) -> impl Future<Output = Result<Attempt<RawLease>>> + Send + '_ {
        Self::acquire_counted(
            store,
            definition,
            mode,
            name,
            Some(AcquireOutcome::StoreError),
        )
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
    pub(crate) fn acquire_counted<N>(
        store: Store,
        definition: Definition,
        mode: Mode,
        name: N,
        on_store_error: Option<AcquireOutcome>,
    ) -> impl Future<Output = Result<Attempt<RawLease>>> + Send
    where
        N: AsRef<[u8]> + Into<OwnedName> + Send,
    {
        Self::acquire_with_secret(
            store,
            definition,
            mode,
            name,
            on_store_error,
            Secret::random(),
            false,
        )
    }

    /// Like [`acquire_counted`](Self::acquire_counted), with the lease's `secret`: a waiting writer's
    /// attempts all carry one, so that the write intent they leave can be told from another
    /// writer's when it withdraws it, and a waiting reader's, so that the store knows it as the
    /// same waiting reader (`waiting`: an attempt of a bounded wait, see
    /// [`LeaseRef::waiting`](crate::backend::LeaseRef::waiting)).
    #[allow(
        clippy::manual_async_fn,
        reason = "an async fn would keep its arguments twice"
    )]
    pub(crate) fn acquire_with_secret<N>(
        store: Store,
        definition: Definition,
        mode: Mode,
        name: N,
        on_store_error: Option<AcquireOutcome>,
        secret: Secret,
        waiting: bool,
    ) -> impl Future<Output = Result<Attempt<RawLease>>> + Send
    where
        N: AsRef<[u8]> + Into<OwnedName> + Send,
    {
        async move {
            if let Err(invalid) = check_name(name.as_ref()) {
                if on_store_error.is_some() {
                    telemetry::refused(definition.namespace, mode, AcquireOutcome::InvalidName);
                }
                return Err(invalid);
            }
            // Taken before the command leaves, so the lease's end is never overestimated.
            let sent_at = Instant::now();
            let sent = Moment::now();
            let lease = LeaseRef::new(definition.lock_ref(name.as_ref()), mode, &secret);
            let lease = if waiting { lease.waiting() } else { lease };
            let acquisition = store.acquire(lease).await;
            if let Err(error) = &acquisition {
                // A call that timed out may still land: what it takes is given back.
                store.give_back(lease, error);
            }
            let answered = Moment::now();
            let answer = acquisition.map(|acquisition| match acquisition {
                Acquisition::Acquired { fence } => Attempt::Acquired(fence),
                Acquisition::Busy { retry_after } => Attempt::Busy { retry_after },
            });
            let acquired = matches!(answer, Ok(Attempt::Acquired(_)));
            let outcome =
                on_store_error.map(|on_store_error| outcome(&answer, false, on_store_error));
            let namespace = definition.namespace;
            telemetry::store_answered(namespace, mode, outcome, acquired, sent, answered);
            if mode == Mode::Write
                && matches!(answer, Ok(Attempt::Busy { .. }))
                && definition.lock_ref(name.as_ref()).write_intent().is_some()
            {
                // This process's shares of the name hear of the intent at once; other
                // processes' through the store's message.
                let key = Hub::key(Mode::Write, namespace, name.as_ref());
                store.intents().raise(&key);
            }
            Ok(answer?.map(|fence| RawLease {
                store,
                definition,
                mode,
                name: name.into(),
                secret,
                fence,
                confirmed_at: Mutex::new(sent_at),
                #[cfg(feature = "metrics")]
                taken: answered,
                #[cfg(feature = "metrics")]
                counted: true.into(),
            }))
        }
    }

    /// The reservation of an idempotency key that
    /// [`idempotency_begin`](crate::backend::Backend::idempotency_begin), sent at `sent_at`,
    /// answered `Reserved` for `secret`.
    pub(crate) fn reserved(
        store: Store,
        definition: Definition,
        name: OwnedName,
        secret: Secret,
        fence: Option<u64>,
        sent_at: Instant,
    ) -> RawLease {
        let answered = Moment::now();
        telemetry::store_answered(
            definition.namespace,
            Mode::Reservation,
            None,
            true,
            answered,
            answered,
        );
        RawLease {
            store,
            definition,
            mode: Mode::Reservation,
            name,
            secret,
            fence,
            confirmed_at: Mutex::new(sent_at),
            #[cfg(feature = "metrics")]
            taken: answered,
            #[cfg(feature = "metrics")]
            counted: true.into(),
        }
    }

    /// The same lease for a new owner, when the old one (a [`Held`](crate::Held)'s state,
    /// which handles may keep alive) stops holding it without a release: same secret, fence
    /// and confirmed time. The lease ends once in the metrics, when the new owner is done.
    pub(crate) fn hand_over(&self) -> RawLease {
        #[cfg(feature = "metrics")]
        self.counted
            .store(false, std::sync::atomic::Ordering::Relaxed);
        RawLease {
            store: self.store.clone(),
            definition: self.definition,
            mode: self.mode,
            name: self.name.clone(),
            secret: self.secret.clone(),
            fence: self.fence,
            confirmed_at: Mutex::new(self.confirmed_at()),
            #[cfg(feature = "metrics")]
            taken: self.taken,
            #[cfg(feature = "metrics")]
            counted: true.into(),
        }
    }

    /// Records a confirmed extension by the heartbeat, sent at `sent_at`.
    pub(crate) fn confirmed(&self, sent_at: Instant) {
        *self.confirmed_at.lock().unwrap_or_else(|e| e.into_inner()) = sent_at;
    }

    /// This lease, as [`Backend`](crate::backend::Backend) calls take it.
    pub(crate) fn lease_ref(&self) -> LeaseRef<'_> {
        LeaseRef::new(
            self.definition.lock_ref(self.name.as_bytes()),
            self.mode,
            &self.secret,
        )
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    pub(crate) async fn extend(&self) -> Result<bool> {
        let sent_at = Instant::now();
        let extended = self.store.extend(self.lease_ref()).await;
        if matches!(extended, Ok(Extended::Held | Extended::HeldWriterWaiting)) {
            *self.confirmed_at.lock().unwrap_or_else(|e| e.into_inner()) = sent_at;
        }
        let outcome = match extended {
            Ok(Extended::Gone) => ExtendOutcome::Lost,
            Ok(_) => ExtendOutcome::Ok,
            Err(_) => ExtendOutcome::Error,
        };
        telemetry::extend(self.definition.namespace, self.mode, outcome);
        extended.map(Extended::is_held)
    }

    pub(crate) async fn release(&self) -> Result<bool> {
        let (store, lease) = (&self.store, self.lease_ref());
        // Confirmed live until after now: the store need not ask whether the lease ran out.
        let live = Instant::now() < self.confirmed_at() + valid_for(self.definition.ttl);
        let released = if live {
            store.release_live(lease).await
        } else {
            store.release(lease).await
        };
        // Whatever the answer, the lease is not ours any more: a waiter here may try now.
        let rooms = self.store.wait_rooms();
        rooms.released(self.mode, self.definition.namespace, self.name.as_bytes());
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
        self.definition.ttl
    }

    pub(crate) fn namespace(&self) -> &'static str {
        self.definition.namespace
    }

    pub(crate) fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether a refused writer of this lock leaves a write intent (phase-fair and writers-first
    /// locks).
    pub(crate) fn leaves_write_intent(&self) -> bool {
        self.definition.fairness.leaves_write_intent()
    }
}

#[cfg(feature = "metrics")]
impl Drop for RawLease {
    fn drop(&mut self) {
        if *self.counted.get_mut() {
            telemetry::lease_ended(self.definition.namespace, self.mode, self.taken);
        }
    }
}

impl RawLease {
    /// Writes this holding as `type_name { namespace, name, mode, fence, .. }`: a token prints
    /// as what it is (`LockToken { .. }`), not as the lease inside it.
    pub(crate) fn debug_as(&self, f: &mut fmt::Formatter<'_>, type_name: &str) -> fmt::Result {
        // The secret stays out: whoever has it can release the lock.
        f.debug_struct(type_name)
            .field("namespace", &self.definition.namespace)
            .field("name", &self.name)
            .field("mode", &self.mode)
            .field("fence", &self.fence)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for RawLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.debug_as(f, "RawLease")
    }
}
