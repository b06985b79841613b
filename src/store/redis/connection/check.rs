//! Startup checks of a [`RedisStore`](crate::store::redis::RedisStore): what about its Redis can break the
//! locks' guarantees, read from `INFO`.

use redis::aio::ConnectionLike;

use crate::backend::MIN_VERSION;
use crate::backend::Warning;

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

pub(in crate::store::redis) fn at_least(version: &str, (major, minor): (u32, u32)) -> bool {
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
