//! A history checker with a nemesis, as Jepsen checks a lock: client processes take leases
//! through the public API (a fenced `Lock`, a fenced `RwLock`'s reads and writes, a `Semaphore`'s
//! permits, each kept with `keep_alive`) and the exclusive holders write to a fenced register in
//! a second Redis, while
//! faults are injected all along; every operation is recorded with its invoke and complete
//! times on one monotonic clock, and a checker decides afterwards whether the history is
//! possible under the lock's promises (see `check.rs`).
//!
//! ```text
//! cargo run --example history -- run [--quick] [--control] [--seed N]
//! cargo run --example history -- check <history.jsonl>
//! ```
//!
//! Faults: `SIGSTOP`/`SIGCONT` of a client for longer than its lease, `SIGKILL` and restart of
//! the lock store's redis-server with persistence (every write fsynced) and without it (its
//! data gone), `SCRIPT FLUSH`, and on the clients' way to the store (a proxy) delays, a
//! blackhole, replies dropped (the store acts, the client never learns) and cut connections. `--control` runs clients that are broken on purpose (no
//! heartbeat, no deadline check, unconditional writes): the checker must find violations there.
//! Each history is written to a JSON-lines file, whose path is printed; the last line printed is
//! `N histories, M operations, K violations`, and the exit status is non-zero when K > 0
//! (or, under `--control`, when K = 0).

