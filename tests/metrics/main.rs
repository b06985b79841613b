//! The `metrics` feature against `metrics-util`'s debugging recorder: each outcome increments
//! exactly its counter, the gauge of held leases returns to 0 after a cancellation storm, no
//! label ever carries a lock name, and shared reads count per request and per lease
//! (`shared_reads`).
//!
//! The recorder is global and its snapshots drain the counters, so the tests take turns.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tokio::sync::{Mutex, MutexGuard};
use tower_lease::{LeaseLost, Lock, LockLayer, RwLock, Semaphore, SemaphoreLayer, Store, extract};

use tower_lease_harness::http::{Http, count, serve};
use tower_lease_harness::{Backing, Setup};

mod idempotency;
mod shared_reads;

/// A metric's name and labels, as `name{label=value,…}` with the labels sorted.
type Series = String;

struct Recorder {
    snapshotter: Snapshotter,
    turn: Mutex<()>,
    /// Gauges' values: snapshots drain them too, and report what changed since the last one.
    gauges: std::sync::Mutex<BTreeMap<Series, f64>>,
}

fn recorder() -> &'static Recorder {
    static RECORDER: OnceLock<Recorder> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this process");
        Recorder {
            snapshotter,
            turn: Mutex::new(()),
            gauges: Default::default(),
        }
    })
}

/// Waits for this test's turn, and drains what earlier tests left.
async fn turn() -> MutexGuard<'static, ()> {
    let turn = recorder().turn.lock().await;
    recorded();
    turn
}

/// What was recorded since the last call: counters' increments and histograms' sample counts,
/// by series; and gauges' current values.
fn recorded() -> BTreeMap<Series, f64> {
    let mut series = BTreeMap::new();
    for (key, _, _, value) in recorder().snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        let value = match value {
            DebugValue::Counter(n) => n as f64,
            DebugValue::Gauge(change) => {
                let mut gauges = recorder().gauges.lock().unwrap();
                let value = gauges.entry(name.clone()).or_default();
                *value += change.0;
                *value
            }
            DebugValue::Histogram(samples) => samples.len() as f64,
        };
        series.insert(name, value);
    }
    series
}

/// The counters of `recorded` that moved, without the zeros.
fn moved(recorded: &BTreeMap<Series, f64>, prefix: &str) -> BTreeMap<Series, f64> {
    recorded
        .iter()
        .filter(|(name, value)| name.starts_with(prefix) && **value != 0.0)
        .map(|(name, value)| (name.clone(), *value))
        .collect()
}

fn one(name: &str, labels: &str) -> BTreeMap<Series, f64> {
    BTreeMap::from([(format!("{name}{{{labels}}}"), 1.0)])
}

const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(5));
const DOCS: RwLock<str> = RwLock::new("docs", Duration::from_secs(5));

