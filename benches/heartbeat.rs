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

/// What one phase measured.
struct Stats {
    acquired_in: Duration,
    window: Duration,
    extends_per_second: f64,
    cpu: Duration,
    server_cpu: Option<Duration>,
    heap_per_lease: f64,
    resident_per_lease: f64,
    server_memory_per_lease: f64,
    lost: usize,
}

impl Stats {
    fn core_share(&self) -> f64 {
        self.cpu.as_secs_f64() / self.window.as_secs_f64()
    }
}

/// The measuring around one phase: baselines, all leases held, a window of `hold`, the end.
struct Probe<'a> {
    redis: &'a Redis,
    conn: redis::aio::MultiplexedConnection,
    leases: usize,
    rss: u64,
    heap: isize,
    server_memory: u64,
    started: Instant,
}

struct Held {
    acquired_in: Duration,
    heap_per_lease: f64,
    resident_per_lease: f64,
}

impl<'a> Probe<'a> {
    async fn start(redis: &'a Redis, leases: usize) -> Probe<'a> {
        let mut conn = redis.connection().await;
        let (_, server_memory) = server_stats(&mut conn).await;
        Probe {
            redis,
            conn,
            leases,
            rss: support::resident_bytes(),
            heap: LIVE_BYTES.load(Ordering::SeqCst),
            server_memory,
            started: Instant::now(),
        }
    }

    /// Call once every lease is held.
    fn held(&self) -> Held {
        let n = self.leases as f64;
        Held {
            acquired_in: self.started.elapsed(),
            heap_per_lease: (LIVE_BYTES.load(Ordering::SeqCst) - self.heap) as f64 / n,
            resident_per_lease: support::resident_bytes().saturating_sub(self.rss) as f64 / n,
        }
    }

    /// Measures while the leases are held for `hold`.
    async fn window(&mut self, held: Held, hold: Duration) -> Stats {
        let (extends_before, _) = server_stats(&mut self.conn).await;
        let pid = self.redis.pid();
        let (cpu, server_cpu) = (support::cpu_time(), pid.and_then(support::cpu_time_of));
        let start = Instant::now();
        tokio::time::sleep(hold).await;
        let window = start.elapsed();
        let cpu = support::cpu_time() - cpu;
        let server_cpu = pid
            .and_then(support::cpu_time_of)
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
            resident_per_lease: held.resident_per_lease,
            server_memory_per_lease: server_memory.saturating_sub(self.server_memory) as f64
                / self.leases as f64,
            lost: 0,
        }
    }

    /// Nothing of the phase may be left in Redis.
    async fn finish(mut self, prefix: &str) {
        let left: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}*"))
            .query_async(&mut self.conn)
            .await
            .unwrap();
        assert!(left.is_empty(), "{} leases were left behind", left.len());
    }
}

fn wait_deadline(start: Instant) {
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "the leases were not all acquired"
    );
}

