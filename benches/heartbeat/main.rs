//! The heartbeat at scale: 10,000 requests hold leases through [`LockLayer`] at once, with a 3 s
//! TTL, for 10 s. Reports the extends per second they send, the CPU time this process used
//! meanwhile (the heartbeats, as nothing else runs), the memory per held lease, and how many
//! leases were lost (must be 0).
//!
//! For comparison, a second phase holds as many [`LockToken`](tower_lease::LockToken)s, each
//! extended every TTL/3 by a task of its own: the floor for one task and one round trip per
//! lease.
//!
//! ```text
//! cargo bench --all-features --bench heartbeat
//! HEARTBEAT_LEASES=50000 HEARTBEAT_SECS=30 cargo bench --all-features --bench heartbeat
//! ```

mod alloc;
mod phases;
mod probe;
#[path = "../support/mod.rs"]
mod support;

use std::time::Duration;

use phases::{TTL, batched, plain_tokens, through_layer};
use probe::Stats;
use support::Redis;

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
    runtime.block_on(bench(&redis, leases, hold));
}

async fn bench(redis: &Redis, leases: usize, hold: Duration) {
    let layer = through_layer(redis, leases, hold).await;
    let tokens = plain_tokens(redis, leases, hold).await;
    let batched = batched(redis, leases, hold).await;

    println!("\n{leases} leases held at once, TTL {TTL:?}, extended every TTL/3, for {hold:?}");
    println!("machine: {}\n", support::machine());
    println!(
        "| measure | LockLayer requests | plain tokens, a task each | by hand, batched (floor) |"
    );
    println!("|---|---:|---:|---:|");
    let row = |what: &str, f: &dyn Fn(&Stats) -> String| {
        println!(
            "| {what} | {} | {} | {} |",
            f(&layer),
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
    row("heap per held lease", &|s| {
        format!("{:.0} B", s.heap_per_lease)
    });
    // The second phase reuses memory the first one freed, so only the first one's resident
    // growth means anything.
    println!(
        "| resident memory per held lease | {:.0} B | n/a | n/a |",
        layer.resident_per_lease
    );
    row("redis-server memory per lease", &|s| {
        format!("{:.0} B", s.server_memory_per_lease)
    });
    row("leases lost", &|s| s.lost.to_string());

    println!("\nheap blocks alive per held lease, by size (all acquired):");
    for (what, stats) in [("LockLayer", &layer), ("plain tokens", &tokens), ("batched", &batched)] {
        println!("- {what}: {}", alloc::describe(&stats.blocks));
    }

    let check = |met: bool| if met { "met" } else { "MISSED" };
    let core = layer.core_share();
    let memory = layer.heap_per_lease.max(layer.resident_per_lease);
    println!("\ntargets (LockLayer):");
    println!(
        "- heartbeat < 5 % of one core: {:.2} % {}",
        core * 100.0,
        check(core < 0.05)
    );
    println!(
        "- < 2 KiB per lease: heap {:.0} B, resident {:.0} B {}",
        layer.heap_per_lease,
        layer.resident_per_lease,
        check(memory < 2048.0)
    );
    println!("- 0 leases lost: {} {}", layer.lost, check(layer.lost == 0));
    assert_eq!(tokens.lost, 0, "plain tokens lost leases");
    assert_eq!(batched.lost, 0, "the batched heartbeat lost leases");
}
