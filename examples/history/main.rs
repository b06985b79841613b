//! A history checker with a nemesis, as Jepsen checks a lock: client processes take leases
//! through the public API (a fenced `Lock`, a fenced `RwLock`'s reads and writes, a `Semaphore`'s
//! permits, each kept with `keep_alive`, and the same locks through `LockLayer` and
//! `RwLockLayer` over HTTP) and the exclusive holders write to a fenced register in a second
//! Redis, while faults are injected all along; every operation is recorded with its invoke and
//! complete times on one monotonic clock, and a checker decides afterwards whether the history
//! is possible under the lock's promises (see `check.rs`).
//!
//! ```text
//! cargo run --example history -- run [--quick] [--control] [--sentinel] [--idempotency]
//!     [--postgres] [--seed N] [--secs N]
//! cargo run --example history -- check <history.jsonl>
//! ```
//!
//! Faults: `SIGSTOP`/`SIGCONT` of a client for longer than its lease, `SIGKILL` and restart of
//! the lock store's redis-server with persistence (every write fsynced) and without it (its
//! data gone), `SCRIPT FLUSH`, and on the clients' way to the store (a proxy) delays, a
//! blackhole, replies dropped (the store acts, the client never learns) and cut connections.
//! One history in every run keeps its leases on a primary and a replica under three sentinels
//! instead, the clients following the primary through them with `wait_for_replicas(1, ..)`,
//! and fails over (`SIGKILL` of the primary, restarted as the new one's replica, or
//! `SENTINEL FAILOVER`); a steady writer runs beside the clients there, and the history's
//! summary gives the longest write gap after each failover. `--sentinel` runs only such
//! histories.
//!
//! One history in every run (the last lock history; `--postgres` runs only it) keeps the same
//! clients' leases in PostgreSQL instead, through `tower-lease-postgres`'s `PgStore` (each
//! process its own, with the calls' timeout of the Redis histories), on the harness's
//! `PgServer` (a cluster of its own on a free port) and its synchronous streaming standby,
//! each behind a proxy, on a URL naming both with `target_session_attrs=read-write`; the
//! register stays in Redis. Its
//! nemesis, besides pausing clients as above: PostgreSQL restarted after a fast shutdown
//! (`SIGINT`) or after `SIGKILL` of every process (crash recovery), both keeping the data,
//! which is durable; the store's backends terminated (`pg_terminate_backend` of every other
//! backend of the database, the listening connections' included); every process of the
//! server paused (`SIGSTOP` of the postmaster and its children) past the calls' deadline, up
//! to four leases, then `SIGCONT`; the network between the clients and the servers, through
//! the proxies as for one Redis (delayed, blackholed, replies dropped, severed); and a failover: the primary killed (`SIGKILL`), the
//! standby promoted, a new standby of it made on the old primary's port. No fault loses data
//! (the standby is synchronous), so no overlap is excused there.
//!
//! Two histories in every run (`--idempotency` runs only those) pay through
//! `IdempotencyLayer` instead, on app replicas that are frozen and killed, with clients that
//! retry, and check that an acknowledged payment never runs again (`idempotency.rs`,
//! `idem_run.rs`, `idem_check.rs`).
//!
//! `--control` runs four histories broken on purpose, in which the checker must find
//! violations: one of broken clients (no heartbeat, no expiry check, unconditional writes),
//! one of correct clients over a broken lock (`broken.rs`: taken without `NX`, released without
//! comparing the secret), one of payments over a store that acknowledges a completion before
//! storing it, and the broken clients again with their leases in PostgreSQL, under its nemesis.
//! Each history is written to a JSON-lines file, whose path is printed; the last line printed
//! is `N histories, M operations, K violations`, and the exit status is non-zero when K > 0
//! (or, under `--control`, when a history has none).

