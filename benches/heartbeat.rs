//! The heartbeat at scale: 10,000 requests hold leases through [`LockLayer`] at once, with a 3 s
//! TTL, for 10 s. Reports the extends per second they send, the CPU time this process used
//! meanwhile (the heartbeats, as nothing else runs), the memory per held lease, and how many
//! leases were lost (must be 0).
//!
//! ```text
//! cargo bench --all-features --bench heartbeat
//! HEARTBEAT_LEASES=50000 HEARTBEAT_SECS=30 cargo bench --all-features --bench heartbeat
//! ```

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use tokio_util::sync::CancellationToken;
use tower::{Layer, ServiceExt};
use tower_lease::{Lease, Lock, LockLayer, RedisStore, Store, extract};

use support::Redis;

const TTL: Duration = Duration::from_secs(3);
const LEASES: Lock<str> = Lock::new("held", TTL);

/// Counts the bytes this process has allocated and not freed, to measure memory per lease
/// more finely than the resident set.
struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller upholds `alloc`'s contract, which is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

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

async fn bench(redis: &Redis, leases: usize, hold: Duration) {
    let mut conn = redis.connection().await;
    let store: Store = RedisStore::new(conn.clone())
        .prefix("bench-heartbeat")
        .into();

    let held = Arc::new(AtomicUsize::new(0));
    let kept = Arc::new(AtomicUsize::new(0));
    let done = CancellationToken::new();
    let handler = {
        let (held, kept, done) = (held.clone(), kept.clone(), done.clone());
        tower::service_fn(move |req: Request<Empty<Bytes>>| {
            let (held, kept, done) = (held.clone(), kept.clone(), done.clone());
            async move {
                let lease = req
                    .extensions()
                    .get::<Lease>()
                    .cloned()
                    .expect("a Lease extension");
                held.fetch_add(1, Ordering::SeqCst);
                done.cancelled().await;
                if lease.is_held() {
                    kept.fetch_add(1, Ordering::SeqCst);
                }
                Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
            }
        })
    };
    let service = LockLayer::new(store, LEASES, extract::path_segment(1)).layer(handler);

    // Warm up the connection and the script cache, then take the baselines.
    let warm = service
        .clone()
        .oneshot(Request::post("/l/warm").body(Empty::new()).unwrap());
    let warm = tokio::spawn(warm);
    while held.load(Ordering::SeqCst) < 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let rss_before = support::resident_bytes();
    let heap_before = LIVE_BYTES.load(Ordering::SeqCst);
    let (_, server_memory_before) = server_stats(&mut conn).await;

    let acquiring = Instant::now();
    let requests: Vec<_> = (0..leases)
        .map(|i| {
            let req = Request::post(format!("/l/{i}")).body(Empty::new()).unwrap();
            tokio::spawn(service.clone().oneshot(req))
        })
        .collect();
    while held.load(Ordering::SeqCst) < leases + 1 {
        assert!(
            acquiring.elapsed() < Duration::from_secs(60),
            "the leases were not all acquired"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let acquired_in = acquiring.elapsed();
    let heap = (LIVE_BYTES.load(Ordering::SeqCst) - heap_before) as f64 / leases as f64;
    let rss = support::resident_bytes().saturating_sub(rss_before) as f64 / leases as f64;

    let (extends_before, _) = server_stats(&mut conn).await;
    let (cpu_before, server_cpu_before) = (
        support::cpu_time(),
        redis.pid().and_then(support::cpu_time_of),
    );
    let start = Instant::now();
    tokio::time::sleep(hold).await;
    let window = start.elapsed();
    let cpu = support::cpu_time() - cpu_before;
    let server_cpu = redis
        .pid()
        .and_then(support::cpu_time_of)
        .zip(server_cpu_before)
        .map(|(a, b)| a - b);
    let (extends_after, server_memory) = server_stats(&mut conn).await;
    let server_memory = server_memory.saturating_sub(server_memory_before) as f64 / leases as f64;

    done.cancel();
    let mut ok = 0;
    for request in requests {
        let res = request.await.expect("a request task panicked").unwrap();
        if res.status() == StatusCode::OK {
            ok += 1;
        }
    }
    assert_eq!(warm.await.unwrap().unwrap().status(), StatusCode::OK);
    let lost = leases - kept.load(Ordering::SeqCst).min(leases);
    let lost = lost.max(leases - ok);
    let left: Vec<String> = redis::cmd("KEYS")
        .arg("bench-heartbeat*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(left.is_empty(), "leases were left behind: {}", left.len());

    let extends = (extends_after - extends_before) as f64 / window.as_secs_f64();
    let core = cpu.as_secs_f64() / window.as_secs_f64();
    println!(
        "\n{leases} leases held through LockLayer, TTL {TTL:?} (heartbeat every TTL/3), for {window:.1?}"
    );
    println!("machine: {}\n", support::machine());
    println!("| measure | value |");
    println!("|---|---:|");
    println!("| acquired all in | {acquired_in:.2?} |");
    println!(
        "| extends sent per second | {extends:.0} (expected {:.0}) |",
        leases as f64 * 3.0 / TTL.as_secs_f64()
    );
    println!(
        "| this process's CPU, share of one core | {:.2} % |",
        core * 100.0
    );
    println!(
        "| CPU per extend (client) | {:.1} µs |",
        cpu.as_secs_f64() * 1e6 / (extends * window.as_secs_f64())
    );
    if let Some(server_cpu) = server_cpu {
        println!(
            "| redis-server CPU, share of one core | {:.2} % |",
            server_cpu.as_secs_f64() / window.as_secs_f64() * 100.0
        );
    }
    println!("| heap per held lease (live allocations) | {heap:.0} B |");
    println!("| resident memory per held lease | {rss:.0} B |");
    println!("| redis-server memory per held lease | {server_memory:.0} B |");
    println!("| leases lost | {lost} |");
    println!("\ntargets:");
    let check = |met: bool| if met { "met" } else { "MISSED" };
    println!(
        "- heartbeat < 5 % of one core: {:.2} % {}",
        core * 100.0,
        check(core < 0.05)
    );
    println!(
        "- < 2 KiB per lease: heap {heap:.0} B, resident {rss:.0} B {}",
        check(heap.max(rss) < 2048.0)
    );
    println!("- 0 leases lost: {lost} {}", check(lost == 0));
}
