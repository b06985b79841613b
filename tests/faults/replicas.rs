//! Several replica processes (the `replica` example, started as child processes) against one
//! Redis: mutual exclusion of a non-atomic read-modify-write under 5000 contended requests, with
//! and without delays injected between the replicas and Redis, and a replica frozen with SIGSTOP
//! past its lease.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use tower_lease::store::{KeyLayout, KeyRole};

use tower_lease_harness::http::Http;
use tower_lease_harness::proxy::{Fault, Proxy};
use tower_lease_harness::server::{calls, commandstats, die_with_parent};
use tower_lease_harness::{Endpoint, RedisServer};

/// The `replica` example's executable, built once per test binary with the same features.
pub(crate) fn replica_binary() -> &'static PathBuf {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let output = Command::new(env!("CARGO"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            // As scripts/test builds the workspace (every crate, every feature): the crate
            // alone would unify other features, and rebuild half the workspace here.
            .args([
                "build",
                "--workspace",
                "--example",
                "replica",
                "--all-features",
                "--message-format=json",
            ])
            .stderr(Stdio::inherit())
            .output()
            .expect("run cargo build --example replica");
        assert!(
            output.status.success(),
            "cargo build --example replica failed"
        );
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|msg| {
                msg["reason"] == "compiler-artifact" && msg["target"]["name"] == "replica"
            })
            .find_map(|msg| msg["executable"].as_str().map(PathBuf::from))
            .expect("cargo reported the replica executable")
    })
}

/// A `replica` process; killed when dropped.
pub(crate) struct Replica {
    child: Child,
    pub(crate) addr: SocketAddr,
}

impl Replica {
    pub(crate) fn start(redis_url: &str, env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(replica_binary());
        command
            .env("REDIS_URL", redis_url)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        die_with_parent(&mut command);
        let mut child = command.spawn().expect("start the replica example");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("replica did not start: {line:?}"))
            .parse()
            .unwrap();
        Replica { child, addr }
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {signal}");
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Default)]
struct Tally {
    /// 200s per counter.
    ok: Vec<usize>,
    conflict: usize,
    other: Vec<StatusCode>,
    took: Duration,
}

impl Tally {
    fn total_ok(&self) -> usize {
        self.ok.iter().sum()
    }
}

/// Sends `total` increments, `concurrency` at a time, each worker on one of `counters` and
/// round robin over the replicas.
async fn hammer(
    replicas: &[Replica],
    counters: &[&str],
    total: usize,
    concurrency: usize,
) -> Tally {
    let replicas: Vec<SocketAddr> = replicas.iter().map(|r| r.addr).collect();
    let http = Http::new();
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..concurrency {
        let (http, replicas) = (http.clone(), replicas.to_vec());
        let counter = worker % counters.len();
        let path = format!("/counters/{}/increment", counters[counter]);
        let requests = total / concurrency + usize::from(worker < total % concurrency);
        workers.spawn(async move {
            let mut statuses = Vec::with_capacity(requests);
            for i in 0..requests {
                let addr = replicas[(worker + i) % replicas.len()];
                statuses.push(http.send(addr, Method::POST, &path, &[]).await.status);
            }
            (counter, statuses)
        });
    }
    let mut tally = Tally {
        ok: vec![0; counters.len()],
        ..Tally::default()
    };
    while let Some(done) = workers.join_next().await {
        let (counter, statuses) = done.unwrap();
        for status in statuses {
            match status {
                StatusCode::OK => tally.ok[counter] += 1,
                StatusCode::CONFLICT => tally.conflict += 1,
                other => tally.other.push(other),
            }
        }
    }
    tally.took = started.elapsed();
    tally
}

/// The counters' values, read through `conn` (a server's or the cluster's).
async fn counters(mut conn: impl redis::aio::ConnectionLike, names: &[&str]) -> Vec<usize> {
    let mut values = Vec::new();
    for name in names {
        let value: Option<usize> = redis::cmd("GET")
            .arg(format!("counter:{name}"))
            .query_async(&mut conn)
            .await
            .unwrap();
        values.push(value.unwrap_or(0));
    }
    values
}

const REQUESTS: usize = 5000;
const CONCURRENCY: usize = 40;
/// Five counters, eight concurrent clients on each.
const COUNTERS: [&str; 5] = ["c0", "c1", "c2", "c3", "c4"];

