//! [`Background`]: the completions a layer goes on trying after it answered `503`, owned by
//! the layer: they end when its last clone (and every service it made) is dropped.

use std::future::Future;
use std::sync::Arc;

use tokio_util::sync::{CancellationToken, DropGuard};

/// The layer's background completions, cancelled when the last clone drops.
#[derive(Clone, Debug)]
pub(crate) struct Background {
    token: CancellationToken,
    _guard: Arc<DropGuard>,
}

impl Default for Background {
    fn default() -> Self {
        let token = CancellationToken::new();
        let guard = Arc::new(token.clone().drop_guard());
        Self {
            token,
            _guard: guard,
        }
    }
}

impl Background {
    /// Runs `task` until it ends or the layer is gone. The task must not hold the layer's
    /// configuration, which owns this guard: the task would then keep itself alive.
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        let token = self.token.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = token.cancelled() => {}
                () = task => {}
            }
        });
    }
}
