#![doc = include_str!("../README.md")]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![forbid(unsafe_code)]

mod attempt;
mod error;
mod finish_on_drop;
mod holding;
pub mod idempotency;
pub mod layer;
mod lease;
mod lock;
mod name;
mod owned_name;
mod semaphore;
mod spec;
pub mod store;
mod telemetry;
mod token;
mod wait;
mod write_intent;

pub use crate::attempt::Attempt;
pub use crate::error::{Error, Result};
pub use crate::idempotency::{Idempotency, IdempotencyKey, IdempotencyLayer};
pub use crate::layer::{LeaseBody, LeaseLost, LockLayer, RwLockLayer, SemaphoreLayer, extract};
pub use crate::lease::{Held, Lease, Run};
pub use crate::lock::{Lock, RwLock};
pub use crate::name::{LockName, MAX_NAME_LEN};
pub use crate::semaphore::Semaphore;
pub use crate::spec::MAX_NAMESPACE_LEN;
pub use crate::store::{Mode, RedisStore, Store, Warning};
pub use crate::token::{LockToken, Permit, ReadToken};
