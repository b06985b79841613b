//! One history of the idempotency workload: three app replicas and a driver on one Redis
//! behind the fault proxy, or on a primary and a replica under sentinels, and its nemesis.
//!
//! Faults, one every 0.3–0.9 s: an app replica frozen (`SIGSTOP`, up to two and a half leases)
//! or killed (`SIGKILL`, restarted on its port 0.1–0.6 s later), the store's writes paused
//! (`CLIENT PAUSE … WRITE`, 0.2–2 s, so calls time out and land later); on one Redis the store
//! killed and restarted with its data and, through the proxy, delays, a blackhole, dropped
//! replies and cut connections; under sentinels, `SIGKILL` of the primary or
//! `SENTINEL FAILOVER`, spaced and settled as in the lock histories. No restart loses the
//! store's data: a record the store forgets may run again, as its docs say.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::idempotency::LEDGER;
use crate::nemesis::LockStore;
use crate::record::{fault, now_us};
use crate::{idem_check, server};

/// App replicas per history.
const REPLICAS: usize = 3;

/// Which idempotency history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub replicated: bool,
    pub at_most_once: bool,
    /// The control: a store that acknowledges completions before storing them.
    pub broken: bool,
}

impl Variant {
    /// The reservation's lease: under sentinels long enough to outlast most failovers.
    pub fn lease(self) -> Duration {
        Duration::from_millis(if self.replicated { 3_000 } else { 1_000 })
    }
}

