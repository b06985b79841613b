//! [`Warning`]: what [`Store::check`](crate::Store::check) finds about a store that can break
//! the locks' guarantees.

use std::fmt;

/// The oldest Redis the scripts are correct on: they read `TIME` and then write, which needs
/// script effects replication, the default since 5.0. The test suite runs on 7.0.
pub(crate) const MIN_VERSION: (u32, u32) = (5, 0);

/// Something about a store's Redis that can break the locks' guarantees, found by
/// [`Store::check`](crate::Store::check).
///
/// Each one names the node it is about when the store is a Redis Cluster (`node` is the address
/// the cluster connection reports), and prints as a message a user can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Warning {
    /// The server is older than Redis 5.0, whose script effects replication the scripts rely on
    /// (they read `TIME` before writing).
    OldRedis {
        /// The cluster node this is about, if the store is a cluster.
        node: Option<String>,
        /// The version the server reports.
        version: String,
    },
    /// `maxmemory` is set and `maxmemory-policy` evicts keys when memory is full: `allkeys-*` can
    /// evict any lock key and the fence counters (so fences could repeat), `volatile-*` can evict
    /// any lock key (they all have a TTL). An evicted lock is free for a second holder while
    /// the first still believes it holds it.
    EvictingPolicy {
        /// The cluster node this is about, if the store is a cluster.
        node: Option<String>,
        /// The configured policy, such as `volatile-lru`.
        policy: String,
        /// The configured `maxmemory`, in bytes.
        maxmemory: u64,
    },
    /// The store waits for `wanted` replicas ([`wait_for_replicas`]) and fewer are connected to
    /// the primary now: every acquisition fails with [`NotReplicated`] until enough are (a
    /// replica still syncing, or one that is down).
    ///
    /// [`wait_for_replicas`]: crate::RedisStore::wait_for_replicas
    /// [`NotReplicated`]: crate::Error::NotReplicated
    ReplicasMissing {
        /// The cluster node this is about, if the store is a cluster.
        node: Option<String>,
        /// The `n` of `wait_for_replicas(n, ..)`.
        wanted: u32,
        /// The replicas connected and in sync now.
        connected: u32,
    },
    /// The store waits for `wanted` replicas and the primary has no more than that: when one
    /// of them crashes, or becomes the primary in a failover, too few are left to acknowledge,
    /// and every acquisition fails until one returns. Choose `n` below the replica count.
    NoSpareReplica {
        /// The cluster node this is about, if the store is a cluster.
        node: Option<String>,
        /// The `n` of `wait_for_replicas(n, ..)`.
        wanted: u32,
        /// The replicas connected and in sync now.
        replicas: u32,
    },
    /// The store has no release notifications (it was built by [`RedisStore::new`] from a
    /// connection alone): bounded waits find releases in other processes by polling, and
    /// writers of a phase-fair or writers-first lock cannot hold readers back.
    ///
    /// [`RedisStore::new`]: crate::RedisStore::new
    NoNotifications,
    /// The server's `INFO` did not report a field the check needs (a proxy or a managed
    /// service may hide it), so that part could not be checked.
    Unchecked {
        /// The cluster node this is about, if the store is a cluster.
        node: Option<String>,
        /// The `INFO` field that was missing, such as `maxmemory_policy`.
        field: &'static str,
    },
    /// A finding of a [`Backend`](super::Backend) outside this crate, in its own words (such
    /// as `tower-lease-postgres`'s about a read-only standby).
    Backend(String),
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let node = |node: &Option<String>| {
            node.as_ref()
                .map(|n| format!(" (node {n})"))
                .unwrap_or_default()
        };
        match self {
            Warning::OldRedis { node: n, version } => write!(
                f,
                "Redis {version}{} is older than {}.{}, which tower-lease's scripts need; upgrade Redis",
                node(n),
                MIN_VERSION.0,
                MIN_VERSION.1
            ),
            Warning::EvictingPolicy {
                node: n,
                policy,
                maxmemory,
            } => write!(
                f,
                "maxmemory-policy is {policy} with maxmemory {maxmemory} bytes{}: when memory is \
                 full Redis can evict a held lock and let a second holder in; set \
                 maxmemory-policy to noeviction (or use a Redis instance of its own for locks)",
                node(n)
            ),
            Warning::ReplicasMissing {
                node: n,
                wanted,
                connected,
            } => write!(
                f,
                "wait_for_replicas({wanted}, ..) but only {connected} replica(s) are connected \
                 and in sync{} now: every acquisition fails as not replicated until {wanted} are",
                node(n)
            ),
            Warning::NoSpareReplica {
                node: n,
                wanted,
                replicas,
            } => write!(
                f,
                "wait_for_replicas({wanted}, ..) with {replicas} replicas{}: when one crashes or \
                 is promoted in a failover too few are left to acknowledge, and every \
                 acquisition fails until one returns; choose n below the replica count",
                node(n)
            ),
            Warning::NoNotifications => write!(
                f,
                "no release notifications: waiters poll for releases in other processes; build \
                 the store with RedisStore::connect, from_client, connect_cluster or \
                 connect_sentinel, or add notifications(client)"
            ),
            Warning::Unchecked { node: n, field } => write!(
                f,
                "Redis INFO{} does not report {field}; could not check it",
                node(n)
            ),
            Warning::Backend(message) => f.write_str(message),
        }
    }
}
