//! The lock store of one history and the faults injected into it and the clients: one Redis
//! behind the fault proxy, a primary, a replica and three sentinels, or one PostgreSQL server.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::Rng;
use rand::rngs::StdRng;
use serde_json::Value;

use crate::connect::{Locks, call_timeout, scaled};
use crate::proxy::{Fault, Proxy};
use crate::record::{fault, now_us};
use crate::sentinel::{Link, MASTER, Topology, is_primary, role};
use crate::server::{Endpoint, RedisServer};
use tower_lease_harness::{PgServer, Replication};
use tower_lease_postgres::tokio_postgres;

/// The standby's name (`application_name`), which the primary's `synchronous_standby_names`
/// names.
const STANDBY: &str = "history-standby";

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
    Replicated {
        topology: Box<Topology>,
        /// When the last failover ended.
        last_failover: Option<Instant>,
    },
    /// A PostgreSQL primary (the harness's: a cluster of its own, on a free port) and its
    /// synchronous streaming standby, which the clients reach through `PgStore` and a proxy
    /// to each port, on a URL naming both proxies (`target_session_attrs=read-write`): it
    /// follows whichever is primary.
    Postgres {
        server: PgServer,
        standby: PgServer,
        proxies: [Proxy; 2],
    },
}

impl LockStore {
    pub fn start(replicated: bool, dir: &Path, runtime: &tokio::runtime::Runtime) -> Self {
        if replicated {
            let topology = runtime.block_on(Topology::with_sentinels(Link::Direct));
            return LockStore::Replicated {
                topology: Box::new(topology),
                last_failover: None,
            };
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

    /// PostgreSQL, started on this thread: its processes die with the thread that started
    /// them, and the nemesis restarts it from here too.
    pub fn postgres(runtime: &tokio::runtime::Runtime) -> Self {
        let server = PgServer::start();
        let standby = PgServer::standby_of(&server, STANDBY, Replication::Synchronous);
        // A failover swaps the two servers' roles, never their ports: a proxy a port.
        let proxies = [&server, &standby].map(|to| runtime.block_on(Proxy::to_postgres(to)));
        LockStore::Postgres {
            server,
            standby,
            proxies,
        }
    }

    /// How the clients reach it.
    pub fn locks(&self) -> Locks {
        match self {
            LockStore::Postgres { proxies, .. } => Locks::Postgres(format!(
                "postgres://postgres@{},{}/postgres?target_session_attrs=read-write",
                proxies[0].addr(),
                proxies[1].addr()
            )),
            LockStore::Single { proxy, .. } => Locks::Url(format!("redis://{}/", proxy.addr())),
            LockStore::Replicated { topology, .. } => Locks::Sentinel(topology.sentinel_urls()),
        }
    }

    /// Waits a little, injects one fault and answers its record; `None` for a failover that
    /// came too soon after the last one, or that the sentinels refused.
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
        let port = match self {
            LockStore::Postgres {
                server,
                standby,
                proxies,
            } => {
                let pair = Pair {
                    server,
                    standby,
                    proxies,
                };
                return Some(postgres(choice, rng, pair, ttl, runtime, at));
            }
            LockStore::Single { server, .. } => server.port(),
            LockStore::Replicated { topology, .. } => topology.primary.port(),
        };
        // Every cached script forgotten.
        if choice == 12 {
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
            LockStore::Replicated {
                topology,
                last_failover,
            } => failover(choice, topology, last_failover, runtime),
            LockStore::Postgres { .. } => unreachable!("answered above"),
        }
    }
}

/// A fault of PostgreSQL, which keeps its data through every one of them: a committed
/// transaction is in the write-ahead log the server wrote before answering, and the harness's
/// `fsync=off` loses it only with the machine, not with the server's processes. Restarted after
/// a fast shutdown (`SIGINT` to the postmaster: it disconnects every client, checkpoints and
/// exits) or after `SIGKILL` of every process (crash recovery from the log); the store's
/// backends terminated (`pg_terminate_backend`, its listening connection's included); or every
/// process paused (`SIGSTOP`) past the clients' call timeout and often past their leases, then
/// resumed: the statements sent meanwhile run then, on the server's clock, which ran on. Or
/// the network between the clients and the servers, through the proxies, as for one Redis. Or
/// a failover: the primary killed (`SIGKILL` of every process), its synchronous standby
/// promoted, which has every commit answered, and a new synchronous standby made of the new
/// primary on the old one's port, so the clients' URL names the pair again; the next fault
/// comes once it streams.
pub fn postgres(
    choice: u32,
    rng: &mut StdRng,
    pair: Pair<'_>,
    ttl: Duration,
    runtime: &tokio::runtime::Runtime,
    at: u64,
) -> Value {
    let Pair {
        server,
        standby,
        proxies,
    } = pair;
    match choice {
        12 => {
            let port = server.port();
            server.stop();
            standby.promote();
            let promoted = now_us();
            std::mem::swap(server, standby);
            // The dead primary's folder goes before its port is taken again.
            *standby = PgServer::standby_at(server, port, STANDBY, Replication::Synchronous);
            let mut record = fault("pg_failover", at, promoted, false);
            record["standby_back"] = now_us().into();
            record
        }
        4 | 5 => {
            fast_shutdown(server);
            server.restart();
            fault("pg_restart", at, now_us(), false)
        }
        6 | 7 => {
            // `restart` kills every process first.
            server.restart();
            fault("pg_kill", at, now_us(), false)
        }
        8 | 9 => {
            let terminated = terminate(server, runtime);
            let mut record = fault("pg_terminate", at, now_us(), false);
            record["terminated"] = terminated.into();
            record
        }
        10 => network(rng, &[&proxies[0], &proxies[1]], at),
        _ => {
            // Past the clients' call deadline, by up to four leases.
            let pause = call_timeout(ttl) + scaled(ttl, rng.random_range(20..1_250));
            server.pause();
            std::thread::sleep(pause);
            server.resume();
            fault("pg_pause", at, now_us(), false)
        }
    }
}

/// The PostgreSQL servers of a history, and the proxies the clients reach them through.
pub struct Pair<'a> {
    server: &'a mut PgServer,
    standby: &'a mut PgServer,
    proxies: &'a [Proxy; 2],
}

