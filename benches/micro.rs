//! Micro-benchmarks of the parts that do not wait on the network: building Redis keys, the
//! in-process [`Store::memory`] backend, and what the handle adds to an outside backend's calls.
//!
//! ```text
//! cargo bench --all-features --bench micro
//! ```

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tower_lease::store::{KeyLayout, KeyRole, MemoryStore};
use tower_lease::{Lock, RedisStore, RwLock, Store};

use tower_lease_harness::Endpoint;
use tower_lease_harness::bench::{self, ready};

const TTL: Duration = Duration::from_secs(30);
const LOCK: Lock<str> = Lock::new("bench", TTL);
const RWLOCK: RwLock<str> = RwLock::new("bench", TTL);
const IDS: Lock<u64> = Lock::new("ids", TTL);

fn keys(c: &mut Criterion) {
    let redis = bench::Redis::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = RedisStore::new(runtime.block_on(redis.connection()));
    let layout = KeyLayout::default();
    let long = vec![b'x'; tower_lease::MAX_NAME_LEN];

    let mut group = c.benchmark_group("key");
    for (label, name) in [("8 B name", &b"order-42"[..]), ("1 KiB name", &long[..])] {
        group.bench_with_input(
            BenchmarkId::new("RedisStore::key", label),
            name,
            |b, name| b.iter(|| store.key(KeyRole::Lock, black_box("invoice"), black_box(name))),
        );
        group.bench_with_input(
            BenchmarkId::new("KeyLayout::key readers", label),
            name,
            |b, name| {
                b.iter(|| layout.key(KeyRole::Readers, black_box("catalog"), black_box(name)))
            },
        );
    }
    group.finish();
}

fn memory(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory store");
    for others in [0usize, 10_000] {
        let store = Store::memory();
        // Other names held at the same time, so the maps are not trivially small.
        let held: Vec<_> = (0..others)
            .map(|i| {
                ready(LOCK.try_lock(&store, &format!("other-{i}")))
                    .unwrap()
                    .unwrap()
            })
            .collect();
        let label = format!("{others} others held");
        group.bench_function(BenchmarkId::new("Lock cycle", &label), |b| {
            b.iter(|| {
                let token = ready(LOCK.try_lock(&store, black_box("job"))).unwrap();
                assert!(ready(token.expect("free").release()).unwrap());
            })
        });
        group.bench_function(BenchmarkId::new("Lock<u64> cycle", &label), |b| {
            b.iter(|| {
                let token = ready(IDS.try_lock(&store, black_box(&4_294_967_296))).unwrap();
                assert!(ready(token.expect("free").release()).unwrap());
            })
        });
        group.bench_function(BenchmarkId::new("Lock held", &label), |b| {
            let holder = ready(LOCK.try_lock(&store, "busy")).unwrap().unwrap();
            b.iter(|| {
                assert!(
                    ready(LOCK.try_lock(&store, black_box("busy")))
                        .unwrap()
                        .is_none()
                )
            });
            assert!(ready(holder.release()).unwrap());
        });
        group.bench_function(BenchmarkId::new("Lock extend", &label), |b| {
            let token = ready(LOCK.try_lock(&store, "kept")).unwrap().unwrap();
            b.iter(|| assert!(ready(token.extend()).unwrap()));
            assert!(ready(token.release()).unwrap());
        });
        group.bench_function(BenchmarkId::new("RwLock read cycle", &label), |b| {
            b.iter(|| {
                let token = ready(RWLOCK.try_read(&store, black_box("shop"))).unwrap();
                assert!(ready(token.expect("free").release()).unwrap());
            })
        });
        group.bench_function(BenchmarkId::new("RwLock write cycle", &label), |b| {
            b.iter(|| {
                let token = ready(RWLOCK.try_write(&store, black_box("shop"))).unwrap();
                assert!(ready(token.expect("free").release()).unwrap());
            })
        });
        for token in held {
            assert!(ready(token.release()).unwrap());
        }
    }
    group.finish();
}

/// What the handle adds to an outside backend's calls: each bounded by the backend's timeout, an
/// acquisition ready to finish in the background. The memory store behind
/// `Store::from_backend` is bounded so; `Store::memory()` is the same backend unbounded.
fn bounded(c: &mut Criterion) {
    let mut group = c.benchmark_group("bounded calls");
    let stores = [
        ("Store::memory()", Store::memory()),
        (
            "Store::from_backend(MemoryStore)",
            Store::from_backend(MemoryStore::new()),
        ),
    ];
    for (label, store) in stores {
        group.bench_function(BenchmarkId::new("Lock cycle", label), |b| {
            b.iter(|| {
                let token = ready(LOCK.try_lock(&store, black_box("job"))).unwrap();
                assert!(ready(token.expect("free").release()).unwrap());
            })
        });
        group.bench_function(BenchmarkId::new("Lock extend", label), |b| {
            let token = ready(LOCK.try_lock(&store, "kept")).unwrap().unwrap();
            b.iter(|| assert!(ready(token.extend()).unwrap()));
            assert!(ready(token.release()).unwrap());
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    // Short by default so a full `cargo bench` stays within minutes; criterion's own flags
    // (`--measurement-time`, `--sample-size`) lengthen it.
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(30);
    targets = keys, memory, bounded
}
criterion_main!(benches);