use std::collections::BTreeMap;
use std::io::{BufRead, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rand::SeedableRng;

mod broken;
mod check;
mod connect;
mod http;
mod idem_check;
mod idem_run;
mod idempotency;
mod nemesis;
mod record;
mod upgrade;
mod worker;

// The servers, sentinels and fault proxy the tests start too.
use tower_lease_harness::{proxy, sentinel, server};

use crate::connect::Locks;
use crate::nemesis::LockStore;
use crate::record::now_us;
use crate::upgrade::{Rolling, Upgrade};

/// The library's clients; the HTTP server and its driver come after them, and in the histories
/// that fail over, the steady writer.
const WORKERS: u64 = 8;
const SERVER: u64 = WORKERS;
const DRIVER: u64 = WORKERS + 1;
const STEADY: u64 = DRIVER + 1;

/// Leases of the histories on one Redis, and of those that fail over: long enough to outlast
/// most failovers (1–3 s here) on their heartbeat's retries.
const TTL: Duration = Duration::from_millis(300);
const REPLICATED_TTL: Duration = Duration::from_millis(3_000);
const UPGRADE_TTL: Duration = Duration::from_millis(2_000);

/// What one history runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Correct clients on one Redis behind the fault proxy.
    Single,
    /// Correct clients on a primary and a replica under sentinels.
    Replicated,
    /// Broken clients on one Redis.
    BrokenClient,
    /// Correct clients over the broken lock.
    BrokenLock,
    /// Correct clients on PostgreSQL (`PgStore`).
    Postgres,
    /// Broken clients on PostgreSQL.
    PostgresBroken,
    /// The idempotency workload (`idempotency.rs`).
    Idempotent(idem_run::Variant),
}

