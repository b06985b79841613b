//! Startup checks: what about the Redis behind a store can break the locks' guarantees.

use std::fmt;

use redis::aio::ConnectionLike;

/// The oldest Redis the scripts are correct on: they read `TIME` and then write, which needs
/// script effects replication, the default since 5.0. The test suite runs on 7.0.
const MIN_VERSION: (u32, u32) = (5, 0);

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
    /// writers of a writer-preferred lock cannot hold readers back.
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
        }
    }
}

/// What the store asks of its Redis, beyond the scripts.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Asked {
    /// The `n` of `wait_for_replicas(n, ..)`, if set.
    pub(crate) replicas: Option<u32>,
    /// Whether the store has release notifications.
    pub(crate) notifications: bool,
}

/// Runs `INFO` on `conn` (on every primary, for a cluster connection) and lists what is wrong.
pub(crate) async fn redis<C: ConnectionLike>(
    conn: &mut C,
    asked: Asked,
) -> redis::RedisResult<Vec<Warning>> {
    // Plain `INFO`: its default sections hold both fields, and servers before 7.0 take only one
    // section argument.
    let reply: redis::Value = redis::cmd("INFO").query_async(conn).await?;
    let mut warnings = Vec::new();
    // A cluster connection answers with one reply per primary, keyed by its address.
    match reply {
        redis::Value::Map(nodes) => {
            for (node, info) in nodes {
                let node: String = redis::from_redis_value(node)?;
                let info: String = redis::from_redis_value(info)?;
                warnings.extend(from_info(Some(&node), &info));
                warnings.extend(replicas(Some(&node), &info, asked.replicas));
            }
        }
        info => {
            let info = redis::from_redis_value::<String>(info)?;
            warnings.extend(from_info(None, &info));
            warnings.extend(replicas(None, &info, asked.replicas));
        }
    }
    if !asked.notifications {
        warnings.push(Warning::NoNotifications);
    }
    Ok(warnings)
}

/// The warnings `wait_for_replicas(wanted, ..)` calls for on a primary whose `INFO
/// replication` is in `info`: replicas count when their state is `online` (one still syncing
/// acknowledges nothing).
fn replicas(node: Option<&str>, info: &str, wanted: Option<u32>) -> Vec<Warning> {
    let Some(wanted) = wanted else {
        return Vec::new();
    };
    if !info
        .lines()
        .any(|line| line.starts_with("connected_slaves:"))
    {
        return vec![Warning::Unchecked {
            node: node.map(str::to_owned),
            field: "connected_slaves",
        }];
    }
    let online = info
        .lines()
        .filter(|line| {
            line.strip_prefix("slave")
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
                && line.contains("state=online")
        })
        .count();
    let online = u32::try_from(online).unwrap_or(u32::MAX);
    let node = node.map(str::to_owned);
    let mut warnings = Vec::new();
    if online < wanted {
        warnings.push(Warning::ReplicasMissing {
            node: node.clone(),
            wanted,
            connected: online,
        });
    }
    if wanted >= online {
        warnings.push(Warning::NoSpareReplica {
            node,
            wanted,
            replicas: online,
        });
    }
    warnings
}

/// The warnings one server's `INFO server` + `INFO memory` text calls for.
fn from_info(node: Option<&str>, info: &str) -> Vec<Warning> {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let node = node.map(str::to_owned);
    let mut warnings = Vec::new();
    match field("redis_version") {
        Some(version) if !at_least(version, MIN_VERSION) => warnings.push(Warning::OldRedis {
            node: node.clone(),
            version: version.to_owned(),
        }),
        Some(_) => {}
        None => warnings.push(Warning::Unchecked {
            node: node.clone(),
            field: "redis_version",
        }),
    }
    let maxmemory = field("maxmemory").and_then(|m| m.parse::<u64>().ok());
    match (field("maxmemory_policy"), maxmemory) {
        // Without maxmemory (0) Redis never evicts, whatever the policy says.
        (Some(policy), Some(maxmemory)) if maxmemory > 0 && evicts(policy) => {
            warnings.push(Warning::EvictingPolicy {
                node,
                policy: policy.to_owned(),
                maxmemory,
            })
        }
        (Some(_), Some(_)) => {}
        (None, _) => warnings.push(Warning::Unchecked {
            node,
            field: "maxmemory_policy",
        }),
        (_, None) => warnings.push(Warning::Unchecked {
            node,
            field: "maxmemory",
        }),
    }
    warnings
}

fn evicts(policy: &str) -> bool {
    policy.starts_with("allkeys-") || policy.starts_with("volatile-")
}

pub(super) fn at_least(version: &str, (major, minor): (u32, u32)) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    found >= (major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_version_and_policy_from_info_text() {
        let info = "# Server\r\nredis_version:4.0.14\r\n# Memory\r\nmaxmemory:1048576\r\n\
                    maxmemory_human:1.00M\r\nmaxmemory_policy:volatile-ttl\r\n";
        let warnings = from_info(None, info);
        assert_eq!(
            warnings,
            [
                Warning::OldRedis {
                    node: None,
                    version: "4.0.14".into()
                },
                Warning::EvictingPolicy {
                    node: None,
                    policy: "volatile-ttl".into(),
                    maxmemory: 1048576
                },
            ]
        );
        assert!(warnings[1].to_string().contains("noeviction"));
    }

    #[test]
    fn no_warning_for_a_current_server_without_eviction() {
        let info = "redis_version:7.0.15\r\nmaxmemory:0\r\nmaxmemory_policy:allkeys-lru\r\n";
        assert_eq!(from_info(None, info), []);
        let info = "redis_version:10.1.0\r\nmaxmemory:1000\r\nmaxmemory_policy:noeviction\r\n";
        assert_eq!(from_info(None, info), []);
    }

    #[test]
    fn replicas_count_when_online() {
        let info = "connected_slaves:2\r\nslave0:ip=a,port=1,state=online,offset=9,lag=0\r\n\
                    slave1:ip=b,port=2,state=wait_bgsave,offset=0,lag=0\r\n";
        assert_eq!(replicas(None, info, None), []);
        assert_eq!(
            replicas(None, info, Some(1)),
            [Warning::NoSpareReplica {
                node: None,
                wanted: 1,
                replicas: 1
            }]
        );
        assert_eq!(
            replicas(None, info, Some(2))[0],
            Warning::ReplicasMissing {
                node: None,
                wanted: 2,
                connected: 1
            }
        );
    }

    #[test]
    fn missing_fields_are_reported_not_guessed() {
        let warnings = from_info(Some("redis-1:6379"), "redis_version:7.2.4\r\n");
        assert_eq!(
            warnings,
            [Warning::Unchecked {
                node: Some("redis-1:6379".into()),
                field: "maxmemory_policy"
            }]
        );
    }
}