/// Asks the postmaster for a fast shutdown and waits (at most 30 s) until it exited; the
/// restart that follows reaps it.
fn fast_shutdown(server: &PgServer) {
    let Some(pid) = server.pid() else {
        return;
    };
    // SAFETY: a signal to the server our process started.
    unsafe { libc::kill(pid as libc::pid_t, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while running(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether process `pid` still runs: not gone, and not a zombie its parent has yet to reap.
fn running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // `pid (comm) state …`
    let state = stat
        .rfind(')')
        .and_then(|at| stat[at + 1..].split_whitespace().next());
    !matches!(state, Some("Z" | "X") | None)
}

/// Terminates every backend of the clients' database but this one's; answers how many.
fn terminate(server: &PgServer, runtime: &tokio::runtime::Runtime) -> i64 {
    runtime.block_on(async {
        let url = server.url();
        let connecting = tokio_postgres::connect(&url, tokio_postgres::NoTls);
        let Ok(Ok((client, connection))) =
            tokio::time::timeout(Duration::from_secs(5), connecting).await
        else {
            return 0;
        };
        let connection = tokio::spawn(connection);
        let terminated = client
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .map_or(0, |row| row.get::<_, i64>(0));
        drop(client);
        let _ = connection.await;
        terminated
    })
}

pub fn single(
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
        // The network between the clients and the store.
        _ => network(rng, &[proxy], at),
    }
}

/// The network between the clients and the store, through every one of `proxies` alike:
/// slow, silent, one-way, or cut.
fn network(rng: &mut StdRng, proxies: &[&Proxy], at: u64) -> Value {
    let (kind, chosen) = match rng.random_range(0..4) {
        0 => (
            "delay",
            Fault::Delay(Duration::from_millis(rng.random_range(20..200))),
        ),
        1 => ("blackhole", Fault::Blackhole),
        2 => ("drop_replies", Fault::DropReplies),
        _ => ("sever", Fault::Pass),
    };
    let each = |act: &dyn Fn(&Proxy)| proxies.iter().for_each(|proxy| act(proxy));
    if chosen == Fault::Pass {
        each(&|proxy| proxy.sever());
    } else {
        each(&|proxy| proxy.set(chosen));
        std::thread::sleep(Duration::from_millis(rng.random_range(200..800)));
        if !matches!(chosen, Fault::Delay(_)) {
            // The proxy discards what it blackholes or drops, inside a connection that stays
            // open, which TCP never does: a client's later commands would get the replies of
            // earlier ones (a history once had a layer take a lease on the reply to another
            // name's acquisition). A real network loses bytes only with the connection, so
            // the connections that lost some are cut, and any opened meanwhile refused,
            // before traffic passes again.
            each(&|proxy| {
                proxy.sever();
                proxy.set(Fault::Reset);
                proxy.sever();
            });
        }
        each(&|proxy| proxy.set(Fault::Pass));
    }
    fault(kind, at, now_us(), false)
}

/// A failover: the primary killed (`SIGKILL`) and, once the sentinels promoted the replica,
/// restarted empty as the new primary's replica; or one the sentinels run on request
/// (`SENTINEL FAILOVER`). Each starts and ends with the sentinels settled (below), and none
/// starts within 8 s of the last one's end, twice the sentinels' `failover-timeout`: a
/// failover to a replica that has not synced would lose the leases it acknowledged before it
/// died, which `WAIT` does not cover, and sentinels still busy with the last failover may
/// undo the next one.
pub fn failover(
    choice: u32,
    topology: &mut Topology,
    last: &mut Option<Instant>,
    runtime: &tokio::runtime::Runtime,
) -> Option<Value> {
    if last.is_some_and(|last| last.elapsed() < Duration::from_secs(8)) {
        return None;
    }
    runtime.block_on(settle(topology));
    // The write gaps run from here: waiting for the sentinels to settle stops no writes.
    let at = now_us();
    let kind = if choice <= 8 {
        topology.primary.stop();
        let promoted = runtime.block_on(until_promoted(topology, Duration::from_secs(60)));
        assert!(promoted, "no failover within 60 s of the primary's death");
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
            return None;
        }
        // A sentinel may abort the failover (its view of the replica too old, say): then it
        // was no fault.
        if !runtime.block_on(until_promoted(topology, Duration::from_secs(20))) {
            runtime.block_on(settle(topology));
            return None;
        }
        std::mem::swap(&mut topology.primary, &mut topology.replica);
        "sentinel_failover"
    };
    runtime.block_on(settle(topology));
    *last = Some(Instant::now());
    Some(fault(kind, at, now_us(), false))
}

/// Waits (at most 30 s) until every sentinel names one primary, flagged neither down nor in a
/// failover, that answers as the primary, with the other server its replica, link up; then
/// names them so in `topology`. The sentinels turn an old primary into a replica only once
/// they notice it still answers as one: that is done for them here, as they would.
async fn settle(topology: &mut Topology) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let state = settled(topology).await;
        if let Ok(primary) = state {
            if primary == topology.replica.port() {
                std::mem::swap(&mut topology.primary, &mut topology.replica);
            }
            return;
        }
        if let Err(Some(primary)) = state {
            let other = if primary == topology.primary.port() {
                &topology.replica
            } else {
                &topology.primary
            };
            if let Ok(mut conn) = other.client().get_multiplexed_async_connection().await {
                let info: String = redis::cmd("INFO")
                    .arg("replication")
                    .query_async(&mut conn)
                    .await
                    .unwrap_or_default();
                if info.contains("role:master") {
                    let _: redis::RedisResult<()> = redis::cmd("REPLICAOF")
                        .arg("127.0.0.1")
                        .arg(primary)
                        .query_async(&mut conn)
                        .await;
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "the sentinels did not settle within 30 s: {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The settled primary's port; else the primary the sentinels agree on, if they do.
async fn settled(topology: &Topology) -> Result<u16, Option<u16>> {
    let mut named = None;
    for url in topology.sentinel_urls() {
        let client = redis::Client::open(url).expect("a sentinel URL");
        let Ok(mut conn) = client.get_multiplexed_async_connection().await else {
            return Err(None);
        };
        let master: std::collections::HashMap<String, String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(MASTER)
            .query_async(&mut conn)
            .await
            .map_err(|_| None)?;
        let port: Option<u16> = master.get("port").and_then(|p| p.parse().ok());
        if port.is_none() || named.is_some_and(|named| Some(named) != port) {
            return Err(None);
        }
        named = port;
        let flags = master.get("flags").map_or("", String::as_str);
        if flags.contains("down") || flags.contains("failover") {
            return Err(named);
        }
    }
    let primary = named.ok_or(None)?;
    let other = if primary == topology.primary.port() {
        &topology.replica
    } else {
        &topology.primary
    };
    let info: String = match other.client().get_multiplexed_async_connection().await {
        Ok(mut conn) => redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut conn)
            .await
            .unwrap_or_default(),
        Err(_) => String::new(),
    };
    let synced =
        info.contains("master_link_status:up") && info.contains(&format!("master_port:{primary}"));
    if synced {
        Ok(primary)
    } else {
        Err(Some(primary))
    }
}

/// Waits (at most `within`) until the replica answers as the primary and every sentinel
/// names it, up for all; `false` if that did not happen.
async fn until_promoted(topology: &Topology, within: Duration) -> bool {
    let deadline = Instant::now() + within;
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
        if agreed && is_primary(&role(&topology.replica).await) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
