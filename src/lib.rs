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

pub mod backend;
mod coarse_timer;
mod definition;
pub mod idempotency;
pub mod layer;
mod lease;
mod locks;
mod name;
pub mod rejection;
pub mod store;
mod telemetry;

pub use crate::backend::error::{Error, Result};
pub use crate::backend::{Fairness, Warning};
pub use crate::definition::Attempt;
pub use crate::definition::MAX_NAMESPACE_LEN;
pub use crate::idempotency::{Idempotency, IdempotencyKey, IdempotencyLayer};
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