/// Sends the 5000 contended increments to `replicas`, reads the counters through `conn`, and
/// asserts that every counter equals the number of 200s it answered: no update was lost.
async fn assert_no_lost_update(
    what: &str,
    replicas: &[Replica],
    conn: impl redis::aio::ConnectionLike,
) {
    let tally = hammer(replicas, &COUNTERS, REQUESTS, CONCURRENCY).await;
    let values = counters(conn, &COUNTERS).await;
    eprintln!("{what}: {tally:?}, counters {values:?}");
    assert!(
        tally.other.is_empty(),
        "only 200 and 409 expected: {:?}",
        tally.other
    );
    assert_eq!(tally.total_ok() + tally.conflict, REQUESTS);
    assert!(
        tally.total_ok() >= 100,
        "too few increments ran to show anything: {tally:?}"
    );
    assert_eq!(
        values, tally.ok,
        "lost updates: counters vs. 200s per counter"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_lose_no_update_under_5000_contended_requests() {
    let server = RedisServer::start();
    let replicas: Vec<Replica> = (0..3).map(|_| Replica::start(&server.url(), &[])).collect();
    assert_no_lost_update("direct", &replicas, server.connection().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_lose_no_update_with_delays_to_redis() {
    let server = RedisServer::start();
    let mut proxies = Vec::new();
    let mut replicas = Vec::new();
    // Each replica sees Redis with another latency, so their commands interleave differently.
    for delay in [1, 4, 9] {
        let proxy = Proxy::to(&server).await;
        proxy.set(Fault::Delay(Duration::from_millis(delay)));
        replicas.push(Replica::start(&proxy.url(), &[]));
        proxies.push(proxy);
    }
    assert_no_lost_update("delayed", &replicas, server.connection().await).await;
}

/// The control: the same replicas without `LockLayer` lose updates, so the tests above can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_layer_the_same_load_loses_updates() {
    let server = RedisServer::start();
    let unlocked = [("LOCKED", "0")];
    let replicas: Vec<Replica> = (0..3)
        .map(|_| Replica::start(&server.url(), &unlocked))
        .collect();
    let tally = hammer(&replicas, &COUNTERS, 500, CONCURRENCY).await;
    let values = counters(server.connection().await, &COUNTERS).await;
    eprintln!("unlocked: {tally:?}, counters {values:?}");
    assert_eq!(tally.total_ok(), 500);
    let lost = tally.total_ok() - values.iter().sum::<usize>();
    assert!(
        lost > 0,
        "no update was lost without the lock: the race is not exercised"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_frozen_past_its_lease_does_not_report_success() {
    const TTL_MS: u64 = 600;
    let server = RedisServer::start();
    let env = [("LOCK_TTL_MS", "600"), ("STORE_TIMEOUT_MS", "300")];
    let frozen = Replica::start(&server.url(), &env);
    let other = Replica::start(&server.url(), &env);
    let http = Http::new();
    let path = "/counters/paused/increment";

    // The frozen replica's request works for 1.5 s under the lease...
    let slow = {
        let http = http.clone();
        let addr = frozen.addr;
        tokio::spawn(async move {
            http.send(addr, Method::POST, path, &[("x-work-ms", b"1500")])
                .await
        })
    };
    let key = KeyLayout::default().key(KeyRole::Lock, "counter", b"paused");
    let mut conn = server.connection().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while !redis::cmd("EXISTS")
        .arg(&key)
        .query_async::<bool>(&mut conn)
        .await
        .unwrap()
    {
        assert!(
            Instant::now() < deadline,
            "the slow request never took the lease"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The key is there a moment before the replica has read the store's reply: let it take the
    // reply and start its handler, or the freeze would land in the acquisition (its timeout
    // then answers "store unavailable", not "lease lost").
    tokio::time::sleep(Duration::from_millis(200)).await;
    // ...and the process is frozen while it holds the lease (no heartbeat, no progress).
    frozen.signal("-STOP");
    let stopped = Instant::now();

    let first = http
        .send(other.addr, Method::POST, path, &[("x-work-ms", b"0")])
        .await;
    assert_eq!(
        first.status,
        StatusCode::CONFLICT,
        "the frozen replica's lease is still live"
    );
    let taken_after = loop {
        let reply = http
            .send(other.addr, Method::POST, path, &[("x-work-ms", b"0")])
            .await;
        if reply.status == StatusCode::OK {
            break stopped.elapsed();
        }
        assert_eq!(reply.status, StatusCode::CONFLICT, "{reply:?}");
        assert!(
            stopped.elapsed() < Duration::from_secs(3),
            "the lease never ran out"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // The lease was last extended at most TTL/3 before the stop, so it ends within one TTL.
    assert!(
        taken_after <= Duration::from_millis(TTL_MS + 300),
        "{taken_after:?}"
    );

    // The other replica writes the counter twice meanwhile (0 -> 1 -> 2); the frozen handler
    // read 0 before the stop, so its write, if it ever came, would set it back to 1.
    let second = http
        .send(other.addr, Method::POST, path, &[("x-work-ms", b"0")])
        .await;
    assert_eq!(second.status, StatusCode::OK, "{second:?}");

    // Keep it frozen until its handler's work is over, then let it go on.
    tokio::time::sleep(Duration::from_millis(1600).saturating_sub(stopped.elapsed())).await;
    frozen.signal("-CONT");
    let resumed = slow.await.unwrap();
    eprintln!(
        "SIGSTOP: the other replica took the lease {taken_after:?} after the stop (TTL {TTL_MS} ms); \
         the frozen one answered {} after resuming",
        resumed.status
    );
    assert_eq!(
        resumed.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{resumed:?}"
    );
    let problem = resumed.problem();
    assert_eq!(problem["type"], "urn:tower-lease:lease-lost", "{problem}");
    // Woken past its lease, the frozen replica never took its handler's next step (the write).
    assert_eq!(
        counters(server.connection().await, &["paused"]).await,
        [2],
        "the frozen replica wrote after its lease ran out"
    );
}

#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_a_redis_cluster_lose_no_update() {
    let cluster = tower_lease_harness::cluster::RedisCluster::start();
    let layout = KeyLayout::default();
    let nodes: std::collections::HashSet<u16> = COUNTERS
        .iter()
        .map(|c| {
            cluster
                .node_for(&layout.key(KeyRole::Lock, "counter", c.as_bytes()))
                .port()
        })
        .collect();
    assert!(
        nodes.len() >= 2,
        "the counters' locks live on {} node(s)",
        nodes.len()
    );
    let urls = cluster.urls().join(",");
    let replicas: Vec<Replica> = (0..3)
        .map(|_| Replica::start("redis://unused/", &[("REDIS_CLUSTER", &urls)]))
        .collect();
    let what = format!("cluster, locks on {} nodes", nodes.len());
    assert_no_lost_update(&what, &replicas, cluster.connection().await).await;
}

/// Three replica processes with 100 waiting requests each on one counter (`WAIT_MS`): no update
/// is lost, every request is served or refused within its wait, and with release notifications
/// each release makes at most one acquisition attempt per replica with waiters, not one per
/// waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_with_100_waiters_each_lose_no_update_and_make_no_herd() {
    const WAIT: Duration = Duration::from_secs(10);
    let server = RedisServer::start();
    let env = [("WAIT_MS", "10000"), ("WORK_MS", "2")];
    let replicas: Vec<Replica> = (0..3)
        .map(|_| Replica::start(&server.url(), &env))
        .collect();
    let raw = server.connection().await;
    let before = commandstats(&raw).await;
    // 300 requests at once, 100 per replica, all on one counter.
    let tally = hammer(&replicas, &["w"], 300, 300).await;
    let after = commandstats(&raw).await;
    let values = counters(server.connection().await, &["w"]).await;
    eprintln!("waiters: {tally:?}, counter {values:?}");
    assert!(
        tally.other.is_empty(),
        "only 200 and 409: {:?}",
        tally.other
    );
    assert_eq!(values, tally.ok, "no lost update");
    assert_eq!(tally.total_ok(), 300, "each waited its turn: {tally:?}");
    assert!(
        tally.took < WAIT,
        "all answered within their wait: {:?}",
        tally.took
    );

    // Each release wakes one waiter per replica, whose attempt is refused or acquires. A refused
    // one asks its `PTTL` once (after its `SET NX`, or in `acquire.lua`, which also marks the
    // holder's key with a `SET`: so `SET`s no longer count attempts). 300 releases with 3
    // replicas waiting make at most 900 attempts, 300 of them acquisitions, plus each replica's
    // first attempt and its safety polls (one per second). A waiter queued behind its own
    // replica's lease wakes on that release here, and never again on the same release heard
    // as a message: the message carries the holder's secret, and the replica that released
    // drops its own. (Before it did, a waiter could hear it again after its attempt was sent:
    // 938 attempts for 300 releases on Valkey, over this limit.) A herd would make one per
    // waiter: 100 a release.
    let releases = tally.total_ok() as u64;
    let attempts = calls(&after, "pttl") - calls(&before, "pttl") + releases;
    let safety = 3 * (tally.took.as_secs() + 1);
    let delta = |command: &str| calls(&after, command) - calls(&before, command);
    eprintln!(
        "waiters: {attempts} acquisition attempts for {releases} releases (SET {}, PTTL {}, \
         EVALSHA {}, PUBLISH {})",
        delta("set"),
        delta("pttl"),
        delta("evalsha"),
        delta("publish")
    );
    assert!(
        attempts <= 3 * (releases + 1) + safety,
        "{attempts} acquisition attempts besides the counters' for {releases} releases"
    );
}
