//! `SemaphoreLayer` over real TCP: at most K requests per name run at once, the rest get `429`
//! with `Retry-After`; per-request limits; waiting for a permit; the heartbeat and a lost permit;
//! and a cancellation storm that leaves no permit behind.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use http::{HeaderMap, Method, Request, StatusCode};
use tower_lease::rejection::{Reason, Rejection};
use tower_lease::store::KeyRole;
use tower_lease::{Semaphore, SemaphoreLayer, extract};

use tower_lease_harness::http::{Http, Reply, serve};
use tower_lease_harness::{Backing, Witness, poll};

const EXPORTS: Semaphore<str> = Semaphore::new("export", 2, Duration::from_secs(5));

tower_lease_harness::store_tests!(
    Layer: [
        at_most_k_requests_run_at_once_and_the_rest_get_429,
        each_request_can_carry_its_own_limit,
        a_waiting_request_gets_the_permit_a_release_frees,
        the_heartbeat_keeps_a_permit_past_its_ttl,
        a_cancellation_storm_leaves_no_permit_behind,
    ],
    redis: [a_permit_lost_behind_the_layers_back_answers_503]
);

/// Works for the `x-work-ms` header's milliseconds, counted by the witness (out again when
/// the handler ends or is dropped).
async fn work(State(witness): State<Witness>, headers: HeaderMap) -> &'static str {
    let _inside = witness.enter();
    let ms = headers
        .get("x-work-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    "done"
}

/// The route every test serves; the caller adds its layer and the witness.
fn routes() -> Router<Witness> {
    Router::new().route("/exports/{tenant}", post(work))
}

async fn send(
    http: &Http,
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &[u8])],
) -> Reply {
    http.send(addr, Method::POST, path, headers).await
}

async fn at_most_k_requests_run_at_once_and_the_rest_get_429(env: Backing) {
    let witness = Witness::default();
    let layer = SemaphoreLayer::new(env.store.clone(), EXPORTS, extract::path_segment(1));
    let addr = serve(routes().route_layer(layer).with_state(witness.clone())).await;
    let http = Http::new();
    let requests: Vec<_> = (0..6)
        .map(|_| {
            let http = http.clone();
            tokio::spawn(async move {
                send(&http, addr, "/exports/acme", &[("x-work-ms", b"1500")]).await
            })
        })
        .collect();
    let mut ok = 0;
    for request in requests {
        let reply = request.await.unwrap();
        match reply.status {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                let problem = reply.problem();
                assert_eq!(problem["type"], "urn:tower-lease:concurrency-limit");
                assert_eq!(problem["namespace"], "export");
                let retry_after = reply.retry_after().expect("Retry-After on 429");
                assert!((1..=5).contains(&retry_after), "Retry-After {retry_after}");
            }
            other => panic!("unexpected {other}: {reply:?}"),
        }
    }
    assert_eq!(ok, 2, "two permits, six requests at once");
    assert_eq!(witness.most(), 2);
    // Released before each response went out.
    assert_eq!(EXPORTS.in_use(&env.store, "acme").await.unwrap(), 0);
    // Another name has permits of its own.
    assert_eq!(
        send(&http, addr, "/exports/other", &[]).await.status,
        StatusCode::OK
    );
}

