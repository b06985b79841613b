//! The heartbeat at scale: 10,000 requests hold leases through [`LockLayer`] at once, with a 3 s
//! TTL, for 10 s. Reports the extends per second they send, the CPU time this process used
//! meanwhile (the heartbeats, as nothing else runs), the memory per held lease, and how many
//! leases were lost (must be 0).
//!
//! A second phase holds as many [`Held`](tower_lease::Held) leases (`keep_alive()`), kept
//! by the store's heartbeat with no task of their own.
//!
//! For comparison, a third phase holds as many [`LockToken`](tower_lease::LockToken)s, each
//! extended every TTL/3 by a task of its own: the floor for one task and one round trip per
//! lease.
//!
//! ```text
//! cargo bench --all-features --bench heartbeat
//! HEARTBEAT_LEASES=50000 HEARTBEAT_SECS=30 cargo bench --all-features --bench heartbeat
//! ```

mod alloc;
mod memory;
mod phases;
mod probe;

use std::time::Duration;

use memory::{Arrival, Memory, Stack};
use phases::{TTL, batched, held_jobs, plain_tokens, through_layer};
use probe::Stats;

use tower_lease_harness::bench::{self, Redis};

#[global_allocator]
static ALLOCATOR: alloc::Counting = alloc::Counting;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |v| v.parse().expect("a whole number"))
}

fn main() {
    let leases = env("HEARTBEAT_LEASES", 10_000) as usize;
    let hold = Duration::from_secs(env("HEARTBEAT_SECS", 10));
    let redis = Redis::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if let Some((stack, arrival)) = memory::requested() {
        runtime.block_on(memory::child(&redis, leases, stack, arrival));
        return;
    }
    runtime.block_on(bench(&redis, leases, hold));
}

async fn bench(redis: &Redis, leases: usize, hold: Duration) {
    let layer = through_layer(redis, leases, hold).await;
    let jobs = held_jobs(redis, leases, hold).await;
    let tokens = plain_tokens(redis, leases, hold).await;
    let batched = batched(redis, leases, hold).await;
    let ways = [
        (Stack::Layer, Arrival::AllAtOnce),
        (Stack::Bare, Arrival::AllAtOnce),
        (Stack::Layer, Arrival::InWaves),
        (Stack::Bare, Arrival::InWaves),
    ];
    let [layer_once, bare_once, layer_waves, bare_waves] =
        ways.map(|(stack, arrival)| memory::measure(redis, leases, stack, arrival));

    println!("\n{leases} leases held at once, TTL {TTL:?}, extended every TTL/3, for {hold:?}");
    println!("machine: {}\n", bench::machine());
    println!(
        "| measure | LockLayer requests | Held (keep_alive) | plain tokens, a task each | by hand, batched (floor) |"
    );
    println!("|---|---:|---:|---:|---:|");
    let row = |what: &str, f: &dyn Fn(&Stats) -> String| {
        println!(
            "| {what} | {} | {} | {} | {} |",
            f(&layer),
            f(&jobs),
            f(&tokens),
            f(&batched)
        );
    };
    row("all acquired in", &|s| format!("{:.2?}", s.acquired_in));
    row("extends per second", &|s| {
        format!("{:.0}", s.extends_per_second)
    });
    row("this process's CPU, % of one core", &|s| {
        format!("{:.2} %", s.core_share() * 100.0)
    });
    row("client CPU per extend", &|s| {
        let extends = s.extends_per_second * s.window.as_secs_f64();
        format!("{:.1} µs", s.cpu.as_secs_f64() * 1e6 / extends)
    });
    row("redis-server CPU, % of one core", &|s| match s.server_cpu {
        Some(cpu) => format!(
            "{:.2} %",
            cpu.as_secs_f64() / s.window.as_secs_f64() * 100.0
        ),
        None => "n/a".into(),
    });
    row("heap per held lease (all at once)", &|s| {
        format!("{:.0} B", s.heap_per_lease)
    });
    row("peak heap per lease while acquiring", &|s| {
        format!("{:.0} B", s.peak_heap_per_lease)
    });
    row("redis-server memory per lease", &|s| {
        format!("{:.0} B", s.server_memory_per_lease)
    });
    row("leases lost", &|s| s.lost.to_string());

    println!("\nmemory per held request, each way in a fresh process:\n");
    println!(
        "| arrival | measure | LockLayer | bare requests (the benchmark's) | the layer's own |"
    );
    println!("|---|---|---:|---:|---:|");
    let share = |what: &str, layer: &Memory, bare: &Memory| {
        for (measure, f) in [
            ("heap", (|m: &Memory| m.heap) as fn(&Memory) -> f64),
            ("peak heap", |m| m.peak_heap),
            ("resident", |m| m.resident),
        ] {
            let (l, b) = (f(layer), f(bare));
            println!(
                "| {what} | {measure} | {l:.0} B | {b:.0} B | {:.0} B |",
                l - b
            );
        }
    };
    share("all at once", &layer_once, &bare_once);
    share("64 at a time", &layer_waves, &bare_waves);
    println!("\nheap blocks alive per held request, by size:");
    println!("- LockLayer, all at once: {}", layer_once.blocks);
    println!("- bare, all at once: {}", bare_once.blocks);
    println!("- plain tokens: {}", alloc::describe(&tokens.blocks));

    let check = |met: bool| if met { "met" } else { "MISSED" };
    let core = layer.core_share();
    let own = |layer: &Memory, bare: &Memory| layer.resident - bare.resident;
    let (own_once, own_waves) = (own(&layer_once, &bare_once), own(&layer_waves, &bare_waves));
    println!("\ntargets (LockLayer):");
    println!(
        "- heartbeat < 5 % of one core: {:.2} % {}",
        core * 100.0,
        check(core < 0.05)
    );
    println!(
        "- < 2 KiB resident per held lease, the layer's own: {own_once:.0} B all at once {}, \
         {own_waves:.0} B 64 at a time {}",
        check(own_once < 2048.0),
        check(own_waves < 2048.0)
    );
    println!(
        "  (with the benchmark's own requests: {:.0} B and {:.0} B)",
        layer_once.resident, layer_waves.resident
    );
    println!("- 0 leases lost: {} {}", layer.lost, check(layer.lost == 0));
    let jobs_core = jobs.core_share();
    println!("\ntargets (Held):");
    println!(
        "- heartbeat < 5 % of one core: {:.2} % {}",
        jobs_core * 100.0,
        check(jobs_core < 0.05)
    );
    println!(
        "- < 2 KiB per held lease (heap, no task of its own): {:.0} B {}",
        jobs.heap_per_lease,
        check(jobs.heap_per_lease < 2048.0)
    );
    println!("- 0 leases lost: {} {}", jobs.lost, check(jobs.lost == 0));
    assert_eq!(tokens.lost, 0, "plain tokens lost leases");
    assert_eq!(batched.lost, 0, "the batched heartbeat lost leases");
}