/// Runs one history for `secs` and checks it.
pub fn run_one(seed: u64, secs: u64, variant: Variant) -> idem_check::Verdict {
    let started = std::time::Instant::now();
    let dir = std::env::temp_dir().join(format!(
        "tower-lease-history-idem-{}-{seed}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a directory for the history");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime for the proxy");
    let mut store = LockStore::start(variant.replicated, &dir, &runtime);
    let register = server::RedisServer::start();
    let register_url = format!("redis://127.0.0.1:{}/", register.port());
    let locks = store.locks();
    let ports: Vec<u16> = (0..REPLICAS).map(|_| server::free_port()).collect();
    let exe = std::env::current_exe().expect("this program");
    let lease_ms = variant.lease().as_millis().to_string();
    let replica = |r: usize| {
        let mut command = Command::new(&exe);
        command
            .args(["idem-serve", "--process", &r.to_string()])
            .args(locks.to_args())
            .args(["--register", &register_url])
            .args(["--port", &ports[r].to_string()])
            .args(["--secs", &secs.to_string(), "--ttl-ms", &lease_ms])
            .args(["--out", "/dev/null"])
            .stdin(Stdio::null());
        if variant.at_most_once {
            command.arg("--at-most-once");
        }
        if variant.broken {
            command.arg("--broken-idem");
        }
        server::die_with_parent(&mut command);
        command.spawn().expect("an app replica")
    };
    let mut replicas: Vec<Child> = (0..REPLICAS).map(replica).collect();
    let driver_out = dir.join("driver.jsonl");
    let ports_arg: Vec<String> = ports.iter().map(u16::to_string).collect();
    let mut driver = {
        let mut command = Command::new(&exe);
        command
            .args(["idem-drive", "--ports", &ports_arg.join(",")])
            .args(["--secs", &secs.to_string(), "--ttl-ms", &lease_ms])
            .args(["--seed", &seed.to_string()])
            .args(["--out", &driver_out.to_string_lossy()])
            .stdin(Stdio::null());
        server::die_with_parent(&mut command);
        command.spawn().expect("the driver")
    };

    let mut rng = StdRng::seed_from_u64(seed);
    let mut history = vec![json!({ "op": "idem_config", "at_most_once": variant.at_most_once })];
    let end = now_us() + secs * 1_000_000;
    while now_us() + 1_500_000 < end {
        std::thread::sleep(Duration::from_millis(rng.random_range(300..900)));
        let lease = variant.lease();
        let at = now_us();
        let choice = rng.random_range(0..11);
        let injected = match choice {
            // An app replica frozen, often past its reservations' lease.
            0 | 1 => {
                let pid = replicas[rng.random_range(0..REPLICAS)].id() as libc::pid_t;
                let pause = lease.mul_f64(rng.random_range(0.3..2.5));
                // SAFETY: signals to our own child process.
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                std::thread::sleep(pause);
                unsafe { libc::kill(pid, libc::SIGCONT) };
                Some(fault("pause_replica", at, now_us(), false))
            }
            // An app replica killed mid-request, and started again on its port.
            2 | 3 => {
                let r = rng.random_range(0..REPLICAS);
                let _ = replicas[r].kill();
                let _ = replicas[r].wait();
                std::thread::sleep(Duration::from_millis(rng.random_range(100..600)));
                replicas[r] = replica(r);
                Some(fault("kill_replica", at, now_us(), false))
            }
            // The store's writes paused: calls time out, and land once it resumes.
            4 | 5 => {
                let ms = rng.random_range(200..2_000);
                let port = primary_port(&store);
                let _ = Command::new("redis-cli")
                    .args(["-p", &port.to_string(), "CLIENT", "PAUSE", &ms.to_string()])
                    .arg("WRITE")
                    .stdout(Stdio::null())
                    .status();
                std::thread::sleep(Duration::from_millis(ms));
                Some(fault("client_pause", at, now_us(), false))
            }
            _ => match &mut store {
                // Restarted with its data (4), or the proxy's faults (8).
                LockStore::Single { server, aof, proxy } => {
                    let kind = if choice <= 7 { 4 } else { 8 };
                    Some(crate::nemesis::single(
                        kind, &mut rng, server, aof, proxy, at,
                    ))
                }
                LockStore::Replicated {
                    topology,
                    last_failover,
                } => crate::nemesis::failover(choice, topology, last_failover, &runtime),
                LockStore::Postgres { .. } => {
                    unreachable!("the idempotency histories run on Redis")
                }
            },
        };
        history.extend(injected);
    }
    let _ = driver.wait();
    for replica in &mut replicas {
        // SAFETY: a signal to our own child process.
        unsafe { libc::kill(replica.id() as libc::pid_t, libc::SIGTERM) };
        let _ = replica.wait();
    }

    let file = std::fs::File::open(&driver_out).expect("the driver's history");
    for line in std::io::BufReader::new(file).lines() {
        let line = line.expect("a history line");
        history.push(serde_json::from_str(&line).expect("a JSON history line"));
    }
    history.extend(ledger(register.port()));
    let path = dir.join("history.jsonl");
    write_history(&path, &history);
    let verdict = idem_check::check(&history);
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for v in &history {
        if v["op"] == "fault" {
            *kinds.entry(v["kind"].as_str().unwrap_or("?")).or_default() += 1;
        }
    }
    println!(
        "history {seed} (idempotency {variant:?}, {} s): {} attempts, {} runs of {} keys ({} \
         acknowledged, {} run again before any acknowledgement, {} left unresolved, {} stale runs \
         after one under an older fence), {} faults {kinds:?}, {} violations; {}",
        started.elapsed().as_secs(),
        verdict.attempts,
        verdict.runs,
        verdict.keys,
        verdict.acknowledged,
        verdict.rerun,
        verdict.unresolved,
        verdict.stale,
        verdict.faults,
        verdict.violations.len(),
        path.display(),
    );
    verdict
}

fn primary_port(store: &LockStore) -> u16 {
    match store {
        LockStore::Single { server, .. } => server.port(),
        LockStore::Replicated { topology, .. } => topology.primary.port(),
        LockStore::Postgres { .. } => unreachable!("the idempotency histories run on Redis"),
    }
}

/// The ledger's runs, as `run` lines.
fn ledger(port: u16) -> Vec<Value> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("register URL");
    let mut conn = client.get_connection().expect("the register");
    let entries: Vec<String> = redis::cmd("LRANGE")
        .arg(LEDGER)
        .arg(0)
        .arg(-1)
        .query(&mut conn)
        .expect("LRANGE");
    entries
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .map(|mut v| {
            v["op"] = json!("run");
            v
        })
        .collect()
}

fn write_history(path: &Path, history: &[Value]) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).expect("the history file"));
    for value in history {
        writeln!(out, "{value}").expect("the history file");
    }
}
