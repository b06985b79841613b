//! Test support, included by every test binary (`#[path = "../support/mod.rs"] mod support;`):
//!
//! - [`server`]: real `redis-server` processes on free loopback ports, started by the tests;
//! - [`cluster`]: a local 3-master Redis Cluster made of them (feature `cluster`);
//! - [`proxy`]: a TCP fault proxy between a store and its Redis;
//! - [`env`]: a store on Redis, on the cluster or in memory, with a direct line to the Redis
//!   behind it, and the `store_tests!` macro that runs a test on each;
//! - [`http`]: axum servers on 127.0.0.1:0 and an HTTP/1 client for the layer's black-box tests;
//! - below: polling, drop flags and a witness of how many holders are inside at once.
#![allow(dead_code, unreachable_pub)]

#[cfg(feature = "cluster")]
pub mod cluster;
pub mod env;
pub mod http;
pub mod proxy;
pub mod server;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

// What the tests use most, at the top; not every binary uses each.
#[allow(unused_imports)]
pub use env::{Env, Raw, STORE_TIMEOUT, Setup};
#[allow(unused_imports)]
pub use server::{Endpoint, RedisServer};

/// Calls `attempt` every `every` until it answers `Some`, for at most `limit` (at least once);
/// answers the value and when the attempt that gave it was sent.
///
/// It keeps time with tokio's clock, so it works under `tokio::time::pause` too.
pub async fn poll<T, F, Fut>(
    every: Duration,
    limit: Duration,
    mut attempt: F,
) -> Option<(T, Instant)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        let sent = Instant::now();
        if let Some(value) = attempt().await {
            return Some((value, sent));
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// Sets its flag when dropped: tells whether a handler's future was dropped.
pub struct DropFlag(pub Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// A witness of mutual exclusion: every holder [`enter`](Self::enter)s while it believes it
/// holds the lock, and [`most`](Self::most) tells how many were ever inside at once. Clones
/// share the count, so the holders may sit in different tasks or replicas.
#[derive(Clone, Debug, Default)]
pub struct Holders {
    inside: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

impl Holders {
    /// Counts one more holder inside until the guard drops.
    #[must_use = "the holder is inside until the guard drops"]
    pub fn enter(&self) -> Inside {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        Inside(self.clone())
    }

    /// The most holders that were inside at the same time.
    pub fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

/// One holder inside; leaves when dropped.
pub struct Inside(Holders);

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, Ordering::SeqCst);
    }
}
