//! The lock store of one history and the faults injected into it and the clients: one Redis
//! behind the fault proxy, or a primary, a replica and three sentinels.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::Rng;
use rand::rngs::StdRng;
use serde_json::Value;

use crate::connect::{Locks, scaled};
use crate::proxy::{Fault, Proxy};
use crate::record::{fault, now_us};
use crate::sentinel::{Link, MASTER, Topology};
use crate::server::{Endpoint, RedisServer};

/// Where one history's leases live.
pub enum LockStore {
    /// One Redis with an append-only file, which the clients reach through a proxy.
    Single {
        server: RedisServer,
        aof: PathBuf,
        proxy: Proxy,
    },
    /// A primary and a replica under three sentinels; the clients find the primary through
    /// them and count a lease once the replica has it.
    Replicated(Box<Topology>),
}

impl LockStore {
    pub fn start(replicated: bool, dir: &Path, runtime: &tokio::runtime::Runtime) -> Self {
        if replicated {
            return LockStore::Replicated(Box::new(
                runtime.block_on(Topology::with_sentinels(Link::Direct)),
            ));
        }
        let aof = dir.join("aof");
        std::fs::create_dir_all(&aof).expect("a directory for the append-only file");
        let aof_dir = aof.to_string_lossy().into_owned();
        let server = RedisServer::start_with(&[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--dir",
            &aof_dir,
        ]);
        let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], server.port()));
        let proxy = runtime.block_on(Proxy::start(upstream));
        LockStore::Single { server, aof, proxy }
    }

    /// How the clients reach it.
    pub fn locks(&self) -> Locks {
        match self {
            LockStore::Single { proxy, .. } => Locks::Url(format!("redis://{}/", proxy.addr())),
            LockStore::Replicated(topology) => Locks::Sentinel(topology.sentinel_urls()),
        }
    }

    /// Waits a little, injects one fault and answers its record; `None` when the sentinels
    /// refused to fail over again so soon.
    pub fn inject(
        &mut self,
        rng: &mut StdRng,
        clients: &[Child],
        ttl: Duration,
        runtime: &tokio::runtime::Runtime,
    ) -> Option<Value> {
        std::thread::sleep(Duration::from_millis(rng.random_range(300..900)));
        let at = now_us();
        let choice = rng.random_range(0..13);
        // A client frozen for longer than its lease.
        if choice <= 3 {
            let client = &clients[rng.random_range(0..clients.len())];
            let pid = client.id() as libc::pid_t;
            let pause = scaled(ttl, rng.random_range(400..900));
            // SAFETY: signals to our own child processes.
            unsafe { libc::kill(pid, libc::SIGSTOP) };
            std::thread::sleep(pause);
            unsafe { libc::kill(pid, libc::SIGCONT) };
            return Some(fault("pause", at, now_us(), false));
        }
        // Every cached script forgotten.
        if choice == 12 {
            let port = match self {
                LockStore::Single { server, .. } => server.port(),
                LockStore::Replicated(topology) => topology.primary.port(),
            };
            let _ = Command::new("redis-cli")
                .args(["-p", &port.to_string(), "SCRIPT", "FLUSH"])
                .stdout(Stdio::null())
                .status();
            return Some(fault("script_flush", at, now_us(), false));
        }
        match self {
            LockStore::Single { server, aof, proxy } => {
                Some(single(choice, rng, server, aof, proxy, at))
            }
            LockStore::Replicated(topology) => failover(choice, topology, runtime, at),
        }
    }
}