/// The idempotency histories: on one Redis, failing over, and failing over under
/// `at_most_once`; the control's, over a store that acknowledges before storing. `--quick`
/// runs the first and the third.
const IDEM_SINGLE: Mode = Mode::Idempotent(idem_run::Variant {
    replicated: false,
    at_most_once: false,
    broken: false,
});
const IDEM_REPLICATED: Mode = Mode::Idempotent(idem_run::Variant {
    replicated: true,
    at_most_once: false,
    broken: false,
});
const IDEM_ONCE: Mode = Mode::Idempotent(idem_run::Variant {
    replicated: true,
    at_most_once: true,
    broken: false,
});
const IDEM_BROKEN: Mode = Mode::Idempotent(idem_run::Variant {
    replicated: false,
    at_most_once: false,
    broken: true,
});

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| args.iter().any(|a| a == f);
    let value = |f: &str| {
        args.iter()
            .position(|a| a == f)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let number = |f: &str| value(f).and_then(|v| v.parse::<u64>().ok());
    let command = args.first().map(String::as_str);
    if let Some(role @ ("idem-serve" | "idem-drive")) = command {
        let timing = idempotency::Timing {
            lease: Duration::from_millis(number("--ttl-ms").unwrap_or(1_000)),
        };
        let secs = number("--secs").unwrap_or(10);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        if role == "idem-serve" {
            let replica = idempotency::Replica {
                replica: number("--process").unwrap_or(0),
                locks: Locks::from_args(
                    value("--locks"),
                    value("--sentinels"),
                    value("--postgres"),
                ),
                register_url: value("--register").expect("--register URL"),
                port: number("--port").expect("--port") as u16,
                secs,
                timing,
                at_most_once: flag("--at-most-once"),
                broken: flag("--broken-idem"),
            };
            runtime.block_on(replica.run());
            return;
        }
        let ports = value("--ports").expect("--ports P,P,..");
        let driver = idempotency::Driver {
            ports: ports.split(',').filter_map(|p| p.parse().ok()).collect(),
            secs,
            seed: number("--seed").unwrap_or(0),
            timing,
        };
        let out = value("--out").expect("--out FILE");
        let mut out = BufWriter::new(std::fs::File::create(out).expect("history file"));
        runtime.block_on(driver.run(&mut out));
        out.flush().expect("history file");
        return;
    }
    if let Some(role @ ("worker" | "serve" | "drive")) = command {
        let locks =
            || Locks::from_args(value("--locks"), value("--sentinels"), value("--postgres"));
        let register_url = || value("--register").expect("--register URL");
        let secs = number("--secs").unwrap_or(10);
        let ttl = Duration::from_millis(number("--ttl-ms").unwrap_or(300));
        let out = value("--out").expect("--out FILE");
        let mut out = BufWriter::new(std::fs::File::create(out).expect("history file"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        match role {
            "worker" => runtime.block_on(
                worker::Worker {
                    process: number("--process").unwrap_or(0),
                    locks: locks(),
                    register_url: register_url(),
                    secs,
                    control: flag("--control"),
                    broken_lock: flag("--broken-lock"),
                    steady: flag("--steady"),
                    seed: number("--seed").unwrap_or(0),
                    ttl,
                }
                .run(&mut out),
            ),
            "serve" => runtime.block_on(
                http::Server {
                    locks: locks(),
                    register_url: register_url(),
                    port: number("--port").expect("--port") as u16,
                    secs,
                    broken_lock: flag("--broken-lock"),
                    ttl,
                }
                .run(&mut out),
            ),
            _ => runtime.block_on(
                http::Driver {
                    port: number("--port").expect("--port") as u16,
                    secs,
                    seed: number("--seed").unwrap_or(0),
                    ttl,
                }
                .run(&mut out),
            ),
        }
        out.flush().expect("history file");
        return;
    }
    match command {
        // Checks a history file again, as written by a run.
        Some("check") => {
            let path = args.get(1).expect("history check FILE");
            let file = std::fs::File::open(path).expect("the history file");
            let history: Vec<serde_json::Value> = std::io::BufReader::new(file)
                .lines()
                .map(|line| serde_json::from_str(&line.expect("a line")).expect("JSON"))
                .collect();
            let verdict = if history.iter().any(|v| v["op"] == "idem_config") {
                idem_verdict(idem_check::check(&history))
            } else {
                check::check(&history)
            };
            for violation in &verdict.violations {
                println!("violation: {violation}");
            }
            if let Some(gaps) = check::write_gaps_line(&history) {
                println!("{gaps}");
            }
            println!(
                "1 histories, {} operations, {} violations",
                verdict.operations,
                verdict.violations.len()
            );
            std::process::exit(i32::from(!verdict.violations.is_empty()));
        }
        Some("run") => {
            let control = flag("--control");
            let seed = number("--seed").unwrap_or_else(now_us);
            let quick = flag("--quick");
            // A rolling restart between the build at this path and this one.
            let upgrade = value("--upgrade-from").map(|from| Upgrade {
                from: from.into(),
                both_ways: flag("--both-ways"),
            });
            // Each history with its length.
            let modes: Vec<(Mode, u64)> = if control {
                vec![
                    (Mode::BrokenClient, 15),
                    (Mode::BrokenLock, 15),
                    (IDEM_BROKEN, 15),
                    (Mode::PostgresBroken, 15),
                ]
            } else if upgrade.is_some() {
                let secs = if quick { 40 } else { 120 };
                vec![(Mode::Single, secs), (Mode::Postgres, secs)]
            } else if flag("--postgres") {
                vec![(Mode::Postgres, if quick { 45 } else { 300 })]
            } else if flag("--idempotency") {
                if quick {
                    vec![(IDEM_SINGLE, 40), (IDEM_ONCE, 45)]
                } else {
                    [IDEM_SINGLE, IDEM_REPLICATED, IDEM_ONCE]
                        .map(|m| (m, 120))
                        .to_vec()
                }
            } else if flag("--sentinel") {
                let n = if quick { 1 } else { 2 };
                vec![(Mode::Replicated, if quick { 60 } else { 300 }); n]
            } else if quick {
                let lock = [Mode::Single, Mode::Single, Mode::Replicated].map(|m| (m, 50));
                let idem = [(IDEM_SINGLE, 40), (IDEM_ONCE, 45)];
                let postgres = (Mode::Postgres, 45);
                lock.into_iter().chain(idem).chain([postgres]).collect()
            } else {
                let lock = [
                    Mode::Single,
                    Mode::Single,
                    Mode::Replicated,
                    Mode::Single,
                    Mode::Postgres,
                ];
                let idem = [IDEM_SINGLE, IDEM_REPLICATED, IDEM_ONCE].map(|m| (m, 120));
                lock.map(|m| (m, 300)).into_iter().chain(idem).collect()
            };
            let mut operations = 0;
            let mut violations = 0;
            let mut clean = 0;
            for (h, &(mode, secs)) in modes.iter().enumerate() {
                // A shorter (or longer) history than the mode's, to look at one.
                let secs = number("--secs").unwrap_or(secs);
                let verdict = match mode {
                    Mode::Idempotent(variant) => {
                        idem_verdict(idem_run::run_one(seed + h as u64, secs, variant))
                    }
                    _ => run_one(seed + h as u64, secs, mode, upgrade.as_ref()),
                };
                operations += verdict.operations;
                violations += verdict.violations.len();
                clean += usize::from(verdict.violations.is_empty());
                for violation in verdict.violations.iter().take(5) {
                    println!("  violation: {violation}");
                }
            }
            let histories = modes.len();
            println!("{histories} histories, {operations} operations, {violations} violations");
            // Under `--control` every broken history must be caught.
            let failed = if control { clean > 0 } else { violations > 0 };
            std::process::exit(i32::from(failed));
        }
        _ => {
            eprintln!(
                "usage: history run [--quick] [--control] [--sentinel] [--idempotency] \
                 [--postgres] [--seed N] [--secs N] | history check FILE"
            );
            std::process::exit(2);
        }
    }
}

/// An idempotency history's verdict, as the lock histories' count theirs.
fn idem_verdict(verdict: idem_check::Verdict) -> check::Verdict {
    check::Verdict {
        operations: verdict.attempts + verdict.runs,
        faults: verdict.faults,
        violations: verdict.violations,
        ..check::Verdict::default()
    }
}

/// One history: the servers, the clients and the nemesis for `secs`, then the check.
fn run_one(seed: u64, secs: u64, mode: Mode, upgrade: Option<&Upgrade>) -> check::Verdict {
    let started = std::time::Instant::now();
    let dir =
        std::env::temp_dir().join(format!("tower-lease-history-{}-{seed}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a directory for the history");
    // The proxy and the sentinels' waits run here.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime for the proxy");
    let replicated = mode == Mode::Replicated;
    let ttl = match (replicated, upgrade) {
        (true, _) => REPLICATED_TTL,
        // No pause to excuse a lost lease: leases that a loaded machine's heartbeats keep.
        (false, Some(_)) => UPGRADE_TTL,
        (false, None) => TTL,
    };
    let mut store = match mode {
        Mode::Postgres | Mode::PostgresBroken => LockStore::postgres(&runtime),
        _ => LockStore::start(replicated, &dir, &runtime),
    };
    let register = server::RedisServer::start();
    let register_url = format!("redis://127.0.0.1:{}/", register.port());
    let locks = store.locks();
    let port = server::free_port().to_string();
    let exe = std::env::current_exe().expect("this program");
    let last = if replicated { STEADY } else { DRIVER };
    let end = now_us() + secs * 1_000_000;
    let mut rolling = upgrade.map(|u| Rolling::new(u.clone(), exe.clone(), now_us(), end));
    // Process `p` (a worker's number in its generation, with `upgrade`) on the build `exe`,
    // for `secs`, into `out`.
    let spawn = |exe: &Path, p: u64, secs: u64, out: &str| {
        let mut command = Command::new(exe);
        let role = match p {
            SERVER => "serve",
            DRIVER => "drive",
            _ => "worker",
        };
        command
            .arg(role)
            .args(["--process", &p.to_string()])
            .args(locks.to_args())
            .args(["--register", &register_url, "--port", &port])
            .args(["--secs", &secs.to_string()])
            .args(["--ttl-ms", &ttl.as_millis().to_string()])
            .args(["--seed", &(seed * 100 + p).to_string()])
            .args(["--out", &dir.join(out).to_string_lossy()])
            .stdin(Stdio::null());
        match mode {
            Mode::BrokenClient | Mode::PostgresBroken => {
                command.arg("--control");
            }
            Mode::BrokenLock => {
                command.arg("--broken-lock");
            }
            _ => {}
        }
        if p == STEADY {
            command.arg("--steady");
        }
        server::die_with_parent(&mut command);
        command.spawn().expect("a client process")
    };
    let mut clients: Vec<Child> = (0..=last)
        .map(|p| match &rolling {
            Some(rolling) if p < WORKERS => {
                spawn(rolling.exe(0), p, rolling.secs(p, 0), &format!("{p}.jsonl"))
            }
            // The layer's server is a replica of the previous build throughout: it starts
            // first, as the replicas of a deploy that begins.
            Some(rolling) if p == SERVER => spawn(rolling.exe(0), p, secs, &format!("{p}.jsonl")),
            _ => spawn(&exe, p, secs, &format!("{p}.jsonl")),
        })
        .collect();

    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut faults = Vec::new();
    match &mut rolling {
        None => {
            while now_us() + 1_500_000 < end {
                faults.extend(store.inject(&mut rng, &clients, ttl, &runtime));
            }
        }
        // No faults: each worker's next build starts as soon as the one before exits.
        Some(rolling) => {
            while now_us() < end {
                std::thread::sleep(Duration::from_millis(50));
                for (worker, generation) in rolling.due(&mut clients) {
                    let p = upgrade::process_number(worker, generation);
                    let out = format!("{worker}-{generation}.jsonl");
                    let next = spawn(
                        rolling.exe(generation),
                        p,
                        rolling.secs(worker, generation),
                        &out,
                    );
                    clients[worker as usize] = next;
                }
            }
        }
    }
    // A client that outlives its history by far is stuck (a replica that cannot connect
    // retries for ever): it is stopped, and counted.
    let mut stuck = Vec::new();
    let give_up = end + 30_000_000;
    for (p, client) in clients.iter_mut().enumerate() {
        if p as u64 == SERVER {
            continue;
        }
        while matches!(client.try_wait(), Ok(None)) && now_us() < give_up {
            std::thread::sleep(Duration::from_millis(100));
        }
        if matches!(client.try_wait(), Ok(None)) {
            let _ = client.kill();
            let _ = client.wait();
            stuck.push(format!(
                "client {p} was still running 30 s after its history's end"
            ));
        }
    }
    // The driver is done: the server writes what its handlers recorded and ends.
    let server = &mut clients[SERVER as usize];
    // SAFETY: a signal to our own child process.
    unsafe { libc::kill(server.id() as libc::pid_t, libc::SIGTERM) };
    let _ = server.wait();

    let mut history = faults;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("the history's directory")
        .filter_map(|entry| Some(entry.ok()?.path()))
        .filter(|path| path.extension().is_some_and(|e| e == "jsonl"))
        .filter(|path| !path.ends_with("history.jsonl"))
        .collect();
    files.sort();
    for path in files {
        let file = std::fs::File::open(path).expect("a client's history");
        for line in std::io::BufReader::new(file).lines() {
            let line = line.expect("a history line");
            history.push(serde_json::from_str(&line).expect("a JSON history line"));
        }
    }
    // What the register accepted, in its order, closes the history.
    for (name, log) in register_logs(register.port()) {
        for (fence, process) in log {
            let accepted = serde_json::json!({
                "op": "accepted", "name": name, "fence": fence, "process": process,
            });
            history.push(accepted);
        }
    }
    let path = dir.join("history.jsonl");
    write_history(&path, &history);
    let mut verdict = check::check(&history);
    verdict.violations.extend(stuck);
    if let Some(rolling) = &rolling {
        let since = rolling.first_restart.unwrap_or(u64::MAX);
        verdict
            .violations
            .extend(upgrade::failures(&history, since));
        verdict.violations.extend(rolling.unfinished());
    }
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for v in &history {
        if v["op"] == "fault" {
            *kinds.entry(v["kind"].as_str().unwrap_or("?")).or_default() += 1;
        }
    }
    println!(
        "history {seed} ({mode:?}, {} s): {} operations, {} faults {kinds:?}, {} violations, {} \
         stale writes refused by the register, {} overlaps after the store lost its data \
         (excused); {}",
        started.elapsed().as_secs(),
        verdict.operations,
        verdict.faults,
        verdict.violations.len(),
        verdict.stale_writes_refused,
        verdict.excused,
        path.display(),
    );
    if let Some(gaps) = check::write_gaps_line(&history) {
        println!("  {gaps}");
    }
    verdict
}

/// The register's logs, by name: (fence, process) in the order the register accepted them.
fn register_logs(port: u16) -> BTreeMap<String, Vec<(u64, u64)>> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("register URL");
    let mut conn = client.get_connection().expect("the register");
    let mut logs = BTreeMap::new();
    for name in worker::LOCK_NAMES.into_iter().chain([worker::RW_NAME]) {
        let entries: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("reg:{name}:log"))
            .arg(0)
            .arg(-1)
            .query(&mut conn)
            .expect("LRANGE");
        let log = entries
            .iter()
            .filter_map(|e| {
                let (fence, process) = e.split_once(':')?;
                Some((fence.parse().ok()?, process.parse().ok()?))
            })
            .collect();
        logs.insert(name.to_owned(), log);
    }
    logs
}

fn write_history(path: &Path, history: &[serde_json::Value]) {
    let mut out = BufWriter::new(std::fs::File::create(path).expect("the history file"));
    for value in history {
        writeln!(out, "{value}").expect("the history file");
    }
}
