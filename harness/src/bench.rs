//! What the benchmarks share: a `redis-server` of their own (feature `redis`), interleaved
//! rounds, medians, and the HTTP benchmarks' load generator ([`drive`]).
//!
//! The machine these run on is shared and noisy, so every benchmark runs its variants in
//! alternating rounds (drift then hits all of them alike) and reports medians and ratios, not
//! single absolute numbers.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
#[cfg(feature = "redis")]
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Empty};

use crate::http::Sender;
#[cfg(feature = "redis")]
use crate::server::{Endpoint, RedisServer, server_binary};

/// A boxed future, so that variants of different types can sit in one list.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

#[cfg(feature = "redis")]
/// Where the benchmark's Redis is: a [`RedisServer`] it started (killed on drop), or
/// `REDIS_URL`.
#[derive(Debug)]
pub struct Redis {
    server: Option<RedisServer>,
    url: String,
}

#[cfg(feature = "redis")]
impl Redis {
    /// `REDIS_URL` when set, otherwise a fresh `redis-server` on a free loopback port.
    pub fn start() -> Self {
        if let Ok(url) = std::env::var("REDIS_URL") {
            return Redis { server: None, url };
        }
        Self::start_with(&[])
    }

    /// A fresh `redis-server` on a free loopback port with extra arguments (`--replicaof …`),
    /// whatever `REDIS_URL` says.
    pub fn start_with(args: &[&str]) -> Self {
        let server = RedisServer::start_with(args);
        Redis {
            url: server.url(),
            server: Some(server),
        }
    }

    /// The port in the server's URL.
    pub fn port(&self) -> u16 {
        let authority = self.url.trim_end_matches('/').rsplit(':').next();
        authority
            .and_then(|p| p.parse().ok())
            .expect("a port in the Redis URL")
    }

    /// The OS process id of the server this benchmark started.
    pub fn pid(&self) -> Option<u32> {
        self.server.as_ref().and_then(RedisServer::pid)
    }

    /// A `ConnectionManager` with the settings `RedisStore::connect` gives its own (reconnect
    /// backoff 10–100 ms, two retries, response and connection timeouts of 1 s): the
    /// connection a minimum measured beside the store's own goes through.
    pub async fn managed_connection(&self) -> redis::aio::ConnectionManager {
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100))
            .set_number_of_retries(2)
            .set_response_timeout(Some(Duration::from_secs(1)))
            .set_connection_timeout(Some(Duration::from_secs(1)));
        redis::aio::ConnectionManager::new_with_config(self.client(), config)
            .await
            .expect("a ConnectionManager")
    }
}

#[cfg(feature = "redis")]
impl Endpoint for Redis {
    fn url(&self) -> String {
        self.url.clone()
    }
}

/// How long to measure: `BENCH_ROUNDS` rounds (default `rounds`) of `BENCH_ROUND_MS` per variant
/// (default `round_ms`).
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub rounds: usize,
    pub round: Duration,
}

impl Settings {
    pub fn from_env(rounds: usize, round_ms: u64) -> Self {
        let var = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .map(|v| {
                    v.parse()
                        .unwrap_or_else(|_| panic!("{name} must be a whole number"))
                })
                .unwrap_or(default)
        };
        Settings {
            rounds: var("BENCH_ROUNDS", rounds as u64).max(1) as usize,
            round: Duration::from_millis(var("BENCH_ROUND_MS", round_ms).max(10)),
        }
    }
}

/// One operation a benchmark repeats: called with (task index, iteration), it must panic
/// when the operation did not do what it is measured for.
pub type Op = Arc<dyn Fn(usize, u64) -> BoxFuture<()> + Send + Sync>;

/// Builds an [`Op`] from an async closure.
pub fn op<F, Fut>(f: F) -> Op
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    Arc::new(move |task, i| Box::pin(f(task, i)))
}

