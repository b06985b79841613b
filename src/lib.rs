// The README's examples run on Redis; without the `redis` feature the crate is the memory store
// and the layers.
#![cfg_attr(feature = "redis", doc = include_str!("../README.md"))]
#![cfg_attr(
    not(feature = "redis"),
    doc = "Lease-based locks and tower middleware on `Store::memory()`: the `redis` feature \
           (on by default) adds `RedisStore`; see the README."
)]
#![cfg_attr(docsrs, feature(doc_cfg))]
// Without the `redis` feature there is no `RedisStore`, and the docs that name its options
// (`wait_for_replicas`, `notifications`, `timeout`) link to nothing; the default and
// all-features doc builds check those links.
#![cfg_attr(not(feature = "redis"), allow(rustdoc::broken_intra_doc_links))]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![forbid(unsafe_code)]

// The crate's parts, as stairs from the bottom up: each uses only the parts before it
// (`import-cycles --folders src` checks it; CONTRIBUTING draws the same stairs).
//
// 1. The contract of a store, its types, and the one Error every call fails with.
pub mod backend;
// 2. Lock names and their rules.
mod name;
// 3. Every metric and label.
mod telemetry;
// 4. One timer per store or layer: store calls, release waits, body limits.
mod coarse_timer;
// 5. What a lock is before anything is held: Definition, Attempt.
mod definition;
// 6. The Store handle, the stores, and what the handle keeps per lease (RawLease, heartbeat).
pub mod store;
// 7. What owns a lease: KeptLease, Held, the handlers' Lease.
mod lease;
// 8. Lock, RwLock, Semaphore, their tokens, and the bounded wait.
mod locks;
// 9. What the middlewares answer when they refuse a request.
pub mod rejection;
// 10. LockLayer, RwLockLayer, SemaphoreLayer.
pub mod layer;
// 11. IdempotencyLayer.
pub mod idempotency;

pub use crate::backend::Warning;
pub use crate::backend::error::{Error, Result};
pub use crate::definition::Attempt;
pub use crate::definition::MAX_NAMESPACE_LEN;
pub use crate::idempotency::{Fingerprint, Idempotency, IdempotencyKey, IdempotencyLayer};
pub use crate::layer::{LeaseBody, LeaseLost, LockLayer, RwLockLayer, SemaphoreLayer, extract};
pub use crate::lease::{Held, Lease, Run};
pub use crate::locks::Semaphore;
pub use crate::locks::{Lock, RwLock};
pub use crate::locks::{LockToken, Permit, ReadToken};
pub use crate::name::{LockName, MAX_NAME_LEN};
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub use crate::store::RedisStore;
pub use crate::store::Store;
