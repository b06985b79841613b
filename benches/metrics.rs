//! What the `metrics` feature costs: a `Lock` cycle and a `LockLayer` request on
//! `Store::memory()`, built without the feature and with it (a Prometheus recorder installed).
//!
//! ```text
//! cargo bench --bench metrics                      # feature off
//! cargo bench --bench metrics --features metrics   # feature on, recorder installed
//! ```
//!
//! Each run prints the median of `ROUNDS` (default 15) rounds of 200 ms each, per variant, on
//! one thread. Compare the two runs' medians; alternate them a few times on a busy machine.
//! With `ITERS=n` it runs exactly `n` cycles and requests and prints nothing, for counting
//! instructions with `valgrind --tool=callgrind` (run two `n` and subtract).

use std::convert::Infallible;
use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tower::{Service, ServiceExt, service_fn};
use tower_lease::layer::TimeoutBody;
use tower_lease::{Lock, LockLayer, Store, extract};

use tower_lease_harness::bench::ready;

const LOCK: Lock<str> = Lock::new("bench", Duration::from_secs(30));
const ROUND: Duration = Duration::from_millis(200);

/// Operations per second of `op` over one round.
fn round(mut op: impl FnMut()) -> f64 {
    let started = Instant::now();
    let mut ops = 0u64;
    while started.elapsed() < ROUND {
        for _ in 0..256 {
            op();
        }
        ops += 256;
    }
    ops as f64 / started.elapsed().as_secs_f64()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() {
    #[cfg(feature = "metrics")]
    let _prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder");
    let feature = if cfg!(feature = "metrics") {
        "on (Prometheus recorder)"
    } else {
        "off"
    };
    let rounds: usize = std::env::var("ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(15);

    // The layer's futures need a runtime context (timers); the memory store never waits.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _context = runtime.enter();
    let store = Store::memory();
    let layer = LockLayer::new(store.clone(), LOCK, extract::path_segment(0));
    let mut service = tower::ServiceBuilder::new()
        .layer(layer)
        .service(service_fn(
            |_req: Request<TimeoutBody<Full<Bytes>>>| async {
                Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
            },
        ));

    // A fixed count instead of timed rounds, for instruction counts under callgrind.
    if let Some(iters) = std::env::var("ITERS")
        .ok()
        .and_then(|n| n.parse::<u64>().ok())
    {
        for _ in 0..iters {
            let token = ready(LOCK.try_lock(&store, black_box("job")))
                .unwrap()
                .unwrap();
            assert!(ready(token.release()).unwrap());
            let req = Request::post("/job").body(Full::default()).unwrap();
            let service = ready(service.ready()).unwrap();
            black_box(runtime.block_on(service.call(req)).unwrap());
        }
        return;
    }

    let (mut cycles, mut requests) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        cycles.push(round(|| {
            let token = ready(LOCK.try_lock(&store, black_box("job")))
                .unwrap()
                .unwrap();
            assert!(ready(token.release()).unwrap());
        }));
        requests.push(round(|| {
            let req = Request::post("/job").body(Full::default()).unwrap();
            let service = ready(service.ready()).unwrap();
            let res = runtime.block_on(service.call(req)).unwrap();
            black_box(res);
        }));
    }
    println!("metrics feature {feature}, median of {rounds} rounds:");
    println!(
        "  Lock cycle on Store::memory():       {:>10.0} /s",
        median(cycles)
    );
    println!(
        "  LockLayer request on Store::memory(): {:>10.0} /s",
        median(requests)
    );
}
