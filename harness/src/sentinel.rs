//! A replicated topology that the tests start: a primary, one replica (directly, or through a
//! [fault proxy](crate::proxy::Proxy) that can hold replication back), and optionally three
//! sentinels with fast failover (`down-after-milliseconds` 500, `failover-timeout` 3000); or
//! ([`Topology::two_replicas`]) a primary, two replicas and three sentinels, the shape a
//! failover keeps `WAIT 1` satisfiable in.
//!
//! Every process dies with the test process; sentinels write their config in a temp dir of
//! their own, removed when they drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tower_lease::RedisStore;
use tower_lease::store::SentinelConnection;

use crate::proxy::Proxy;
use crate::server::{Endpoint, RedisServer, die_with_parent, free_port, ping};

/// The master name the sentinels monitor.
pub const MASTER: &str = "leases";

/// How the replica reaches the primary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// Straight to the primary's port.
    Direct,
    /// Through a fault proxy ([`Topology::link`]), to hold replication back.
    Proxied,
}

/// A primary, its replica, and the sentinels if asked for.
pub struct Topology {
    pub primary: RedisServer,
    pub replica: RedisServer,
    /// The proxy the replica replicates through, with [`Link::Proxied`].
    pub link: Option<Proxy>,
    pub sentinels: Vec<Sentinel>,
    /// Replicas beyond the first ([`two_replicas`](Self::two_replicas)).
    pub others: Vec<RedisServer>,
}

impl Topology {
    /// A primary and a replica that has finished its first sync.
    pub async fn start(link: Link) -> Self {
        // A replica (or a promoted one's new replica) syncs at once, not after the 5 s Redis
        // waits by default for more replicas to share a diskless sync.
        let primary = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
        let (link, upstream) = match link {
            Link::Direct => (None, primary.port()),
            Link::Proxied => {
                let proxy = Proxy::to(&primary).await;
                let port = proxy.addr().port();
                (Some(proxy), port)
            }
        };
        let replica = RedisServer::start_with(&[
            "--repl-diskless-sync-delay",
            "0",
            "--replicaof",
            "127.0.0.1",
            &upstream.to_string(),
        ]);
        let topology = Topology {
            primary,
            replica,
            link,
            sentinels: Vec::new(),
            others: Vec::new(),
        };
        topology.until_synced().await;
        topology
    }

    /// [`start`](Self::start), and three sentinels that see the primary and its replica.
    pub async fn with_sentinels(link: Link) -> Self {
        let mut topology = Self::start(link).await;
        topology.sentinels = (0..3)
            .map(|_| Sentinel::start(topology.primary.port()))
            .collect();
        topology.until_sentinels_see_each_other().await;
        topology
    }

    /// A primary, two replicas (every data node with `repl-diskless-sync-delay 0`, as the docs
    /// tell operators) and three sentinels with `down-after-milliseconds` `down_after`, all
    /// synced and known to each other.
    pub async fn two_replicas(down_after: Duration) -> Self {
        let primary = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
        let port = primary.port().to_string();
        let replica = || {
            RedisServer::start_with(&[
                "--replicaof",
                "127.0.0.1",
                &port,
                "--repl-diskless-sync-delay",
                "0",
            ])
        };
        let mut topology = Topology {
            replica: replica(),
            others: vec![replica()],
            primary,
            link: None,
            sentinels: Vec::new(),
        };
        topology.until_all_synced(2).await;
        let ms = down_after.as_millis() as u64;
        topology.sentinels = (0..3)
            .map(|_| Sentinel::start_with(topology.primary.port(), ms))
            .collect();
        topology.until_sentinels_see_each_other().await;
        topology
    }