#[tokio::test]
async fn each_core_outcome_increments_exactly_its_counter() {
    let _turn = turn().await;
    let store = Store::memory();
    const ACQUIRE: &str = "tower_lease_acquire_total";

    let token = JOBS.try_lock(&store, "a").await.unwrap().unwrap();
    let acquired = recorded();
    assert_eq!(
        moved(&acquired, ACQUIRE),
        one(ACQUIRE, "mode=exclusive,namespace=jobs,outcome=acquired")
    );
    assert_eq!(
        acquired["tower_lease_acquire_seconds{mode=exclusive,namespace=jobs}"],
        1.0
    );
    assert_eq!(
        acquired["tower_lease_held{mode=exclusive,namespace=jobs}"],
        1.0
    );

    assert!(JOBS.try_lock(&store, "a").await.unwrap().is_none());
    assert_eq!(
        moved(&recorded(), ACQUIRE),
        one(ACQUIRE, "mode=exclusive,namespace=jobs,outcome=busy")
    );

    assert!(JOBS.try_lock(&store, "").await.is_err());
    assert_eq!(
        moved(&recorded(), ACQUIRE),
        one(
            ACQUIRE,
            "mode=exclusive,namespace=jobs,outcome=invalid_name"
        )
    );

    let reader = DOCS.try_read(&store, "d").await.unwrap().unwrap();
    assert!(DOCS.try_write(&store, "d").await.unwrap().is_none());
    let rw = moved(&recorded(), ACQUIRE);
    assert_eq!(rw.len(), 2, "{rw:?}");
    assert_eq!(
        rw["tower_lease_acquire_total{mode=read,namespace=docs,outcome=acquired}"],
        1.0
    );
    assert_eq!(
        rw["tower_lease_acquire_total{mode=write,namespace=docs,outcome=busy}"],
        1.0
    );

    assert!(token.extend().await.unwrap());
    let extended = recorded();
    assert_eq!(
        moved(&extended, "tower_lease_extend_total"),
        one(
            "tower_lease_extend_total",
            "mode=exclusive,namespace=jobs,outcome=ok"
        )
    );

    assert!(token.release().await.unwrap());
    assert!(reader.release().await.unwrap());
    let released = recorded();
    assert_eq!(
        released["tower_lease_held{mode=exclusive,namespace=jobs}"],
        0.0
    );
    assert_eq!(released["tower_lease_held{mode=read,namespace=docs}"], 0.0);
    assert_eq!(
        released["tower_lease_hold_seconds{mode=exclusive,namespace=jobs}"],
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_layer_outcome_increments_exactly_its_counter_on_redis() {
    let _turn = turn().await;
    layer_outcomes(Backing::redis(Setup::Layer).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_layer_outcome_increments_exactly_its_counter_on_postgres() {
    let _turn = turn().await;
    layer_outcomes(Backing::postgres(Setup::Layer).await).await;
}

async fn layer_outcomes(mut env: Backing) {
    const ACQUIRE: &str = "tower_lease_acquire_total";
    let runs = Arc::new(AtomicUsize::new(0));
    // Long enough that a heartbeat late on a loaded machine still finds the stolen lease gone
    // before this process's own clock says it ended (which counts as `expired`).
    let short = Lock::<str>::new("short", Duration::from_secs(1));
    let app = |layer: LockLayer<extract::PathSegment>| {
        Router::new()
            .route("/jobs/{id}", post(count))
            .route_layer(layer)
            .with_state(runs.clone())
    };
    let layer = LockLayer::new(env.store.clone(), short, extract::path_segment(1));
    let closed = serve(app(layer.clone())).await;
    let open = serve(app(layer.clone().fail_open())).await;
    let lasting = serve(app(layer.on_lease_lost(LeaseLost::Abort))).await;
    let http = Http::new();

    assert_eq!(http.post(closed, "/jobs/1").await.status, StatusCode::OK);
    let ok = recorded();
    assert_eq!(
        moved(&ok, ACQUIRE),
        one(ACQUIRE, "mode=exclusive,namespace=short,outcome=acquired")
    );
    assert_eq!(
        ok["tower_lease_held{mode=exclusive,namespace=short}"], 0.0,
        "released"
    );

    let holder = short.try_lock(&env.store, "2").await.unwrap().unwrap();
    recorded();
    assert_eq!(
        http.post(closed, "/jobs/2").await.status,
        StatusCode::CONFLICT
    );
    assert_eq!(
        moved(&recorded(), ACQUIRE),
        one(ACQUIRE, "mode=exclusive,namespace=short,outcome=busy")
    );
    assert!(holder.release().await.unwrap());
    recorded();

    assert_eq!(
        http.post(closed, "/jobs/%00").await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        moved(&recorded(), ACQUIRE),
        one(
            ACQUIRE,
            "mode=exclusive,namespace=short,outcome=invalid_name"
        )
    );

    // A lease lost behind the layer's back: the heartbeat's extend finds it gone.
    let lost = tokio::spawn({
        let http = http.clone();
        async move {
            http.send(
                lasting,
                http::Method::POST,
                "/jobs/3",
                &[("x-work-ms", b"2000")],
            )
            .await
        }
    });
    let deleted = tower_lease_harness::poll(
        Duration::from_millis(10),
        Duration::from_secs(2),
        || async { env.steal_lock("short", b"3").await.then_some(()) },
    )
    .await;
    assert!(deleted.is_some(), "the request took its lease");
    assert_eq!(lost.await.unwrap().status, StatusCode::SERVICE_UNAVAILABLE);
    let lost = recorded();
    assert_eq!(
        moved(&lost, "tower_lease_lost_total"),
        one(
            "tower_lease_lost_total",
            "mode=exclusive,namespace=short,reason=store_said_gone"
        )
    );
    assert_eq!(
        moved(&lost, "tower_lease_extend_total"),
        one(
            "tower_lease_extend_total",
            "mode=exclusive,namespace=short,outcome=lost"
        )
    );

    // The store is down: refused (fail closed) or run unlocked (fail open).
    env.stop_server();
    assert_eq!(
        http.post(closed, "/jobs/4").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        moved(&recorded(), ACQUIRE),
        one(
            ACQUIRE,
            "mode=exclusive,namespace=short,outcome=store_error"
        )
    );
    assert_eq!(http.post(open, "/jobs/5").await.status, StatusCode::OK);
    assert_eq!(
        moved(&recorded(), ACQUIRE),
        one(ACQUIRE, "mode=exclusive,namespace=short,outcome=unlocked")
    );
}

/// Permits count under `mode="permit"`: acquired, held (full), the held gauge, and a limit of 0
/// over HTTP as invalid input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_count_under_mode_permit() {
    const POOL: Semaphore<str> = Semaphore::new("pool", 1, Duration::from_secs(5));
    const ACQUIRE: &str = "tower_lease_acquire_total";
    let _turn = turn().await;
    let store = Store::memory();

    let permit = POOL.try_acquire(&store, "a").await.unwrap().unwrap();
    let acquired = recorded();
    assert_eq!(
        moved(&acquired, ACQUIRE),
        one(ACQUIRE, "mode=permit,namespace=pool,outcome=acquired")
    );
    assert_eq!(
        acquired["tower_lease_held{mode=permit,namespace=pool}"],
        1.0
    );
    assert!(POOL.try_acquire(&store, "a").await.unwrap().is_none());
    assert_eq!(
        moved(&recorded(), ACQUIRE),
        one(ACQUIRE, "mode=permit,namespace=pool,outcome=busy")
    );
    assert!(permit.release().await.unwrap());
    assert_eq!(
        recorded()["tower_lease_held{mode=permit,namespace=pool}"],
        0.0
    );

    let runs = Arc::new(AtomicUsize::new(0));
    let layer = SemaphoreLayer::new(store, POOL, extract::path_segment(1)).permits(
        |req: &http::Request<axum::body::Body>| u32::from(req.uri().path() != "/jobs/none"),
    );
    let addr = serve(
        Router::new()
            .route("/jobs/{id}", post(count))
            .route_layer(layer)
            .with_state(runs.clone()),
    )
    .await;
    assert_eq!(
        Http::new().post(addr, "/jobs/none").await.status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        moved(&recorded(), ACQUIRE),
        one(ACQUIRE, "mode=permit,namespace=pool,outcome=invalid_limit")
    );
}

#[tokio::test]
async fn a_missing_name_and_an_invalid_name_count_apart() {
    const ACQUIRE: &str = "tower_lease_acquire_total";
    let _turn = turn().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let layer = LockLayer::new(Store::memory(), JOBS, extract::header("x-job")).require_name();
    let addr = serve(
        Router::new()
            .route("/run", post(count))
            .route_layer(layer)
            .with_state(runs.clone()),
    )
    .await;
    let http = Http::new();

    let missing = http.post(addr, "/run").await;
    assert_eq!(missing.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        missing.problem()["type"],
        "urn:tower-lease:missing-lock-name"
    );
    assert_eq!(
        moved(&recorded(), ACQUIRE),
        one(
            ACQUIRE,
            "mode=exclusive,namespace=jobs,outcome=missing_name"
        )
    );

    let headers: [(&str, &[u8]); 1] = [("x-job", b"{x}")];
    let invalid = http.send(addr, http::Method::POST, "/run", &headers).await;
    assert_eq!(invalid.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        invalid.problem()["type"],
        "urn:tower-lease:invalid-lock-name"
    );
    assert_eq!(
        moved(&recorded(), ACQUIRE),
        one(
            ACQUIRE,
            "mode=exclusive,namespace=jobs,outcome=invalid_name"
        )
    );
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_leases_return_to_zero_after_a_cancellation_storm_and_no_label_is_a_name() {
    let _turn = turn().await;
    let env = Backing::redis(Setup::Layer).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let storm = Lock::<str>::new("storm", Duration::from_secs(5));
    let layer = LockLayer::new(env.store.clone(), storm, extract::path_segment(1));
    let addr = serve(
        Router::new()
            .route("/jobs/{id}", post(count))
            .route_layer(layer)
            .with_state(runs.clone()),
    )
    .await;
    let http = Http::new();
    let names: Vec<String> = (0..300).map(|i| format!("secret-name-{i}")).collect();
    let (cut_holders, holders_cut) = tokio::sync::watch::channel(false);
    let mut requests = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let (http, path) = (http.clone(), format!("/jobs/{name}"));
        let mut holders_cut = holders_cut.clone();
        // Half are cut while their handler works (surely holding their lease), half at any
        // point from before the acquisition to after the response.
        let (cut, work) = match i % 2 {
            0 => (None, 5_000),
            _ => (Some(1 + (i as u64 * 7) % 40), (i as u64 * 3) % 30),
        };
        requests.push(tokio::spawn(async move {
            let work = work.to_string();
            let headers = [("x-work-ms", work.as_bytes())];
            let send = http.send(addr, http::Method::POST, &path, &headers);
            match cut {
                // Cut at a point that falls before, during or after the acquisition.
                Some(cut) => drop(tokio::time::timeout(Duration::from_millis(cut), send).await),
                None => tokio::select! {
                    _ = send => {}
                    _ = holders_cut.wait_for(|cut| *cut) => {}
                },
            }
        }));
    }
    // The holders are cut once 100 handlers are running (or after 5 s, whatever ran).
    tower_lease_harness::poll(
        Duration::from_millis(10),
        Duration::from_secs(5),
        || async { (runs.load(std::sync::atomic::Ordering::SeqCst) >= 100).then_some(()) },
    )
    .await;
    cut_holders.send(true).unwrap();
    for request in requests {
        request.await.unwrap();
    }
    let storm = recorded();
    let acquired = storm
        .get("tower_lease_acquire_total{mode=exclusive,namespace=storm,outcome=acquired}")
        .copied()
        .unwrap_or_default();
    assert!(acquired >= 100.0, "the storm took leases: {acquired}");
    let gauge = "tower_lease_held{mode=exclusive,namespace=storm}";
    let settled = tower_lease_harness::poll(
        Duration::from_millis(20),
        Duration::from_secs(3),
        || async {
            let now = recorded();
            (now.get(gauge).copied() == Some(0.0)).then_some(now)
        },
    )
    .await;
    let (settled, _) =
        settled.unwrap_or_else(|| panic!("held leases stay: {:?}", recorded().get(gauge)));
    for series in storm.keys().chain(settled.keys()) {
        assert!(
            !series.contains("secret-name"),
            "a name in a label: {series}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_waits_count_as_waited_or_timed_out_waiting() {
    let _turn = turn().await;
    const ACQUIRE: &str = "tower_lease_acquire_total";
    let store = Store::memory();
    let holder = JOBS.try_lock(&store, "w").await.unwrap().unwrap();
    recorded();

    assert!(
        JOBS.try_lock_for(&store, "w", Duration::from_millis(50))
            .await
            .unwrap()
            .is_none()
    );
    let timed_out = recorded();
    assert_eq!(
        moved(&timed_out, ACQUIRE),
        one(
            ACQUIRE,
            "mode=exclusive,namespace=jobs,outcome=timed_out_waiting"
        )
    );
    assert_eq!(
        timed_out["tower_lease_wait_seconds{mode=exclusive,namespace=jobs}"],
        1.0
    );
    assert_eq!(
        timed_out["tower_lease_waiters{mode=exclusive,namespace=jobs}"],
        0.0
    );

    let waiter = tokio::spawn({
        let store = store.clone();
        async move { JOBS.try_lock_for(&store, "w", Duration::from_secs(2)).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        recorded()["tower_lease_waiters{mode=exclusive,namespace=jobs}"],
        1.0,
        "one waiter now"
    );
    assert!(holder.release().await.unwrap());
    let token = waiter.await.unwrap().unwrap().expect("waited for it");
    let waited = recorded();
    assert_eq!(
        moved(&waited, ACQUIRE),
        one(ACQUIRE, "mode=exclusive,namespace=jobs,outcome=waited")
    );
    assert_eq!(
        waited["tower_lease_waiters{mode=exclusive,namespace=jobs}"],
        0.0
    );
    assert!(token.release().await.unwrap());
}

/// A process frozen past its lease (here: a handler that blocks its single-threaded runtime,
/// heartbeat included) wakes to find its lease expired: the layer drops the handler before
/// its next step, and the loss counts, once, as `expired`.
#[tokio::test]
async fn a_lease_that_ran_out_while_frozen_counts_as_lost() {
    use tower::ServiceExt;
    let _turn = turn().await;
    let frozen = Lock::<str>::new("frozen", Duration::from_millis(300));
    let handler = || async {
        std::thread::sleep(Duration::from_millis(700));
        tokio::task::yield_now().await;
        "done"
    };
    let app: Router = Router::new()
        .route("/jobs/{id}", post(handler))
        .route_layer(LockLayer::new(
            Store::memory(),
            frozen,
            extract::path_segment(1),
        ));
    let req = http::Request::post("/jobs/1")
        .body(axum::body::Body::empty())
        .unwrap();
    let res = app.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    // Let a heartbeat that noticed it too have its turn: it must not count it again.
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        moved(&recorded(), "tower_lease_lost_total"),
        one(
            "tower_lease_lost_total",
            "mode=exclusive,namespace=frozen,reason=expired"
        )
    );
}

/// `tower_lease_wait_seconds` samples only acquisitions that waited: one whose first attempt
/// got the lease counts as `acquired`, with no wait recorded.
#[tokio::test]
async fn a_bounded_wait_answered_at_once_records_no_wait() {
    const ACQUIRE: &str = "tower_lease_acquire_total";
    let _turn = turn().await;
    let store = Store::memory();
    let token = JOBS.try_lock_for(&store, "free", Duration::from_secs(1));
    let token = token.await.unwrap().expect("a free name");
    let at_once = recorded();
    assert_eq!(
        moved(&at_once, ACQUIRE),
        one(ACQUIRE, "mode=exclusive,namespace=jobs,outcome=acquired")
    );
    assert_eq!(
        moved(&at_once, "tower_lease_wait_seconds"),
        BTreeMap::new(),
        "no wait took place"
    );
    assert!(token.release().await.unwrap());
}