/// The hand-written minimum's acquisition, `SET key token NX PX ttl`: the command every
/// benchmark's baseline lock sends.
#[cfg(feature = "redis")]
pub fn set_nx_px(key: &str, token: &[u8], ttl: Duration) -> redis::Cmd {
    let mut set = redis::cmd("SET");
    set.arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(ttl.as_millis() as u64);
    set
}

#[cfg(feature = "redis")]
/// A benchmark's `main` on a fresh `redis-server` (or `REDIS_URL`): `bench` runs with it and
/// the [`Settings`] (`rounds` of `round_ms` unless the environment says otherwise) on a
/// multi-threaded runtime.
pub fn run_on_redis<F, Fut>(rounds: usize, round_ms: u64, bench: F)
where
    F: FnOnce(Redis, Settings) -> Fut,
    Fut: Future<Output = ()>,
{
    let settings = Settings::from_env(rounds, round_ms);
    let redis = Redis::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(bench(redis, settings));
}

/// What one timed run of one variant did.
#[derive(Clone, Debug, Default)]
pub struct Run {
    pub ops: u64,
    pub elapsed: Duration,
    /// Per-operation latencies in nanoseconds (only recorded with one task).
    pub latencies: Vec<u64>,
}

impl Run {
    pub fn per_second(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }
}

/// Runs `op` from `tasks` concurrent tasks until `length` has passed.
pub async fn run(op: &Op, tasks: usize, length: Duration) -> Run {
    let start = Instant::now();
    let deadline = start + length;
    let record = tasks == 1;
    let workers: Vec<_> = (0..tasks)
        .map(|task| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut ops = 0u64;
                let mut latencies = Vec::new();
                loop {
                    let began = Instant::now();
                    op(task, ops).await;
                    ops += 1;
                    let now = Instant::now();
                    if record {
                        latencies.push((now - began).as_nanos() as u64);
                    }
                    if now >= deadline {
                        return (ops, latencies);
                    }
                }
            })
        })
        .collect();
    let mut total = Run::default();
    for worker in workers {
        let (ops, latencies) = worker.await.expect("a benchmark task panicked");
        total.ops += ops;
        total.latencies.extend(latencies);
    }
    total.elapsed = start.elapsed();
    total
}

/// What [`drive`] did: the responses, by status, and how long it took.
#[derive(Clone, Debug, Default)]
pub struct Driven {
    pub by_status: BTreeMap<StatusCode, u64>,
    pub elapsed: Duration,
}

impl Driven {
    /// How many responses came back.
    pub fn responses(&self) -> u64 {
        self.by_status.values().sum()
    }

    /// How many responses had `status`.
    pub fn count(&self, status: StatusCode) -> u64 {
        self.by_status.get(&status).copied().unwrap_or(0)
    }

    pub fn per_second(&self) -> f64 {
        self.responses() as f64 / self.elapsed.as_secs_f64()
    }
}

/// The HTTP benchmarks' load generator: each keep-alive connection of `senders` on a task of
/// its own, one request at a time, the next once the whole body of the last came back, until
/// `length` has passed. `request(connection)` makes each request (path, `Host`, headers);
/// `check(connection, head)` sees each response's head and panics at one the benchmark does not
/// expect. The connections go back into `senders` for the next round.
pub async fn drive<Q, C>(
    senders: &mut Vec<Sender>,
    length: Duration,
    request: Q,
    check: C,
) -> Driven
where
    Q: Fn(usize) -> http::Request<Empty<Bytes>> + Send + Sync + 'static,
    C: Fn(usize, &http::response::Parts) + Send + Sync + 'static,
{
    let start = Instant::now();
    let deadline = start + length;
    let (request, check) = (Arc::new(request), Arc::new(check));
    let mut workers = Vec::with_capacity(senders.len());
    for (connection, mut sender) in senders.drain(..).enumerate() {
        let (request, check) = (request.clone(), check.clone());
        workers.push(tokio::spawn(async move {
            let mut by_status: BTreeMap<StatusCode, u64> = BTreeMap::new();
            while Instant::now() < deadline {
                sender.ready().await.expect("connection closed");
                let response = sender
                    .send_request(request(connection))
                    .await
                    .expect("request failed");
                let (head, body) = response.into_parts();
                check(connection, &head);
                body.collect().await.expect("body failed");
                *by_status.entry(head.status).or_default() += 1;
            }
            (sender, by_status)
        }));
    }
    let mut driven = Driven::default();
    for worker in workers {
        let (sender, by_status) = worker.await.expect("a load task panicked");
        senders.push(sender);
        for (status, count) in by_status {
            *driven.by_status.entry(status).or_default() += count;
        }
    }
    driven.elapsed = start.elapsed();
    driven
}