fn single(
    choice: u32,
    rng: &mut StdRng,
    server: &mut RedisServer,
    aof: &Path,
    proxy: &Proxy,
    at: u64,
) -> Value {
    match choice {
        // The store killed and restarted, with its data.
        4..=6 => {
            server.restart();
            fault("restart", at, now_us(), false)
        }
        // The store killed and restarted without its data.
        7 => {
            server.stop();
            let _ = std::fs::remove_dir_all(aof);
            std::fs::create_dir_all(aof).expect("a directory for the append-only file");
            server.restart();
            fault("restart_empty", at, now_us(), true)
        }
        // The network between the clients and the store: slow, silent, one-way, or cut.
        _ => {
            let (kind, chosen) = match rng.random_range(0..4) {
                0 => (
                    "delay",
                    Fault::Delay(Duration::from_millis(rng.random_range(20..200))),
                ),
                1 => ("blackhole", Fault::Blackhole),
                2 => ("drop_replies", Fault::DropReplies),
                _ => ("sever", Fault::Pass),
            };
            if chosen == Fault::Pass {
                proxy.sever();
            } else {
                proxy.set(chosen);
                std::thread::sleep(Duration::from_millis(rng.random_range(200..800)));
                proxy.set(Fault::Pass);
            }
            fault(kind, at, now_us(), false)
        }
    }
}

/// A failover: the primary killed (`SIGKILL`) and, once the sentinels promoted the replica,
/// restarted empty as the new primary's replica; or one the sentinels run on request
/// (`SENTINEL FAILOVER`). Either way the next fault waits until the new replica has synced:
/// a failover to a replica that has not would lose the leases it acknowledged before it died,
/// which `WAIT` does not cover.
fn failover(
    choice: u32,
    topology: &mut Topology,
    runtime: &tokio::runtime::Runtime,
    at: u64,
) -> Option<Value> {
    let kind = if choice <= 8 {
        runtime.block_on(topology.kill_primary_and_fail_over());
        std::mem::swap(&mut topology.primary, &mut topology.replica);
        let primary = topology.primary.port().to_string();
        topology.replica.restart_with(&[
            "--repl-diskless-sync-delay",
            "0",
            "--replicaof",
            "127.0.0.1",
            &primary,
        ]);
        "kill_primary"
    } else {
        let asked = Command::new("redis-cli")
            .args(["-u", &topology.sentinel_urls()[0]])
            .args(["SENTINEL", "FAILOVER", MASTER])
            .output();
        let refused = asked.map_or(true, |out| {
            !String::from_utf8_lossy(&out.stdout).contains("OK")
        });
        if refused {
            // The sentinels are still busy with the last one: no fault.
            return None;
        }
        runtime.block_on(until_promoted(topology));
        std::mem::swap(&mut topology.primary, &mut topology.replica);
        // The sentinels turn the old primary into a replica only once they notice it still
        // answers as one, which can take longer than the next fault: do it for them. Until then
        // it takes writes that no replica acknowledges, which `WAIT` refuses.
        let _ = Command::new("redis-cli")
            .args([
                "-p",
                &topology.replica.port().to_string(),
                "REPLICAOF",
                "127.0.0.1",
            ])
            .arg(topology.primary.port().to_string())
            .stdout(Stdio::null())
            .status();
        "sentinel_failover"
    };
    runtime.block_on(topology.until_synced());
    Some(fault(kind, at, now_us(), false))
}

/// Waits until the replica answers as the primary and every sentinel names it, up for all.
async fn until_promoted(topology: &Topology) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let wanted = topology.replica.port().to_string();
    loop {
        let mut agreed = true;
        for url in topology.sentinel_urls() {
            let Ok(mut conn) = redis::Client::open(url)
                .expect("a sentinel URL")
                .get_multiplexed_async_connection()
                .await
            else {
                agreed = false;
                break;
            };
            let master: Option<std::collections::HashMap<String, String>> = redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg(MASTER)
                .query_async(&mut conn)
                .await
                .ok();
            agreed &= master.is_some_and(|fields| {
                fields.get("port") == Some(&wanted)
                    && fields
                        .get("flags")
                        .is_some_and(|flags| !flags.contains("s_down") && !flags.contains("o_down"))
            });
        }
        let role: Option<redis::Value> = match topology
            .replica
            .client()
            .get_multiplexed_async_connection()
            .await
        {
            Ok(mut conn) => redis::cmd("ROLE").query_async(&mut conn).await.ok(),
            Err(_) => None,
        };
        let promoted = matches!(&role, Some(redis::Value::Array(fields))
            if matches!(fields.first(), Some(redis::Value::BulkString(role)) if role == b"master"));
        if agreed && promoted {
            return;
        }
        assert!(Instant::now() < deadline, "no failover within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
