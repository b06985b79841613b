#![doc = include_str!("../README.md")]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![forbid(unsafe_code)]

mod error;
pub mod layer;
mod lock;
mod store;
mod token;

pub use crate::error::{Error, Result};
pub use crate::layer::{Lease, LeaseBody, LeaseLost, LockLayer, RwLockLayer, extract};
pub use crate::lock::{Lock, LockName, MAX_NAME_LEN, MAX_NAMESPACE_LEN, RwLock};
pub use crate::store::{
    Acquisition, Backend, BoxFuture, KeyLayout, KeyRole, LockRef, MemoryStore, Mode, RedisStore,
    Store, Token, Warning,
};
pub use crate::token::{Attempt, LockToken, ReadToken};
