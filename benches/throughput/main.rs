//! Lock/release cycles per second: tower-lease side by side with the hand-written minimum and
//! with `rslock`, on one `redis-server`, at 1 and 64 concurrent tasks.
//!
//! ```text
//! cargo bench --all-features --bench throughput
//! BENCH_ROUNDS=15 BENCH_ROUND_MS=1000 cargo bench --all-features --bench throughput
//! ```
//!
//! `Lock` is measured on the store an application builds, `RedisStore::connect` (a
//! `ConnectionManager`, release notifications), and held to the minimum on a
//! `ConnectionManager` set up alike; the pair on one `MultiplexedConnection` (`RedisStore::new`)
//! is shown beside it. A whole round at each concurrency warms every variant up first, and is
//! not counted.
//!
//! Options (environment): `BENCH_ROUNDS`, `BENCH_ROUND_MS`, `BENCH_ONLY=a,b` (variants whose
//! names hold one of these), `BENCH_TASKS=64` (one concurrency only), `BENCH_CURRENT_THREAD=1`
//! (a current-thread runtime), `BENCH_DIAG=1` (allocation counts, diagnostic variants, and the
//! number of cycles each variant ran, for instruction counts per cycle from callgrind).
//!
//! Every variant runs once per round, in an order that rotates from round to round, so drift on a
//! shared machine hits all of them alike; the table shows the median of the rounds and ratios.
//! Every cycle checks its own result: a lock that is not acquired or not released panics.

mod variants;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use variants::{
    CONCURRENCY, LOCK_REDIS, MINIMUM, MINIMUM_MULTIPLEXED, NATIVE_MINIMUM, REFUSED_HAND,
    REFUSED_LOCK, RSLOCK, TTL, variants,
};

use tower_lease_harness::Endpoint;
use tower_lease_harness::bench::{self, Op, Redis, Settings, median, quantile_us};

/// Counts allocations when `BENCH_DIAG` is set (an allocation count per cycle is steady where
/// timings are not); otherwise it only forwards, so the timings are not disturbed.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: the caller upholds `alloc`'s contract, which is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn main() {
    // Rounds of 150 ms left the ratios within rounds spread from 0.5 to 1.6 on a loaded
    // 2-core machine, and their median anywhere in it; 400 ms rounds hold still enough.
    let settings = Settings::from_env(15, 400);
    COUNTING.store(std::env::var_os("BENCH_DIAG").is_some(), Ordering::Relaxed);
    let redis = Redis::start();
    // BENCH_CURRENT_THREAD=1: one thread for the client, for steadier instruction counts.
    let mut runtime = match std::env::var_os("BENCH_CURRENT_THREAD") {
        Some(_) => tokio::runtime::Builder::new_current_thread(),
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = runtime.enable_all().build().unwrap();
    runtime.block_on(bench(&redis, settings));
}

#[derive(Default)]
struct Row {
    /// One entry per round, in round order, as are `p50s`, `client_cpu` and `server_cpu`.
    rates: Vec<f64>,
    p50s: Vec<f64>,
    latencies: Vec<u64>,
    client_cpu: Vec<f64>,
    server_cpu: Vec<f64>,
    allocations: Vec<f64>,
}

/// Runs `op` and answers the CPU time this process and the redis-server used per operation,
/// in µs (NaN when the server is not ours): steadier than throughput on a busy machine.
async fn measured(
    redis: &Redis,
    op: &Op,
    tasks: usize,
    length: Duration,
) -> (bench::Run, f64, f64, f64) {
    let (client, server) = (bench::cpu_time(), redis.pid().and_then(bench::cpu_time_of));
    let allocations = ALLOCATIONS.load(Ordering::Relaxed);
    let run = bench::run(op, tasks, length).await;
    let allocations = (ALLOCATIONS.load(Ordering::Relaxed) - allocations) as f64 / run.ops as f64;
    let per_op = |d: Duration| d.as_secs_f64() * 1e6 / run.ops as f64;
    let client = per_op(bench::cpu_time() - client);
    let server = match (redis.pid().and_then(bench::cpu_time_of), server) {
        (Some(after), Some(before)) => per_op(after - before),
        _ => f64::NAN,
    };
    (run, client, server, allocations)
}

