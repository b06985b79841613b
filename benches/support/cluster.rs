//! A local Redis Cluster for the benchmarks: three masters on free loopback ports, no replicas,
//! joined with `redis-cli --cluster create`; killed on drop.

use std::net::{Ipv4Addr, TcpListener};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::Redis;

/// Three cluster-enabled `redis-server`s serving all 16384 slots.
#[derive(Debug)]
pub struct Cluster {
    pub nodes: Vec<Redis>,
    dir: std::path::PathBuf,
}

impl Cluster {
    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("tower-lease-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the nodes' cluster configs");
        let nodes = (0..3)
            .map(|i| {
                let config = dir.join(format!("nodes-{i}.conf"));
                // The default bus port (port + 10000) overflows above 55535.
                let bus = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                    .and_then(|l| l.local_addr())
                    .expect("a free port for the cluster bus")
                    .port()
                    .to_string();
                Redis::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &config.to_string_lossy(),
                    "--cluster-port",
                    &bus,
                ])
            })
            .collect::<Vec<_>>();
        let addrs = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port()));
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .status()
            .expect("run redis-cli --cluster create");
        assert!(created.success(), "redis-cli --cluster create failed");
        let cluster = Cluster { nodes, dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cluster
            .nodes
            .iter()
            .all(|n| n.cluster_info().contains("cluster_state:ok"))
        {
            assert!(
                Instant::now() < deadline,
                "the cluster never reached cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url().to_owned()).collect()
    }

    /// The sum over the nodes of `cluster_stats_messages_<field>` in `CLUSTER INFO`.
    pub fn bus_messages(&self, field: &str) -> u64 {
        let field = format!("cluster_stats_messages_{field}:");
        self.nodes
            .iter()
            .map(|n| {
                n.cluster_info()
                    .lines()
                    .find_map(|line| line.strip_prefix(field.as_str()))
                    .map_or(0, |v| v.trim().parse().unwrap_or(0))
            })
            .sum()
    }
}

impl Redis {
    /// `CLUSTER INFO`, or nothing while the node does not answer it.
    pub fn cluster_info(&self) -> String {
        self.client()
            .get_connection()
            .and_then(|mut c| redis::cmd("CLUSTER").arg("INFO").query(&mut c))
            .unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