/// Leases held by requests in flight through `LockLayer`; its heartbeat keeps them.
async fn through_layer(redis: &Redis, leases: usize, hold: Duration) -> Stats {
    let conn = redis.connection().await;
    let store: Store = RedisStore::new(conn).prefix("bench-layer").into();
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
    let request = |name: String| {
        let req = Request::post(format!("/l/{name}"))
            .body(Empty::new())
            .unwrap();
        tokio::spawn(service.clone().oneshot(req))
    };

    // Warm up the connection, the script cache and the runtime before the baselines.
    let warm = request("warm".into());
    while held.load(Ordering::SeqCst) < 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut probe = Probe::start(redis, leases).await;
    let requests: Vec<_> = (0..leases).map(|i| request(i.to_string())).collect();
    while held.load(Ordering::SeqCst) < leases + 1 {
        wait_deadline(probe.started);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut stats = probe.window(probe.held(), hold).await;

    done.cancel();
    let mut ok = 0;
    for request in requests {
        let res = request.await.expect("a request task panicked").unwrap();
        ok += usize::from(res.status() == StatusCode::OK);
    }
    assert_eq!(warm.await.unwrap().unwrap().status(), StatusCode::OK);
    // A lost lease shows twice: the handler sees `is_held() == false`, the client a 503.
    stats.lost = (leases - kept.load(Ordering::SeqCst).min(leases)).max(leases - ok);
    probe.finish("bench-layer").await;
    stats
}

/// Leases held as plain tokens, each extended every TTL/3 by a task of its own.
async fn plain_tokens(redis: &Redis, leases: usize, hold: Duration) -> Stats {
    let conn = redis.connection().await;
    let store: Store = RedisStore::new(conn).prefix("bench-tokens").into();
    // Warm up the connection and the script cache before the baselines.
    let warm = LEASES.try_lock(&store, "warm").await.unwrap().unwrap();
    assert!(warm.extend().await.unwrap() && warm.release().await.unwrap());
    let mut probe = Probe::start(redis, leases).await;
    let held = Arc::new(AtomicUsize::new(0));
    let done = CancellationToken::new();
    let tasks: Vec<_> = (0..leases)
        .map(|i| {
            let (store, held, done) = (store.clone(), held.clone(), done.clone());
            tokio::spawn(async move {
                let token = LEASES
                    .try_lock(&store, &i.to_string())
                    .await
                    .unwrap()
                    .unwrap();
                held.fetch_add(1, Ordering::SeqCst);
                let mut every = tokio::time::interval(TTL / 3);
                every.tick().await;
                let kept = loop {
                    tokio::select! {
                        () = done.cancelled() => break true,
                        _ = every.tick() => {
                            if !token.extend().await.unwrap() {
                                break false;
                            }
                        }
                    }
                };
                kept && token.release().await.unwrap()
            })
        })
        .collect();
    while held.load(Ordering::SeqCst) < leases {
        wait_deadline(probe.started);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut stats = probe.window(probe.held(), hold).await;
    done.cancel();
    for task in tasks {
        stats.lost += usize::from(!task.await.expect("a token task panicked"));
    }
    probe.finish("bench-tokens").await;
    stats
}

/// The same extends by hand, batched: one task sends every due extend (the compare-and-`PEXPIRE`
/// tower-lease runs) in pipelines of 500. Not something tower-lease does: the floor a batching
/// heartbeat could reach.
async fn batched(redis: &Redis, leases: usize, hold: Duration) -> Stats {
    const BATCH: usize = 500;
    static EXTEND: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
        redis::Script::new(include_str!("../src/store/scripts/extend.lua"))
    });
    let mut conn = redis.connection().await;
    let ttl = TTL.as_millis() as u64;
    let warm: i64 = EXTEND
        .key("bench-batched:warm")
        .arg("x")
        .arg(ttl)
        .invoke_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(warm, 0);
    let mut probe = Probe::start(redis, leases).await;
    let held: Arc<Vec<(String, [u8; 16])>> = Arc::new(
        (0..leases)
            .map(|i| (format!("bench-batched:{i}"), rand::random()))
            .collect(),
    );
    for chunk in held.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for (key, token) in chunk {
            pipe.cmd("SET")
                .arg(key)
                .arg(&token[..])
                .arg("NX")
                .arg("PX")
                .arg(ttl)
                .ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
    }
    let lost = Arc::new(AtomicUsize::new(0));
    let done = CancellationToken::new();
    let beat = {
        let (held, lost, done, mut conn) = (held.clone(), lost.clone(), done.clone(), conn.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(TTL / 3);
            every.tick().await;
            loop {
                tokio::select! {
                    () = done.cancelled() => return,
                    _ = every.tick() => {}
                }
                for chunk in held.chunks(BATCH) {
                    let mut pipe = redis::pipe();
                    for (key, token) in chunk {
                        pipe.invoke_script(EXTEND.key(key).arg(&token[..]).arg(ttl));
                    }
                    let extended: Vec<i64> = pipe.query_async(&mut conn).await.unwrap();
                    let failed = extended.iter().filter(|&&n| n != 1).count();
                    lost.fetch_add(failed, Ordering::SeqCst);
                }
            }
        })
    };
    let mut stats = probe.window(probe.held(), hold).await;
    done.cancel();
    beat.await.unwrap();
    for chunk in held.chunks(BATCH) {
        let mut pipe = redis::pipe();
        for (key, token) in chunk {
            pipe.invoke_script(RELEASE.key(key).arg(&token[..]));
        }
        let released: Vec<i64> = pipe.query_async(&mut conn).await.unwrap();
        lost.fetch_add(
            released.iter().filter(|&&n| n != 1).count(),
            Ordering::SeqCst,
        );
    }
    stats.lost = lost.load(Ordering::SeqCst);
    probe.finish("bench-batched").await;
    stats
}

static RELEASE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(include_str!("../src/store/scripts/release.lua"))
});

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