async fn bench(redis: &Redis, settings: Settings) {
    let variants = variants(redis).await;
    // BENCH_ONLY=a,b runs only the variants whose names hold one of these, for profiling.
    let variants: Vec<_> = match std::env::var("BENCH_ONLY") {
        Ok(only) => variants
            .into_iter()
            .filter(|(name, _)| only.split(',').any(|part| name.contains(part)))
            .collect(),
        Err(_) => variants,
    };
    // Every cycle each variant ran, warm-up included: for instruction counts per cycle from
    // two callgrind runs of different lengths.
    let mut total_ops = vec![0u64; variants.len()];
    // BENCH_TASKS=64 runs only that concurrency.
    let concurrency: Vec<usize> = match std::env::var("BENCH_TASKS") {
        Ok(tasks) => tasks
            .split(',')
            .map(|n| n.parse().expect("BENCH_TASKS holds task counts"))
            .filter(|n| CONCURRENCY.contains(n))
            .collect(),
        Err(_) => CONCURRENCY.to_vec(),
    };
    // Warm up with one whole round at every concurrency, not counted: connections, loaded
    // scripts, allocator pools, the runtime's worker threads and the store's timer tasks are
    // then in the state the counted rounds find them in, whichever variant runs first.
    for &tasks in &concurrency {
        for (v, (_, op)) in variants.iter().enumerate() {
            total_ops[v] += bench::run(op, tasks, settings.round).await.ops;
        }
    }
    let mut results: HashMap<(usize, usize), Row> = HashMap::new();
    for &tasks in &concurrency {
        for round in 0..settings.rounds {
            for k in 0..variants.len() {
                // Rotate the order from round to round.
                let v = (k + round) % variants.len();
                let (mut run, client, server, allocations) =
                    measured(redis, &variants[v].1, tasks, settings.round).await;
                total_ops[v] += run.ops;
                let row = results.entry((tasks, v)).or_default();
                row.rates.push(run.per_second());
                row.p50s.push(quantile_us(&mut run.latencies, 0.5));
                row.latencies.extend(run.latencies);
                row.client_cpu.push(client);
                row.server_cpu.push(server);
                row.allocations.push(allocations);
            }
        }
    }
    variants::release_held(redis).await;
    assert_no_keys_left(redis).await;
    if std::env::var_os("BENCH_COMMANDSTATS").is_some() {
        print_commandstats(redis).await;
    }

    println!(
        "\nlock/release cycles, {} rounds of {:?} per variant, TTL {:?}",
        settings.rounds, settings.round, TTL
    );
    println!("machine: {}", bench::machine());
    println!(
        "cycles/s and CPU per cycle: medians of the rounds; ratios: medians of the ratios within \
         each round; p50/p99: latency of all cycles at 1 task\n"
    );
    println!(
        "| tasks | variant | cycles/s | × minimum | × rslock | p50 µs | p99 µs | client CPU µs | server CPU µs | allocations |"
    );
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let index = |name: &str| variants.iter().position(|(n, _)| *n == name);
    // The median over rounds of `of(a) / of(b)` in the same round; NaN when one of them was
    // left out by BENCH_ONLY.
    // The ratios of `of(a) / of(b)` within each round, sorted; empty when one of them was left
    // out by BENCH_ONLY.
    let ratios = |tasks: usize, a: &str, b: &str, of: fn(&Row) -> &[f64]| {
        let (Some(a), Some(b)) = (index(a), index(b)) else {
            return Vec::new();
        };
        let (Some(a), Some(b)) = (results.get(&(tasks, a)), results.get(&(tasks, b))) else {
            return Vec::new();
        };
        let (a, b) = (of(a), of(b));
        let mut ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| a / b).collect();
        ratios.sort_by(f64::total_cmp);
        ratios
    };
    // Their median; NaN when one of them was left out.
    let paired = |tasks: usize, a: &str, b: &str, of: fn(&Row) -> &[f64]| {
        let mut within = ratios(tasks, a, b, of);
        if within.is_empty() {
            return f64::NAN;
        }
        median(&mut within)
    };
    // The median of a row's measure at `tasks`.
    let of_row = |tasks: usize, name: &str, of: fn(&Row) -> &[f64]| {
        index(name)
            .and_then(|v| results.get(&(tasks, v)))
            .map_or(f64::NAN, |row| median(&mut of(row).to_vec()))
    };
    // A throughput goal at 64 tasks: the median ratio with the spread of the rounds' ratios,
    // and for a missed one where the time goes (CPU per cycle of the server and the client).
    let goal = |what: &str, a: &str, b: &str, least: f64| {
        let within = ratios(64, a, b, rates);
        if within.is_empty() {
            return;
        }
        let ratio = median(&mut within.clone());
        let quartile = |q: f64| within[((within.len() - 1) as f64 * q).round() as usize];
        println!(
            "- {what}: {ratio:.3} (rounds' p25–p75 {:.3}–{:.3}) {}",
            quartile(0.25),
            quartile(0.75),
            if ratio >= least { "met" } else { "MISSED" }
        );
        if ratio < least {
            println!(
                "  where the time goes: server CPU {:.1} µs per cycle against {:.1}, client CPU \
                 {:.1} µs against {:.1}",
                of_row(64, a, server_cpu),
                of_row(64, b, server_cpu),
                of_row(64, a, client_cpu),
                of_row(64, b, client_cpu),
            );
        }
    };
    for &tasks in &concurrency {
        for (v, (name, _)) in variants.iter().enumerate() {
            let row = &results[&(tasks, v)];
            let rate = median(&mut row.rates.clone());
            let client = median(&mut row.client_cpu.clone());
            let server = median(&mut row.server_cpu.clone());
            let allocations = match median(&mut row.allocations.clone()) {
                n if COUNTING.load(Ordering::Relaxed) => format!("{n:.1}"),
                _ => "".into(),
            };
            let (p50, p99) = if tasks == 1 {
                let mut latencies = row.latencies.clone();
                (
                    format!("{:.1}", quantile_us(&mut latencies, 0.5)),
                    format!("{:.1}", quantile_us(&mut latencies, 0.99)),
                )
            } else {
                ("".into(), "".into())
            };
            println!(
                "| {tasks} | {name} | {rate:.0} | {:.2} | {:.2} | {p50} | {p99} | {client:.1} | {server:.1} | {allocations} |",
                paired(tasks, name, MINIMUM, rates),
                paired(tasks, name, RSLOCK, rates),
            );
        }
    }

    if COUNTING.load(Ordering::Relaxed) {
        println!("\ncycles run in all, warm-up included:");
        for ((name, _), ops) in variants.iter().zip(&total_ops) {
            println!("- {name}: {ops}");
        }
    }

    println!("\ntargets:");
    let lock = LOCK_REDIS;
    let vs_min = paired(64, lock, MINIMUM, rates);
    let native = index(NATIVE_MINIMUM).is_some();
    // What `Lock` is held to: the native pair where the server has it, the Lua one otherwise.
    let floor = if native { NATIVE_MINIMUM } else { MINIMUM };
    let cpu = paired(64, lock, floor, client_cpu);
    let latency = paired(1, lock, floor, p50s);
    if native {
        // With native compare-and-set the store sends no script: it is held to the native
        // pair, and the Lua minimum is only shown.
        goal(
            "Lock cycle at 64 tasks ≥ 1.0× the native minimum (SET NX PX + DELIFEQ)",
            lock,
            NATIVE_MINIMUM,
            1.0,
        );
        println!("  (and {vs_min:.3}× the Lua minimum)");
    } else {
        goal(
            "Lock cycle at 64 tasks ≥ 1.0× the minimum (SET NX PX + EVALSHA)",
            lock,
            MINIMUM,
            1.0,
        );
    }
    let multiplexed = paired(
        64,
        "tower-lease Lock (Redis, MultiplexedConnection)",
        MINIMUM_MULTIPLEXED,
        rates,
    );
    if !multiplexed.is_nan() {
        println!(
            "  (on one MultiplexedConnection, RedisStore::new beside the Lua minimum: {multiplexed:.3})"
        );
    }
    target(
        "Lock client CPU per cycle at 64 tasks ≤ 1.1× the minimum's",
        cpu,
        cpu <= 1.1,
    );
    target(
        "Lock p50 latency at 1 task ≤ 1.05× the minimum's",
        latency,
        latency <= 1.05,
    );
    for store in ["Redis", "memory"] {
        let bare = format!("bare request + Lock cycle ({store})");
        let ratio = paired(64, &format!("LockLayer request ({store})"), &bare, rates);
        let what =
            format!("LockLayer request ≥ 0.95× a bare request + Lock cycle, 64 tasks, {store}");
        target(&what, ratio, ratio >= 0.95);
    }
    let routed = paired(
        64,
        "LockLayer request as axum routes it (memory)",
        "bare request as axum routes it + Lock cycle (memory)",
        rates,
    );
    for store in ["Redis", "memory"] {
        let waits = paired(
            64,
            &format!("LockLayer request to a waiting handler ({store})"),
            &format!("bare request to a waiting handler + Lock cycle ({store})"),
            rates,
        );
        if !waits.is_nan() {
            println!("  (the same on {store} with a handler that waits once: {waits:.3})");
        }
    }
    if !routed.is_nan() {
        println!(
            "  (the same on memory with requests as axum's router hands them, extensions already held: {routed:.3})"
        );
    }
    // The other kinds against the same minimum as `Lock`.
    for cycle in [
        "RwLock read (Redis)",
        "RwLock write (Redis)",
        "Semaphore permit (Redis)",
    ] {
        goal(
            &format!("{cycle} at 64 tasks ≥ 0.8× the Lock minimum"),
            cycle,
            floor,
            0.8,
        );
    }
    let refused = paired(64, REFUSED_LOCK, REFUSED_HAND, rates);
    // Not a target here (the target is over HTTP, in the `http` bench): the refused path's own cost.
    if !refused.is_nan() {
        println!("  (refused try_lock at 64 tasks: {refused:.3}× a refused hand-written SET NX)");
    }
}