    /// A store that finds the primary through the sentinels. Just after a promotion the
    /// sentinels may call the new primary down for a moment (the promotion cut their links to
    /// it), and then name none: connecting is tried again for up to 5 s.
    pub async fn through_sentinels(&self) -> RedisStore<SentinelConnection> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match RedisStore::connect_sentinel(MASTER, self.sentinel_urls()).await {
                Ok(store) => return store,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "no primary through the sentinels: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every data node: the primary, then the replicas.
    pub fn data_nodes(&self) -> Vec<&RedisServer> {
        let mut nodes = vec![&self.primary, &self.replica];
        nodes.extend(&self.others);
        nodes
    }

    /// Waits until `n` replicas acknowledge a write on the primary (for at most 10 s).
    pub async fn until_all_synced(&self, n: u32) {
        until_acknowledged(&self.primary, n, Duration::from_secs(10)).await;
    }

    /// Asks a sentinel for a graceful failover (`SENTINEL FAILOVER`).
    pub async fn sentinel_failover(&self) {
        let mut conn = self.sentinels[0]
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let () = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(MASTER)
            .query_async(&mut conn)
            .await
            .expect("SENTINEL FAILOVER");
    }

    /// The port of the primary the sentinels name now (asking the first that answers).
    pub async fn named_primary(&self) -> Option<u16> {
        for sentinel in &self.sentinels {
            let Ok(mut conn) = sentinel.client().get_multiplexed_async_connection().await else {
                continue;
            };
            let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(MASTER)
                .query_async(&mut conn)
                .await
                .ok()
                .flatten();
            if let Some((_, port)) = addr {
                return Some(port);
            }
        }
        None
    }

    /// Waits until every live sentinel's configuration names a primary other than the one on
    /// `old` (the failover ended, and each heard of it), for at most 10 s; answers its port.
    pub async fn until_switched_from(&self, old: u16) -> u16 {
        let deadline = Instant::now() + Duration::from_secs(10);
        'again: loop {
            assert!(Instant::now() < deadline, "the sentinels never switched");
            tokio::time::sleep(Duration::from_millis(50)).await;
            let mut named = None;
            for sentinel in &self.sentinels {
                let Ok(mut conn) = sentinel.client().get_multiplexed_async_connection().await
                else {
                    continue;
                };
                let fields: std::collections::HashMap<String, String> = redis::cmd("SENTINEL")
                    .arg("MASTER")
                    .arg(MASTER)
                    .query_async(&mut conn)
                    .await
                    .unwrap_or_default();
                match fields.get("port").and_then(|p| p.parse::<u16>().ok()) {
                    Some(port) if port != old && named.is_none_or(|n| n == port) => {
                        named = Some(port)
                    }
                    _ => continue 'again,
                }
            }
            if let Some(port) = named {
                return port;
            }
        }
    }

