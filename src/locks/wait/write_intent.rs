//! [`KeptIntent`]: the write intent of a writer that waits, kept alive by its attempts while it
//! waits and withdrawn when it gives up.

use std::time::Duration;

use crate::backend::{LeaseRef, Mode, Secret};
use crate::definition::Definition;
use crate::lease::finish_on_drop::FinishOnDrop;
use crate::store::Store;

/// A waiting writer's part in the write intent of a
/// [phase-fair or writers-first](crate::RwLock::fairness) lock.
///
/// An intent lives for a short window after each refused attempt
/// ([`LockRef::write_intent`](crate::backend::LockRef::write_intent)), so the waiter attempts at
/// least twice per window, and every attempt carries one secret, which the intent holds. When
/// the waiter gives up (its wait ran out, the store failed, or it was dropped because its client
/// left) the intent goes with it, unless another writer has written its own since: readers must
/// not wait for a writer that is gone.
///
/// A waiter dropped while an attempt is on the wire sends the withdrawal after that attempt, on
/// the same connection, so Redis runs them in order; when they cross anyway (the attempt's
/// second trip after `NOSCRIPT`, a cluster redirect) the attempt's intent lasts its window.
pub(crate) struct KeptIntent {
    lock: Parts,
    window: Duration,
    /// Whether a refused attempt may have left an intent that is still ours.
    left: bool,
}

/// What a withdrawal needs: the lock and the secret the attempts carried.
#[derive(Clone)]
struct Parts {
    store: Store,
    definition: Definition,
    name: Box<[u8]>,
    secret: Secret,
}

impl KeptIntent {
    /// The intent of a writer waiting on `name` with attempts that carry `secret`; `None` for
    /// a reader, a permit or a lock that does not prefer writers, which leave no intent.
    pub(crate) fn new(
        store: &Store,
        definition: Definition,
        mode: Mode,
        name: &[u8],
        secret: &Secret,
    ) -> Option<Self> {
        let window = definition
            .lock_ref(name)
            .write_intent()
            .filter(|_| mode == Mode::Write)?;
        let lock = Parts {
            store: store.clone(),
            definition,
            name: name.into(),
            secret: secret.clone(),
        };
        Some(Self {
            lock,
            window,
            left: false,
        })
    }

    /// The longest pause between two attempts that keeps the intent alive: half its window, so
    /// an attempt late by up to half a window (a slow round trip, a busy executor) still renews
    /// it in time.
    pub(crate) fn renew_within(&self) -> Duration {
        self.window / 2
    }

    /// An attempt was refused: it may have left or renewed the intent.
    pub(crate) fn refused(&mut self) {
        self.left = true;
    }

    /// The writer got in: its acquisition removed the intent.
    pub(crate) fn acquired(mut self) {
        self.left = false;
    }

    /// The writer gives up: the intent is withdrawn before this answers, within the store's
    /// timeout, and in the background if the caller is dropped meanwhile.
    pub(crate) async fn withdraw(mut self) {
        if std::mem::take(&mut self.left) {
            let lock = self.lock.clone();
            FinishOnDrop::release(Box::pin(withdraw(lock))).await;
        }
    }
}

impl Drop for KeptIntent {
    fn drop(&mut self) {
        if !self.left {
            return;
        }
        // Outside a runtime nothing can be sent; the intent ends with its window.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(withdraw(self.lock.clone()));
        }
    }
}

/// Withdraws the intent if it is still `lock`'s, and then lets this process's waiters of the
/// name try again (readers refused by the intent among them).
async fn withdraw(lock: Parts) {
    let Parts {
        store,
        definition,
        name,
        secret,
    } = lock;
    let lease = LeaseRef::new(definition.lock_ref(&name), Mode::Write, &secret);
    match store.withdraw_intent(lease).await {
        Ok(true) => store
            .wait_rooms()
            .released(Mode::Write, definition.namespace, &name),
        Ok(false) => {}
        Err(error) => tracing::debug!(
            namespace = definition.namespace,
            %error,
            "withdrawing a write intent failed; it ends with its window"
        ),
    }
}