fn client_cpu(row: &Row) -> &[f64] {
    &row.client_cpu
}

fn server_cpu(row: &Row) -> &[f64] {
    &row.server_cpu
}

fn rates(row: &Row) -> &[f64] {
    &row.rates
}

fn p50s(row: &Row) -> &[f64] {
    &row.p50s
}

fn target(what: &str, ratio: f64, met: bool) {
    if ratio.is_nan() {
        return;
    }
    println!(
        "- {what}: {ratio:.3} {}",
        if met { "met" } else { "MISSED" }
    );
}

/// Where the server's time went (`BENCH_COMMANDSTATS=1`, best with `BENCH_ONLY` naming one
/// variant): calls and µs per call of every command it ran, those inside scripts included.
async fn print_commandstats(redis: &Redis) {
    let mut conn = redis.connection().await;
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    println!("\nserver commands (INFO commandstats), warm-up included:");
    for line in stats.lines().filter(|l| l.starts_with("cmdstat_")) {
        let field = |name: &str| {
            line.split(&format!("{name}="))
                .nth(1)
                .and_then(|rest| rest.split(',').next())
                .unwrap_or("?")
                .to_owned()
        };
        let command = line
            .trim_start_matches("cmdstat_")
            .split(':')
            .next()
            .unwrap_or("?");
        println!(
            "- {command}: {} calls, {} µs per call",
            field("calls"),
            field("usec_per_call")
        );
    }
}

/// Every cycle released what it took: nothing of the benchmark may be left in Redis.
async fn assert_no_keys_left(redis: &Redis) {
    let mut conn = redis.connection().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("tlbench*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.is_empty(), "the benchmark left keys behind: {keys:?}");
}