    /// `redis://127.0.0.1:port` of every sentinel.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(Sentinel::url).collect()
    }

    /// Waits until the replica's link to the primary is up (for at most 10 s).
    pub async fn until_synced(&self) {
        let mut conn = self.replica.connection().await;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut conn)
                .await
                .expect("INFO replication");
            if info.contains("master_link_status:up") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the replica never synced:\n{info}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The link is up on the replica's side before the primary counts the replica for
        // `WAIT`: a write it acknowledges says both sides are ready.
        until_acknowledged(
            &self.primary,
            1,
            deadline.saturating_duration_since(Instant::now()),
        )
        .await;
        // Nor do the probe's commands stay in the counts tests read.
        let () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut self.primary.connection().await)
            .await
            .expect("CONFIG RESETSTAT on the primary");
    }

    /// Waits until every sentinel lists the replica and the two other sentinels (for at most
    /// 10 s): a failover needs both.
    async fn until_sentinels_see_each_other(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        for sentinel in &self.sentinels {
            let mut conn = sentinel
                .client()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            loop {
                let replicas: Vec<Vec<String>> = redis::cmd("SENTINEL")
                    .arg("REPLICAS")
                    .arg(MASTER)
                    .query_async(&mut conn)
                    .await
                    .unwrap_or_default();
                let ports: Vec<String> = std::iter::once(&self.replica)
                    .chain(&self.others)
                    .map(|r| r.port().to_string())
                    .collect();
                // Sentinels find each other through the primary every 2 s; without a majority
                // that knows the others, none could be elected to fail over.
                let others: Vec<Vec<String>> = redis::cmd("SENTINEL")
                    .arg("SENTINELS")
                    .arg(MASTER)
                    .query_async(&mut conn)
                    .await
                    .unwrap_or_default();
                let seen = ports
                    .iter()
                    .all(|port| replicas.iter().any(|fields| fields.contains(port)));
                if seen && others.len() == 2 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "a sentinel never saw the replica and the other two"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// Kills the primary (`SIGKILL`) and waits until the sentinels promoted the replica and it
    /// answers as a primary (for at most 20 s); answers how long that took.
    pub async fn kill_primary_and_fail_over(&mut self) -> Duration {
        let killed = Instant::now();
        self.primary.stop();
        let mut sentinel = self.sentinels[0]
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let wanted = self.replica.port().to_string();
        loop {
            let addr: Option<(String, String)> = redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(MASTER)
                .query_async(&mut sentinel)
                .await
                .ok();
            let seen = role(&self.replica).await;
            if is_primary(&seen)
                && addr.as_ref().is_some_and(|(_, port)| *port == wanted)
                && self.no_sentinel_marks_it_down().await
            {
                return killed.elapsed();
            }
            assert!(
                killed.elapsed() < Duration::from_secs(20),
                "no failover within 20 s: the sentinels name {addr:?}, the replica's role is {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether every sentinel lists the master without `s_down` or `o_down`: the promotion
    /// kills the sentinels' own links to the new primary, so for a moment they may call it
    /// down, and a client then finds no primary through them.
    async fn no_sentinel_marks_it_down(&self) -> bool {
        for sentinel in &self.sentinels {
            let Ok(mut conn) = sentinel.client().get_multiplexed_async_connection().await else {
                return false;
            };
            let master: Option<std::collections::HashMap<String, String>> = redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg(MASTER)
                .query_async(&mut conn)
                .await
                .ok();
            let down = master
                .as_ref()
                .and_then(|fields| fields.get("flags"))
                .is_none_or(|flags| flags.contains("s_down") || flags.contains("o_down"));
            if down {
                return false;
            }
        }
        true
    }

    /// Promotes the replica by hand (`REPLICAOF NO ONE`), without sentinels.
    pub async fn promote_replica(&self) {
        let mut conn = self.replica.connection().await;
        let () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query_async(&mut conn)
            .await
            .expect("REPLICAOF NO ONE");
    }
}

/// Waits until `node` acknowledges a write with `n` replicas (`SET` and `WAIT n 200` on a probe
/// key, deleted after), for at most `limit`.
pub async fn until_acknowledged(node: &RedisServer, n: u32, limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut conn = node.connection().await;
    loop {
        let acked: redis::RedisResult<((), u32)> = redis::pipe()
            .cmd("SET")
            .arg("tower-lease-test:synced")
            .arg(1)
            .cmd("WAIT")
            .arg(n)
            // Within redis-rs's response timeout of 500 ms.
            .arg(200)
            .query_async(&mut conn)
            .await;
        if matches!(acked, Ok((_, acked)) if acked >= n) {
            let () = redis::cmd("DEL")
                .arg("tower-lease-test:synced")
                .query_async(&mut conn)
                .await
                .expect("DEL on the primary");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{n} replicas never acknowledged a write on {}: {acked:?}",
            node.port()
        );
    }
}

/// Freezes `server` (`SIGSTOP`) until the guard drops (`SIGCONT`).
pub fn freeze(server: &RedisServer) -> Frozen {
    let pid = server.pid().expect("a running server") as i32;
    // SAFETY: a signal to a child process this test started.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    Frozen(pid)
}

/// A frozen process, thawed when dropped.
pub struct Frozen(i32);

impl Drop for Frozen {
    fn drop(&mut self) {
        // SAFETY: as in `freeze`.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// A `redis-server --sentinel` child process on `127.0.0.1:port`.
pub struct Sentinel {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Sentinel {
    /// Starts a sentinel monitoring the primary on `primary_port` (quorum 2), and waits until it
    /// answers `PING`.
    pub fn start(primary_port: u16) -> Self {
        Self::start_with(primary_port, 500)
    }

    /// Stops the sentinel (`SIGKILL`).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// [`start`](Self::start) with `down-after-milliseconds` `down_after_ms`.
    pub fn start_with(primary_port: u16, down_after_ms: u64) -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("tower-lease-sentinel-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a directory for the sentinel config");
        for _ in 0..10 {
            let port = free_port();
            let config = dir.join("sentinel.conf");
            std::fs::write(
                &config,
                format!(
                    "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
                     sentinel resolve-hostnames no\nsentinel announce-ip 127.0.0.1\n\
                     sentinel monitor {MASTER} 127.0.0.1 {primary_port} 2\n\
                     sentinel down-after-milliseconds {MASTER} {down_after_ms}\n\
                     sentinel failover-timeout {MASTER} 3000\n\
                     sentinel parallel-syncs {MASTER} 1\n",
                    dir = dir.display()
                ),
            )
            .expect("write the sentinel config");
            let mut command = Command::new(crate::server::server_binary());
            command
                .arg(&config)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            die_with_parent(&mut command);
            let mut child = command.spawn().expect("start redis-server --sentinel");
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                if ping(port) {
                    return Sentinel { child, port, dir };
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("redis-server --sentinel did not start on any of 10 free ports");
    }
}

impl Endpoint for Sentinel {
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `server`'s answer to `ROLE`, on a connection of its own (a promotion kills a replica's
/// clients); `None` when it does not answer.
pub async fn role(server: &RedisServer) -> Option<redis::Value> {
    let mut conn = server
        .client()
        .get_multiplexed_async_connection()
        .await
        .ok()?;
    redis::cmd("ROLE").query_async(&mut conn).await.ok()
}

/// Whether a `ROLE` answer is a primary's.
pub fn is_primary(role: &Option<redis::Value>) -> bool {
    matches!(role, Some(redis::Value::Array(fields))
        if matches!(fields.first(), Some(redis::Value::BulkString(role)) if role == b"master"))
}