async fn each_request_can_carry_its_own_limit(env: Backing) {
    let witness = Witness::default();
    let plan = |req: &Request<axum::body::Body>| match req.headers().get("x-plan") {
        Some(plan) => plan.to_str().unwrap().parse().unwrap(),
        None => 2,
    };
    let refusals = Arc::new(std::sync::Mutex::new(Vec::new()));
    let hook = {
        let refusals = refusals.clone();
        move |rejection: &Rejection| {
            refusals.lock().unwrap().push(rejection.reason());
            rejection.problem_response()
        }
    };
    let layer = SemaphoreLayer::new(env.store.clone(), EXPORTS, extract::path_segment(1))
        .permits(plan)
        .full_status(StatusCode::CONFLICT)
        .on_rejection(hook);
    let addr = serve(routes().route_layer(layer).with_state(witness.clone())).await;
    let http = Http::new();
    let _held = EXPORTS
        .try_acquire(&env.store, "acme")
        .await
        .unwrap()
        .unwrap();

    let small = send(&http, addr, "/exports/acme", &[("x-plan", b"1")]).await;
    assert_eq!(small.status, StatusCode::CONFLICT, "{small:?}");
    assert!(
        small.problem()["detail"]
            .as_str()
            .unwrap()
            .contains("All 1 permits")
    );
    let large = send(&http, addr, "/exports/acme", &[("x-plan", b"3")]).await;
    assert_eq!(large.status, StatusCode::OK, "{large:?}");
    let none = send(&http, addr, "/exports/acme", &[("x-plan", b"0")]).await;
    assert_eq!(none.status, StatusCode::BAD_REQUEST, "{none:?}");
    assert_eq!(
        none.problem()["type"],
        "urn:tower-lease:invalid-concurrency-limit"
    );
    let bad_name = send(&http, addr, "/exports/%7Bx%7D", &[]).await;
    assert_eq!(bad_name.status, StatusCode::BAD_REQUEST, "{bad_name:?}");

    assert_eq!(witness.runs(), 1);
    assert_eq!(
        EXPORTS.in_use(&env.store, "acme").await.unwrap(),
        1,
        "only ours"
    );
    let refusals = refusals.lock().unwrap();
    assert!(
        matches!(refusals[0], Reason::Full { limit: 1, .. }),
        "{refusals:?}"
    );
    assert_eq!(refusals[1], Reason::InvalidLimit);
    assert_eq!(refusals[2], Reason::InvalidName);
}

