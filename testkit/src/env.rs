//! [`Env`]: what a scenario runs on (the store under test, and the hooks a backend may add).

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;

use tower_lease::Store;

use crate::Calls;

/// A look behind a store's back: whether the backend still keeps the write intent of a name,
/// given its namespace and name.
pub type IntentProbe =
    Box<dyn Fn(&str, &[u8]) -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// Wipes everything the backend keeps (leases, fence counters, idempotency records), as a
/// `FLUSHALL` or a restart without persistence would.
pub type DataLoss = Box<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// What a scenario runs on: the store under test and, where the backend has them, a second
/// store on the same backend as another process would make it, and a look at its write intents.
pub struct Env {
    /// The store under test.
    pub store: Store,
    elsewhere: Option<Store>,
    intent_probe: Option<IntentProbe>,
    data_loss: Option<DataLoss>,
    guards: Vec<Box<dyn Any + Send + Sync>>,
}

impl Env {
    /// An environment on `store` alone.
    pub fn new(store: Store) -> Self {
        Env {
            store,
            elsewhere: None,
            intent_probe: None,
            data_loss: None,
            guards: Vec::new(),
        }
    }

    /// Adds a second store on the same backend, as another process would make it (for Redis:
    /// with release notifications of its own); the scenarios that need one also run across
    /// the two.
    pub fn with_elsewhere(mut self, store: Store) -> Self {
        self.elsewhere = Some(store);
        self
    }

    /// Adds a look at the write intents the backend keeps, so the scenarios also check that
    /// an intent is gone, not only that readers get in.
    pub fn with_intent_probe(
        mut self,
        probe: impl Fn(&str, &[u8]) -> Pin<Box<dyn Future<Output = bool> + Send>>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.intent_probe = Some(Box::new(probe));
        self
    }

    /// Adds a way to wipe the backend's data (everything it keeps: leases, fence counters,
    /// idempotency records), as a `FLUSHALL` or a restart without persistence would, so the
    /// scenarios also check what must survive it (fences keep growing).
    pub fn with_data_loss(
        mut self,
        lose: impl Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync + 'static,
    ) -> Self {
        self.data_loss = Some(Box::new(lose));
        self
    }

    /// Wipes the backend's data with the [data-loss hook](Self::with_data_loss); `false` (and
    /// nothing done) without one.
    pub async fn lose_data(&self) -> bool {
        match &self.data_loss {
            Some(lose) => {
                lose().await;
                true
            }
            None => false,
        }
    }

    /// Keeps `guard` (a server process, a temporary directory) alive as long as this `Env`.
    pub fn holding(mut self, guard: impl Any + Send + Sync) -> Self {
        self.guards.push(Box::new(guard));
        self
    }

    /// The store's backend, for a direct call, each bounded by
    /// [`CALL_DEADLINE`](crate::CALL_DEADLINE): one that never answers fails the scenario,
    /// naming the call.
    pub fn backend(&self) -> Calls<'_> {
        Calls::new(self.store.backend())
    }

    /// The second store on the same backend, if there is one.
    pub fn elsewhere(&self) -> Option<Store> {
        self.elsewhere.clone()
    }

    /// Whether the backend still keeps the write intent of `name` in `namespace`; `false`
    /// without an [intent probe](Self::with_intent_probe).
    pub async fn intent_kept(&self, namespace: &str, name: &[u8]) -> bool {
        match &self.intent_probe {
            Some(probe) => probe(namespace, name).await,
            None => false,
        }
    }
}

impl fmt::Debug for Env {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Env")
            .field("store", &self.store)
            .field("elsewhere", &self.elsewhere)
            .field("intent_probe", &self.intent_probe.is_some())
            .field("data_loss", &self.data_loss.is_some())
            .finish_non_exhaustive()
    }
}
