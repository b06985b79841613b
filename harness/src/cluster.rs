//! A real local Redis Cluster: three masters on free ports, no replicas, made with
//! `redis-cli --cluster create`, torn down when the handle drops.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

use crate::server::{Endpoint, RedisServer, free_port};

/// Three cluster-enabled `redis-server`s that together serve all 16384 slots.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    dir: PathBuf,
}

impl RedisCluster {
    /// Starts three masters (`--cluster-node-timeout 2000`, so a node that stops is noticed
    /// within seconds), joins them into one cluster and waits until every node reports
    /// `cluster_state:ok`.
    pub fn start() -> Self {
        Self::start_with(&["--cluster-node-timeout", "2000"])
    }

    /// Like [`start`](Self::start), with `extra_args` for every node instead of the short node
    /// timeout (none: the server's defaults, as the benchmarks measure the cluster bus).
    pub fn start_with(extra_args: &[&str]) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "tower-lease-cluster-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the cluster's temp dir");
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            dir,
        };
        for i in 0..3 {
            let config = cluster.dir.join(format!("nodes-{i}.conf"));
            // The bus port is given explicitly: the default (port + 10000) overflows for ports
            // above 55535, which the ephemeral range hands out.
            let bus_port = free_port().to_string();
            let config = config.to_string_lossy();
            let mut args = vec![
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                &config,
                "--cluster-port",
                &bus_port,
            ];
            args.extend_from_slice(extra_args);
            cluster.nodes.push(RedisServer::start_with(&args));
        }
        cluster.create();
        cluster.wait_ok();
        cluster
    }

    fn create(&self) {
        let addrs: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create (is redis-tools installed?)");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        for (i, node) in self.nodes.iter().enumerate() {
            while !self.cluster_info(i).contains("cluster_state:ok") {
                assert!(
                    Instant::now() < deadline,
                    "cluster node {} did not reach cluster_state:ok within 30 s",
                    node.port()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Node `i`'s `CLUSTER INFO`, or nothing while it does not answer it.
    pub fn cluster_info(&self, i: usize) -> String {
        self.nodes[i]
            .client()
            .get_connection()
            .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query(&mut c))
            .unwrap_or_default()
    }

    /// The sum over the nodes of `cluster_stats_messages_<field>` in `CLUSTER INFO`: what the
    /// cluster bus carried.
    pub fn bus_messages(&self, field: &str) -> u64 {
        let field = format!("cluster_stats_messages_{field}:");
        (0..self.nodes.len())
            .map(|i| {
                self.cluster_info(i)
                    .lines()
                    .find_map(|line| line.strip_prefix(field.as_str()))
                    .map_or(0, |v| v.trim().parse().unwrap_or(0))
            })
            .sum()
    }

    /// Kills node `i` (SIGKILL); its slots stay assigned to it.
    pub fn stop_node(&mut self, i: usize) {
        self.nodes[i].stop();
    }

    /// Starts node `i` again on its port with its cluster config file, so it rejoins the cluster
    /// with its slots (and no data), and waits until every node reports `cluster_state:ok`.
    pub fn restart_node(&mut self, i: usize) {
        self.nodes[i].restart();
        self.wait_ok();
    }

    /// The nodes, for tests that talk to one of them directly.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// `redis://127.0.0.1:port/` of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// A cluster client seeded with every node.
    pub fn client(&self) -> ClusterClient {
        ClusterClient::new(self.urls()).expect("valid cluster urls")
    }

    /// redis-rs's async cluster connection: what `RedisStore::new` takes with feature `cluster`.
    pub async fn connection(&self) -> ClusterConnection {
        self.client()
            .get_async_connection()
            .await
            .expect("connect to the test cluster")
    }

    /// The node that serves `key`'s slot: the one that answers `EXISTS key` instead of `MOVED`.
    pub fn node_for(&self, key: &[u8]) -> &RedisServer {
        self.nodes
            .iter()
            .find(|node| {
                let mut conn = node.client().get_connection().expect("connect to a node");
                redis::cmd("EXISTS")
                    .arg(key)
                    .query::<i64>(&mut conn)
                    .is_ok()
            })
            .expect("some node serves every slot")
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.stop();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Moving a slot between masters, for tests that follow a name to its new owner.
impl RedisCluster {
    /// The slot `key` hashes to (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &[u8]) -> u16 {
        let mut conn = self.nodes[0].client().get_connection().unwrap();
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut conn)
            .unwrap()
    }

    /// Node `i`'s cluster id (`CLUSTER MYID`).
    pub fn node_id(&self, i: usize) -> String {
        let mut conn = self.nodes[i].client().get_connection().unwrap();
        redis::cmd("CLUSTER").arg("MYID").query(&mut conn).unwrap()
    }

    /// Moves `slot` from node `from` to node `to` with its keys, the way `redis-cli --cluster
    /// reshard` does (`SETSLOT IMPORTING`/`MIGRATING`, `MIGRATE`, then `SETSLOT NODE` on every
    /// node), and waits until every node reports `cluster_state:ok`.
    pub fn move_slot(&self, slot: u16, from: usize, to: usize) {
        let (from_id, to_id) = (self.node_id(from), self.node_id(to));
        let conn = |i: usize| self.nodes[i].client().get_connection().unwrap();
        let (mut source, mut target) = (conn(from), conn(to));
        let setslot = |conn: &mut redis::Connection, how: &str, id: &str| {
            let () = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(how)
                .arg(id)
                .query(conn)
                .unwrap();
        };
        setslot(&mut target, "IMPORTING", &from_id);
        setslot(&mut source, "MIGRATING", &to_id);
        loop {
            let keys: Vec<Vec<u8>> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100)
                .query(&mut source)
                .unwrap();
            if keys.is_empty() {
                break;
            }
            let () = redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(self.nodes[to].port())
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys)
                .query(&mut source)
                .unwrap();
        }
        setslot(&mut target, "NODE", &to_id);
        setslot(&mut source, "NODE", &to_id);
        for i in (0..self.nodes.len()).filter(|&i| i != from && i != to) {
            setslot(&mut conn(i), "NODE", &to_id);
        }
        self.wait_ok();
    }
}