/// The median of `values` (which must not be empty).
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

/// Prints a paired goal: the median of the ratios taken within each round, with their
/// spread (the rounds' p25–p75), and `met` or `MISSED`; answers whether it was met.
pub fn goal(what: &str, within: &[f64], least: f64) -> bool {
    if within.is_empty() {
        return true;
    }
    let mut within = within.to_vec();
    let ratio = median(&mut within);
    let quartile = |q: f64| within[((within.len() - 1) as f64 * q).round() as usize];
    let met = ratio >= least;
    println!(
        "- {what}: {ratio:.3} (rounds' p25–p75 {:.3}–{:.3}) {}",
        quartile(0.25),
        quartile(0.75),
        if met { "met" } else { "MISSED" }
    );
    met
}

/// The `q` quantile (0..=1) of `values` (nanoseconds), in microseconds.
pub fn quantile_us(values: &mut [u64], q: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_unstable();
    let index = ((values.len() - 1) as f64 * q).round() as usize;
    values[index] as f64 / 1000.0
}

/// This process's CPU time (user + system) so far.
pub fn cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a whole rusage into the pointer it is given.
    let usage = unsafe {
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()), 0);
        usage.assume_init()
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// CPU time (user + system) of another process, from `/proc/<pid>/stat`.
pub fn cpu_time_of(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(Duration::from_nanos(ticks * 1_000_000_000 / hz))
}

/// This process's resident memory, in bytes.
pub fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm");
    // SAFETY: sysconf only reads a configuration value.
    pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
}

#[cfg(feature = "redis")]
/// One line about the machine for the report: cores, CPU model, kernel, redis-server version.
pub fn machine() -> String {
    let binary = server_binary();
    let redis = Command::new(&binary)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|v| {
            v.split_whitespace()
                .find_map(|w| w.strip_prefix("v="))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "?".into());
    let name = binary.rsplit('/').next().unwrap_or("redis-server");
    format!("{}, {name} {redis}", cores())
}

/// The cores this process may use and the CPU model: `2 cores (AMD EPYC …)`.
pub fn cores() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name").and_then(|r| r.split_once(':')))
        .map(|(_, m)| m.trim().to_owned())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    format!("{cores} cores ({model})")
}

/// The load averages over 1, 5 and 15 minutes (`/proc/loadavg`).
pub fn load_average() -> String {
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    loadavg
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs a future that never waits (the memory store's are all ready at once) to completion.
pub fn ready<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    match future
        .as_mut()
        .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
    {
        std::task::Poll::Ready(output) => output,
        std::task::Poll::Pending => panic!("the memory store's future was not ready at once"),
    }
}

#[cfg(feature = "redis")]
/// Calls so far of the commands `counted` picks by name (`evalsha`, `set`, …), from
/// `INFO commandstats`.
pub async fn command_calls(
    conn: &mut redis::aio::MultiplexedConnection,
    counted: impl Fn(&str) -> bool,
) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    info.lines()
        .filter_map(|line| line.strip_prefix("cmdstat_")?.split_once(':'))
        .filter(|(command, _)| counted(command))
        .filter_map(|(_, stats)| {
            stats
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}
