//! The measuring around each phase: baselines, the window the leases are held, what was left.

use std::time::{Duration, Instant};

use crate::alloc::Live;

use tower_lease_harness::Endpoint;
use tower_lease_harness::bench::{self, Redis};

/// `INFO commandstats` calls of `EVALSHA` (the extends) and the server's `used_memory`.
async fn server_stats(conn: &mut redis::aio::MultiplexedConnection) -> (u64, u64) {
    let info: String = redis::cmd("INFO")
        .arg("all")
        .query_async(conn)
        .await
        .unwrap();
    let field = |line: &str, name: &str| -> Option<u64> {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(name))
            .and_then(|v| v.parse().ok())
    };
    let evalsha = info
        .lines()
        .find_map(|l| {
            l.strip_prefix("cmdstat_evalsha:")
                .and_then(|l| field(l, "calls="))
        })
        .unwrap_or(0);
    let memory = info
        .lines()
        .find_map(|l| {
            l.strip_prefix("used_memory:")
                .and_then(|v| v.trim().parse().ok())
        })
        .unwrap();
    (evalsha, memory)
}

/// What one phase measured.
pub(crate) struct Stats {
    pub(crate) acquired_in: Duration,
    pub(crate) window: Duration,
    pub(crate) extends_per_second: f64,
    pub(crate) cpu: Duration,
    pub(crate) server_cpu: Option<Duration>,
    pub(crate) heap_per_lease: f64,
    pub(crate) peak_heap_per_lease: f64,
    pub(crate) blocks: Vec<(usize, f64)>,
    pub(crate) server_memory_per_lease: f64,
    pub(crate) lost: usize,
}

impl Stats {
    pub(crate) fn core_share(&self) -> f64 {
        self.cpu.as_secs_f64() / self.window.as_secs_f64()
    }
}

/// The measuring around one phase: baselines, all leases held, a window of `hold`, the end.
pub(crate) struct Probe<'a> {
    redis: &'a Redis,
    conn: redis::aio::MultiplexedConnection,
    leases: usize,
    heap: Live,
    server_memory: u64,
    pub(crate) started: Instant,
}

pub(crate) struct Held {
    pub(crate) acquired_in: Duration,
    /// Blocks alive per lease by size class: `(up to bytes, blocks per lease)`.
    pub(crate) blocks: Vec<(usize, f64)>,
    pub(crate) heap_per_lease: f64,
    /// The most heap alive at once while the leases were being acquired, per lease.
    pub(crate) peak_heap_per_lease: f64,
}

impl<'a> Probe<'a> {
    pub(crate) async fn start(redis: &'a Redis, leases: usize) -> Probe<'a> {
        let mut conn = redis.connection().await;
        let (_, server_memory) = server_stats(&mut conn).await;
        Probe {
            redis,
            conn,
            leases,
            heap: Live::now(),
            server_memory,
            started: Instant::now(),
        }
    }

    /// Call once every lease is held.
    pub(crate) fn held(&self) -> Held {
        let n = self.leases as f64;
        let live = Live::now();
        Held {
            acquired_in: self.started.elapsed(),
            blocks: live.blocks_since(&self.heap, self.leases),
            heap_per_lease: (live.bytes - self.heap.bytes) as f64 / n,
            peak_heap_per_lease: (live.peak - self.heap.bytes) as f64 / n,
        }
    }

    /// Measures while the leases are held for `hold`.
    pub(crate) async fn window(&mut self, held: Held, hold: Duration) -> Stats {
        let (extends_before, _) = server_stats(&mut self.conn).await;
        let pid = self.redis.pid();
        let (cpu, server_cpu) = (bench::cpu_time(), pid.and_then(bench::cpu_time_of));
        let start = Instant::now();
        tokio::time::sleep(hold).await;
        let window = start.elapsed();
        let cpu = bench::cpu_time() - cpu;
        let server_cpu = pid
            .and_then(bench::cpu_time_of)
            .zip(server_cpu)
            .map(|(a, b)| a - b);
        let (extends_after, server_memory) = server_stats(&mut self.conn).await;
        Stats {
            acquired_in: held.acquired_in,
            window,
            extends_per_second: (extends_after - extends_before) as f64 / window.as_secs_f64(),
            cpu,
            server_cpu,
            heap_per_lease: held.heap_per_lease,
            blocks: held.blocks,
            peak_heap_per_lease: held.peak_heap_per_lease,
            server_memory_per_lease: server_memory.saturating_sub(self.server_memory) as f64
                / self.leases as f64,
            lost: 0,
        }
    }

    /// Nothing of the phase may be left in Redis.
    pub(crate) async fn finish(mut self, prefix: &str) {
        let left: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query_async(&mut self.conn)
            .await
            .unwrap();
        assert!(left.is_empty(), "{} leases were left behind", left.len());
    }
}

pub(crate) fn wait_deadline(start: Instant) {
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "the leases were not all acquired"
    );
}