use std::collections::BTreeMap;
use std::io::{BufRead, BufWriter, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rand::{Rng, SeedableRng};

mod check;
#[allow(dead_code, reason = "shared with the tests, which use more of it")]
#[path = "../../tests/support/proxy.rs"]
mod proxy;
mod record;
#[allow(dead_code, reason = "shared with the tests, which use more of it")]
#[path = "../../tests/support/server.rs"]
mod server;
mod worker;

use crate::proxy::{Fault, Proxy};
use crate::record::{fault, now_us};
use crate::server::RedisServer;

const WORKERS: u64 = 8;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |f: &str| args.iter().any(|a| a == f);
    let value = |f: &str| {
        args.iter()
            .position(|a| a == f)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    match args.first().map(String::as_str) {
        Some("worker") => {
            let worker = worker::Worker {
                process: value("--process").and_then(|v| v.parse().ok()).unwrap_or(0),
                locks_url: value("--locks").expect("--locks URL"),
                register_url: value("--register").expect("--register URL"),
                secs: value("--secs").and_then(|v| v.parse().ok()).unwrap_or(10),
                control: flag("--control"),
                seed: value("--seed").and_then(|v| v.parse().ok()).unwrap_or(0),
            };
            let out = value("--out").expect("--out FILE");
            let mut out = BufWriter::new(std::fs::File::create(out).expect("history file"));
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(worker.run(&mut out));
            out.flush().expect("history file");
        }
        // Checks a history file again, as written by a run.
        Some("check") => {
            let path = args.get(1).expect("history check FILE");
            let file = std::fs::File::open(path).expect("the history file");
            let history: Vec<serde_json::Value> = std::io::BufReader::new(file)
                .lines()
                .map(|line| serde_json::from_str(&line.expect("a line")).expect("JSON"))
                .collect();
            let verdict = check::check(&history);
            for violation in &verdict.violations {
                println!("violation: {violation}");
            }
            println!(
                "1 histories, {} operations, {} violations",
                verdict.operations,
                verdict.violations.len()
            );
            std::process::exit(i32::from(!verdict.violations.is_empty()));
        }
        Some("run") => {
            let quick = flag("--quick");
            let control = flag("--control");
            let seed = value("--seed")
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(now_us);
            let (histories, secs) = match (quick, control) {
                (_, true) => (1, 15),
                (true, false) => (3, 40),
                (false, false) => (4, 300),
            };
            let mut operations = 0;
            let mut violations = 0;
            for h in 0..histories {
                let verdict = run_one(seed + h, secs, control);
                operations += verdict.operations;
                violations += verdict.violations.len();
                for violation in verdict.violations.iter().take(5) {
                    println!("  violation: {violation}");
                }
            }
            println!("{histories} histories, {operations} operations, {violations} violations");
            let failed = if control {
                violations == 0
            } else {
                violations > 0
            };
            std::process::exit(i32::from(failed));
        }
        _ => {
            eprintln!("usage: history run [--quick] [--control] [--seed N] | history check FILE");
            std::process::exit(2);
        }
    }
}

/// One history: the servers, the clients and the nemesis for `secs`, then the check.
fn run_one(seed: u64, secs: u64, control: bool) -> check::Verdict {
    let dir =
        std::env::temp_dir().join(format!("tower-lease-history-{}-{seed}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a directory for the history");
    let aof = dir.join("aof");
    std::fs::create_dir_all(&aof).expect("a directory for the append-only file");
    let aof_dir = aof.to_string_lossy().into_owned();
    let mut locks = RedisServer::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--dir",
        &aof_dir,
    ]);
    let register = RedisServer::start();
    // The clients reach the lock store through a proxy that can delay, blackhole or cut.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime for the proxy");
    let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], locks.port()));
    let proxy = runtime.block_on(Proxy::start(upstream));
    let locks_url = format!("redis://{}/", proxy.addr());
    let register_url = format!("redis://127.0.0.1:{}/", register.port());
    let exe = std::env::current_exe().expect("this program");
    let mut clients: Vec<Child> = (0..WORKERS)
        .map(|p| {
            let mut command = Command::new(&exe);
            command
                .arg("worker")
                .args(["--process", &p.to_string()])
                .args(["--locks", &locks_url, "--register", &register_url])
                .args(["--secs", &secs.to_string()])
                .args(["--seed", &(seed * 100 + p).to_string()])
                .args(["--out", &dir.join(format!("{p}.jsonl")).to_string_lossy()])
                .stdin(Stdio::null());
            if control {
                command.arg("--control");
            }
            server::die_with_parent(&mut command);
            command.spawn().expect("a client process")
        })
        .collect();

    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut faults = Vec::new();
    let end = now_us() + secs * 1_000_000;
    while now_us() + 1_500_000 < end {
        std::thread::sleep(Duration::from_millis(rng.random_range(300..900)));
        let at = now_us();
        match rng.random_range(0..13) {
            // A client frozen for longer than its lease.
            0..=3 => {
                let client = &clients[rng.random_range(0..clients.len())];
                let pid = client.id() as libc::pid_t;
                let pause = rng.random_range(400..900);
                // SAFETY: signals to our own child processes.
                unsafe { libc::kill(pid, libc::SIGSTOP) };
                std::thread::sleep(Duration::from_millis(pause));
                unsafe { libc::kill(pid, libc::SIGCONT) };
                faults.push(fault("pause", at, now_us(), false));
            }
            // The store killed and restarted, with its data.
            4 | 5 => {
                locks.restart();
                faults.push(fault("restart", at, now_us(), false));
            }
            // The store killed and restarted without its data.
            6 => {
                locks.stop();
                let _ = std::fs::remove_dir_all(&aof);
                std::fs::create_dir_all(&aof).expect("a directory for the append-only file");
                locks.restart();
                faults.push(fault("restart_empty", at, now_us(), true));
            }
            // The network between the clients and the store: slow, silent, one-way, or cut.
            8..=11 => {
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
                faults.push(fault(kind, at, now_us(), false));
            }
            // Every cached script forgotten.
            _ => {
                let _ = Command::new("redis-cli")
                    .args(["-p", &locks.port().to_string(), "SCRIPT", "FLUSH"])
                    .stdout(Stdio::null())
                    .status();
                faults.push(fault("script_flush", at, now_us(), false));
            }
        }
    }
    for client in &mut clients {
        let _ = client.wait();
    }

    let mut history = faults;
    for p in 0..WORKERS {
        let file = std::fs::File::open(dir.join(format!("{p}.jsonl"))).expect("a client's history");
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
    let verdict = check::check(&history);
    println!(
        "history {seed}{}: {} operations, {} faults, {} violations, {} stale writes refused by \
         the register, {} overlaps after the store lost its data (excused); {}",
        if control { " (control)" } else { "" },
        verdict.operations,
        verdict.faults,
        verdict.violations.len(),
        verdict.stale_writes_refused,
        verdict.excused,
        path.display(),
    );
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