async fn a_waiting_request_gets_the_permit_a_release_frees(env: Backing) {
    let witness = Witness::default();
    let one = EXPORTS.with_permits(1).unwrap();
    // The extractor marks the request's arrival at the layer: until then, "it did not run"
    // would say nothing.
    let arrived = Arc::new(AtomicUsize::new(0));
    let extractor = {
        let arrived = arrived.clone();
        move |req: &Request<axum::body::Body>| {
            arrived.fetch_add(1, Ordering::SeqCst);
            req.uri().path().strip_prefix("/exports/").map(String::from)
        }
    };
    let layer =
        SemaphoreLayer::new(env.store.clone(), one, extractor).max_wait(Duration::from_secs(3));
    let addr = serve(routes().route_layer(layer).with_state(witness.clone())).await;
    let held = one.try_acquire(&env.store, "acme").await.unwrap().unwrap();
    let request = tokio::spawn(async move {
        let reply = send(&Http::new(), addr, "/exports/acme", &[]).await;
        (reply, Instant::now())
    });
    let every = Duration::from_millis(5);
    let at_layer = poll(every, Duration::from_secs(5), || async {
        (arrived.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    assert!(at_layer.is_some(), "the request never reached the layer");
    // Long enough for a waiter that ignored the limit to have run (its first attempt is
    // at once, its polls a few ms apart).
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(witness.runs(), 0, "ran beside the holder");
    let released = Instant::now();
    assert!(held.release().await.unwrap());
    let (reply, answered) = request.await.unwrap();
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    let after = answered - released;
    assert!(
        after < Duration::from_millis(500),
        "answered {after:?} after the release"
    );
}

async fn the_heartbeat_keeps_a_permit_past_its_ttl(env: Backing) {
    let witness = Witness::default();
    let short = Semaphore::<str>::new("export", 1, Duration::from_millis(300));
    let layer = SemaphoreLayer::new(env.store.clone(), short, extract::path_segment(1));
    let addr = serve(routes().route_layer(layer).with_state(witness.clone())).await;
    let request = tokio::spawn(async move {
        send(
            &Http::new(),
            addr,
            "/exports/acme",
            &[("x-work-ms", b"1000")],
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(witness.inside(), 1);
    assert_eq!(
        short.in_use(&env.store, "acme").await.unwrap(),
        1,
        "the permit lapsed"
    );
    assert!(
        short
            .try_acquire(&env.store, "acme")
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(request.await.unwrap().status, StatusCode::OK);
    assert_eq!(short.in_use(&env.store, "acme").await.unwrap(), 0);
}

async fn a_permit_lost_behind_the_layers_back_answers_503(env: Backing) {
    let witness = Witness::default();
    let short = Semaphore::<str>::new("export", 2, Duration::from_millis(600));
    let layer = SemaphoreLayer::new(env.store.clone(), short, extract::path_segment(1));
    let addr = serve(routes().route_layer(layer).with_state(witness.clone())).await;
    let request = tokio::spawn(async move {
        send(
            &Http::new(),
            addr,
            "/exports/acme",
            &[("x-work-ms", b"3000")],
        )
        .await
    });
    poll(
        Duration::from_millis(10),
        Duration::from_secs(2),
        || async { (witness.inside() == 1).then_some(()) },
    )
    .await;
    assert!(env.raw().delete(KeyRole::Permits, "export", b"acme").await);
    let deleted = Instant::now();
    let reply = request.await.unwrap();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(reply.problem()["type"], "urn:tower-lease:lease-lost");
    assert!(
        deleted.elapsed() < Duration::from_millis(1500),
        "noticed after {:?}",
        deleted.elapsed()
    );
    assert_eq!(witness.inside(), 0, "the handler still runs");
}

async fn a_cancellation_storm_leaves_no_permit_behind(env: Backing) {
    let witness = Witness::default();
    let layer = SemaphoreLayer::new(
        env.store.clone(),
        EXPORTS.with_permits(50).unwrap(),
        extract::path_segment(1),
    )
    .max_wait(Duration::from_millis(200));
    let addr = serve(routes().route_layer(layer).with_state(witness.clone())).await;
    let http = Http::new();
    let (cut_holders, holders_cut) = tokio::sync::watch::channel(false);
    let requests: Vec<_> = (0..150u64)
        .map(|i| {
            let (http, mut holders_cut) = (http.clone(), holders_cut.clone());
            let path = format!("/exports/t{}", i % 3);
            tokio::spawn(async move {
                // Half are cut while their handler works (surely holding a permit), half at a
                // point before, while waiting for, during or after the acquisition.
                let (cut, work) = match i % 2 {
                    0 => (None, 5_000),
                    _ => (
                        Some(Duration::from_millis(1 + (i * 7) % 60)),
                        (i * 13) % 100,
                    ),
                };
                let work = work.to_string();
                let headers = [("x-work-ms", work.as_bytes())];
                let send = http.send(addr, Method::POST, &path, &headers);
                match cut {
                    Some(cut) => drop(tokio::time::timeout(cut, send).await),
                    None => tokio::select! {
                        _ = send => {}
                        _ = holders_cut.wait_for(|cut| *cut) => {}
                    },
                }
            })
        })
        .collect();
    // The holders are cut once 30 handlers run at once (or after 5 s, whatever ran).
    poll(
        Duration::from_millis(10),
        Duration::from_secs(5),
        || async { (witness.inside() >= 30).then_some(()) },
    )
    .await;
    cut_holders.send(true).unwrap();
    for request in requests {
        request.await.unwrap();
    }
    let most = witness.most();
    assert!(most >= 30, "only {most} requests held a permit at once");
    // The permits last 5 s: only their releases can free them this soon.
    for tenant in ["t0", "t1", "t2"] {
        let store = env.store.clone();
        poll(Duration::from_millis(20), Duration::from_secs(2), || {
            let store = store.clone();
            async move {
                let in_use = EXPORTS.in_use(&store, tenant).await.unwrap();
                (in_use == 0).then_some(())
            }
        })
        .await;
        assert_eq!(
            EXPORTS.in_use(&env.store, tenant).await.unwrap(),
            0,
            "{tenant}"
        );
        if env.is_redis() {
            let key = env.raw().key(KeyRole::Permits, "export", tenant.as_bytes());
            assert!(
                !env.raw().exists(&key).await,
                "{tenant}'s permit set is left"
            );
        }
    }
}
