//! What the tests, the benchmarks and the history checker of `tower-lease` start and share: not
//! published, a dev-dependency of the crate.
//!
//! - [`server`]: real `redis-server` processes on free loopback ports;
//! - [`cluster`]: a local 3-master Redis Cluster made of them (feature `cluster`);
//! - [`proxy`]: a TCP fault proxy between a store and its Redis or PostgreSQL;
//! - [`sentinel`]: a primary, replicas and three sentinels (feature `sentinel`);
//! - [`backing`]: a store on Redis, on the cluster or in memory, with a direct line to the Redis
//!   behind it, and the [`store_tests!`] macro that runs a test on each;
//! - [`http`]: axum servers on 127.0.0.1:0 and an HTTP/1 client for the layer's black-box tests;
//! - [`bench`](mod@bench): what the benchmarks share: interleaved rounds, medians and goals, CPU
//!   time, and where their Redis is (feature `redis`);
//! - [`postgres`](mod@postgres): real PostgreSQL servers, for `tower-lease-postgres` (feature
//!   `postgres`);
//! - [`standby`]: streaming standbys of such a server, synchronous or not, and their
//!   promotion (feature `postgres`);
//! - [`pgbouncer`](mod@pgbouncer): Debian's `pgbouncer` in transaction pooling mode in front
//!   of such a server (feature `postgres`);
//! - [`port`]: loopback ports for those servers, outside the range the kernel hands out;
//! - [`hooked`]: a store whose acquisitions pass through a test's hook (to count, time or
//!   change them);
//! - below: drop flags, and the witnesses of how many are inside at once: [`Holders`] of a lock,
//!   handlers behind a [`Gate`], readers, writers and permit holders of a [`Witness`].
//!
//! Its features are the crate's (`redis`, `cluster`, `sentinel`), switched on by the crate's own
//! of the same names: without `redis` it has no Redis in it, so `cargo test
//! --no-default-features` still builds `tower-lease` without its `redis` feature. Its
//! `postgres` feature is `tower-lease-postgres`'s, whose tests switch it on.

#[cfg(feature = "redis")]
pub mod backing;
pub mod bench;
#[cfg(feature = "cluster")]
pub mod cluster;
pub mod hooked;
pub mod http;
#[cfg(feature = "postgres")]
pub mod pgbouncer;
pub mod port;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(any(feature = "redis", feature = "postgres"))]
pub mod proxy;
#[cfg(feature = "sentinel")]
pub mod sentinel;
#[cfg(feature = "redis")]
pub mod server;
#[cfg(feature = "postgres")]
pub mod standby;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;

// What the tests use most, at the top.
#[cfg(feature = "redis")]
pub use backing::{Backing, Raw, STORE_TIMEOUT, Setup};
#[cfg(feature = "postgres")]
pub use pgbouncer::PgBouncer;
#[cfg(feature = "postgres")]
pub use postgres::{PgServer, PgSetup};
#[cfg(feature = "redis")]
pub use server::{Endpoint, RedisServer};
#[cfg(feature = "postgres")]
pub use standby::Replication;

/// Polling until an attempt answers `Some`, on tokio's clock (so under `tokio::time::pause`
/// too): the test kit's, shared with the conformance suite.
pub use tower_lease_testkit::poll;

/// Sets its flag when dropped: tells whether a handler's future was dropped.
pub struct DropFlag(pub Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Witnesses of mutual exclusion: a [`Holders`] count that every holder `enter`s while it
/// believes it holds the lock, telling the most ever inside at once; the test kit's, shared
/// with the conformance suite. [`Inside`] is one inside any count here.
pub use tower_lease_testkit::{Holders, Inside};

/// Handlers that stay inside until the gate opens, counting who is inside. Clones share the
/// count and the gate.
#[derive(Clone, Debug)]
pub struct Gate {
    inside: Arc<AtomicUsize>,
    open: watch::Receiver<bool>,
}

impl Gate {
    /// A shut gate, and what opens it (`send_replace(true)`) and shuts it again.
    pub fn new() -> (watch::Sender<bool>, Gate) {
        let (opener, open) = watch::channel(false);
        let inside = Arc::default();
        (opener, Gate { inside, open })
    }

    /// Counts the caller inside until the gate is open (or the caller is dropped).
    pub async fn pass(&self) {
        let (_inside, _) = Inside::enter(&self.inside);
        let _ = self.open.clone().wait_for(|open| *open).await;
    }

    /// How many are inside now.
    pub fn inside(&self) -> usize {
        self.inside.load(Ordering::SeqCst)
    }

    /// Waits until `n` handlers are inside at once (for at most 5 s, then panics).
    pub async fn until_inside(&self, n: usize) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while self.inside() != n {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("never saw {n} handlers inside at once"));
    }
}

/// Counts the handlers inside at once, the most there ever were and how many ran, and whether
/// a reader was ever inside with a writer. Handlers that may share (readers, permit holders)
/// [`enter`](Self::enter), writers [`enter_writer`](Self::enter_writer), each until its guard
/// drops. Clones share the counts.
#[derive(Clone, Debug, Default)]
pub struct Witness {
    sharing: Arc<AtomicUsize>,
    writers: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    runs: Arc<AtomicUsize>,
    read_during_write: Arc<AtomicBool>,
}

impl Witness {
    /// One more handler that may share (a reader, a permit holder) inside until the guard drops.
    #[must_use = "the handler is inside until the guard drops"]
    pub fn enter(&self) -> Inside {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let (inside, now) = Inside::enter(&self.sharing);
        self.most.fetch_max(now, Ordering::SeqCst);
        if self.writers.load(Ordering::SeqCst) > 0 {
            self.read_during_write.store(true, Ordering::SeqCst);
        }
        inside
    }

    /// One more writer inside until the guard drops.
    #[must_use = "the writer is inside until the guard drops"]
    pub fn enter_writer(&self) -> Inside {
        self.runs.fetch_add(1, Ordering::SeqCst);
        let (inside, _) = Inside::enter(&self.writers);
        if self.sharing.load(Ordering::SeqCst) > 0 {
            self.read_during_write.store(true, Ordering::SeqCst);
        }
        inside
    }

    /// How many that may share are inside now.
    pub fn inside(&self) -> usize {
        self.sharing.load(Ordering::SeqCst)
    }

    /// The most that may share that were ever inside at once.
    pub fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }

    /// How many handlers entered, writers included.
    pub fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }

    /// Whether a reader and a writer were ever inside at once.
    pub fn read_during_write(&self) -> bool {
        self.read_during_write.load(Ordering::SeqCst)
    }
}
