//! Write intents as this process hears of them, for the shared read leases of the layer: a
//! refused writer of a [intent-leaving](crate::Fairness::leaves_write_intent) lock in this process
//! raises them at once, and one in another process through the store's backend, which hands
//! what it hears to [`NotificationSink::write_intent`](super::NotificationSink::write_intent).
//!
//! A share listens while it holds its lease; once raised, it takes no new readers, so its last
//! reader leaves and releases it without waiting for a heartbeat to report the intent.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use tokio::sync::Notify;
use tokio::sync::futures::Notified;

/// The listeners of one store, by the lock's key ([`Hub::key`](super::Hub::key)).
#[derive(Default)]
pub(crate) struct Intents {
    listeners: Mutex<HashMap<Vec<u8>, Vec<Weak<Signal>>>>,
}

#[derive(Default)]
struct Signal {
    raised: AtomicBool,
    notify: Notify,
}

/// One share's ear for the intents of its name; dropped, it stops listening.
pub(crate) struct IntentListener {
    intents: Arc<Intents>,
    key: Vec<u8>,
    signal: Arc<Signal>,
}

impl Intents {
    fn lock(&self) -> MutexGuard<'_, HashMap<Vec<u8>, Vec<Weak<Signal>>>> {
        self.listeners.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Listens for the intents of `key` from now on.
    pub(crate) fn listen(self: &Arc<Self>, key: Vec<u8>) -> IntentListener {
        let signal = Arc::new(Signal::default());
        self.lock()
            .entry(key.clone())
            .or_default()
            .push(Arc::downgrade(&signal));
        IntentListener {
            intents: self.clone(),
            key,
            signal,
        }
    }

    /// A writer waits on `key`: every listener of it hears so, once and for good.
    pub(crate) fn raise(&self, key: &[u8]) {
        let signals: Vec<_> = match self.lock().get(key) {
            Some(signals) => signals.iter().filter_map(Weak::upgrade).collect(),
            None => return,
        };
        for signal in signals {
            signal.raised.store(true, Ordering::Release);
            signal.notify.notify_waiters();
        }
    }
}

impl IntentListener {
    /// Whether an intent was raised since this listener began.
    pub(crate) fn raised(&self) -> bool {
        self.signal.raised.load(Ordering::Acquire)
    }

    /// Resolves at the next intent raised; check [`raised`](Self::raised) after creating it
    /// and before waiting, so one raised meanwhile is not missed.
    pub(crate) fn notified(&self) -> Notified<'_> {
        self.signal.notify.notified()
    }
}

impl Drop for IntentListener {
    fn drop(&mut self) {
        let mut listeners = self.intents.lock();
        if let Some(signals) = listeners.get_mut(&self.key) {
            signals.retain(|signal| {
                signal.strong_count() > 0 && !signal.ptr_eq(&Arc::downgrade(&self.signal))
            });
            if signals.is_empty() {
                listeners.remove(&self.key);
            }
        }
    }
}

impl fmt::Debug for Intents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Intents")
            .field("keys", &self.lock().len())
            .finish()
    }
}
