//! [`IdempotencyKey`]: the key a request runs under, for the handler.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

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
    namespace: &'static str,
    retention: Duration,
}

impl IdempotencyKey {
    pub(crate) fn new(
        key: String,
        scope: Option<Vec<u8>>,
        fence: Option<u64>,
        definition: &crate::Idempotency,
    ) -> Self {
        let inner = Arc::new(Inner {
            key,
            scope,
            fence,
            namespace: definition.namespace(),
            retention: definition.retention(),
        });
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

    /// The namespace of the layer's [`Idempotency`](crate::Idempotency) definition.
    pub fn namespace(&self) -> &'static str {
        self.inner.namespace
    }

    /// How long the definition keeps a stored response
    /// ([`Idempotency::retention`](crate::Idempotency::retention)).
    pub fn retention(&self) -> Duration {
        self.inner.retention
    }

    /// The name the key is kept under in the store: the scope (with `\` and `:` escaped), a
    /// `:`, then the key. A [`Backend`](crate::backend::Backend)'s idempotency calls see it
    /// as the reservation's name, so a store that lets the handler claim the key in its own
    /// transaction (as `tower-lease-postgres` does) names the same record.
    pub fn stored_name(&self) -> Vec<u8> {
        super::name(
            self.inner.scope.as_deref().unwrap_or_default(),
            self.inner.key.as_bytes(),
        )
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
