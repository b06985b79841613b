//! [`IdempotencyKey`]: the key a request runs under, for the handler.

use std::fmt;
use std::sync::Arc;

/// The idempotency key a request runs under, in the request's extensions for the handler
/// (`Extension<IdempotencyKey>` in axum) of every request the layer runs under a reservation.
///
/// The layer replays what it stored; it cannot undo an effect whose response was never
/// stored (a replica that died mid-request). Exactly once needs the handler's help: record the
/// key in the same transaction as the effect, under a unique constraint, and a second run
/// fails there instead of charging twice.
///
/// ```
/// use axum::Extension;
/// use tower_lease::IdempotencyKey;
///
/// async fn pay(Extension(key): Extension<IdempotencyKey>) -> String {
///     // INSERT INTO payments (idempotency_key, ...) VALUES ($1, ...)
///     // with UNIQUE (idempotency_key), in the transaction that charges.
///     format!("charged once for {}", key.key())
/// }
/// ```
#[derive(Clone)]
pub struct IdempotencyKey {
    inner: Arc<Inner>,
}

struct Inner {
    key: String,
    scope: Option<Vec<u8>>,
    fence: Option<u64>,
}

impl IdempotencyKey {
    pub(crate) fn new(key: String, scope: Option<Vec<u8>>, fence: Option<u64>) -> Self {
        let inner = Arc::new(Inner { key, scope, fence });
        Self { inner }
    }

    /// The key, as the client sent it (unquoted): 1 to 255 printable ASCII characters.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// The scope the layer's [`scope`](crate::IdempotencyLayer::scope) extractor found, or
    /// `None` in the default scope. Keys are unique per scope: a unique constraint over
    /// `(scope, key)` matches the layer's.
    pub fn scope(&self) -> Option<&[u8]> {
        self.inner.scope.as_deref()
    }

    /// The reservation's fence, for a [fenced](crate::Idempotency::fenced) definition.
    pub fn fence(&self) -> Option<u64> {
        self.inner.fence
    }
}

impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdempotencyKey")
            .field("key", &self.inner.key)
            .field(
                "scope",
                &self.inner.scope.as_deref().map(String::from_utf8_lossy),
            )
            .field("fence", &self.inner.fence)
            .finish()
    }
}
