//! How a shared read lease hears of a write intent on its name at once: it listens on the
//! store's `Intents` while it holds the lease, and on a store with notifications keeps the
//! lock watched meanwhile, so that other processes' writers' intents reach it.
//!
//! The subscription is made after the acquisition, so an intent published before it is
//! confirmed goes unheard here; the writer's next refused attempt publishes again, and the next
//! extend reports it in any case.

use std::sync::Arc;

use tokio::time::Instant;

use crate::backend::Mode;
use crate::backend::{Hub, IntentListener};
use crate::store::LeaseState;

/// Listens for intents on the name of `state`'s lease, for as long as the lease lives; `None`
/// for a readers-first lock, which leaves no intent.
pub(super) fn listen(state: &Arc<LeaseState>) -> Option<IntentListener> {
    let holding = &state.holding;
    if !holding.leaves_write_intent() {
        return None;
    }
    let store = holding.store();
    let (namespace, name) = (holding.namespace(), holding.name());
    let listener = store
        .intents()
        .listen(Hub::key(Mode::Write, namespace, name));
    if store.has_notifications()
        && let Ok(runtime) = tokio::runtime::Handle::try_current()
    {
        let ended = state.ended().clone();
        let (store, name) = (store.clone(), name.to_vec());
        runtime.spawn(async move {
            let deadline = Instant::now() + store.timeout();
            let watch = tokio::select! {
                watch = store.watch(Mode::Read, namespace, &name, deadline) => watch,
                () = ended.cancelled() => return,
            };
            if watch.is_some() {
                // Subscribed while the lease lives; the watch's drop unsubscribes.
                ended.cancelled().await;
            }
        });
    }
    Some(listener)
}
