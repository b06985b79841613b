//! The lease while a request runs, over real TCP: the heartbeat keeps a short lease through a
//! long handler (and a body the client does not read), a lost lease cancels the handler,
//! `max_hold` ends a stuck one, and a frozen process does not answer 200.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::routing::post;
use axum::{Extension, Router};
use http::StatusCode;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tower_lease::backend::Acquisition;
use tower_lease::store::KeyRole;
use tower_lease::{Lease, LeaseLost, Lock, LockLayer, Store, extract};

use tower_lease_harness::hooked::hooked;
use tower_lease_harness::http::{Chunks, Http, Reply, serve};
use tower_lease_harness::{Backing, DropFlag, Holders};

const SHORT: Lock<str> = Lock::new("short", Duration::from_millis(300));

tower_lease_harness::store_tests!(
    Layer: [
        a_300ms_lease_lasts_through_a_2s_handler,
        a_300ms_lease_lasts_while_the_client_does_not_read_the_body,
        max_hold_ends_a_handler_that_never_finishes,
        a_frozen_process_does_not_answer_200,
        a_frozen_process_never_takes_its_next_step,
    ]
);

mod redis_only {
    use tower_lease_harness::{Backing, Setup};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_lease_cancels_the_handler() {
        super::a_lost_lease_cancels_the_handler(Backing::redis(Setup::Layer).await).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lost_lease_is_signalled_under_continue() {
        super::a_lost_lease_is_signalled_under_continue(Backing::redis(Setup::Layer).await).await
    }
}

fn layer(store: &Store) -> LockLayer<extract::PathSegment> {
    LockLayer::new(store.clone(), SHORT, extract::path_segment(1))
}

/// Asks replica `addr` for `path` every 50 ms until `finished` is set, expecting 409 each time;
/// answers how many times it asked, or the first other answer and after how many checks it came.
///
/// `finished` is the holder's alone: its handler sets it before answering, and the lease is
/// released after that, so a 200 is only allowed once it is set. A 200 before then is a second
/// holder.
async fn always_held(
    addr: std::net::SocketAddr,
    path: &str,
    finished: &AtomicBool,
) -> Result<usize, (usize, Reply)> {
    let http = Http::new();
    let mut asked = 0;
    while !finished.load(Ordering::SeqCst) {
        let reply = http.post(addr, path).await;
        if reply.status == StatusCode::OK && finished.load(Ordering::SeqCst) {
            break;
        }
        if reply.status != StatusCode::CONFLICT {
            return Err((asked, reply));
        }
        asked += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(asked)
}

/// What a 2 s request on one replica got, and what was seen meanwhile on a second replica.
#[derive(Debug)]
struct Watched {
    /// The 2 s request's answer, and how long it took.
    reply: Reply,
    took: Duration,
    /// What [`always_held`] found on the second replica while the first handler ran.
    checks: Result<usize, (usize, Reply)>,
    /// The most handlers inside at once, over both replicas.
    most_inside: usize,
}

/// Two replicas of one service on `store`: the first's handler works 2 s under a 300 ms lease,
/// the second's answers at once. While the first holds the lease, a checker asks the second.
async fn watch_a_2s_holder(store: &Store) -> Watched {
    let started = Arc::new(Notify::new());
    let holders = Holders::default();
    let app = |work: Duration, finished: Arc<AtomicBool>| {
        let (started, holders) = (started.clone(), holders.clone());
        Router::new()
            .route(
                "/jobs/{id}",
                post(move || async move {
                    let _inside = holders.enter();
                    started.notify_one();
                    tokio::time::sleep(work).await;
                    finished.store(true, Ordering::SeqCst);
                    "slow"
                }),
            )
            .route_layer(layer(store))
    };
    // Each replica's handler has a flag of its own: the checker waits for the holder's only.
    let finished = Arc::new(AtomicBool::new(false));
    let first = serve(app(Duration::from_secs(2), finished.clone())).await;
    let second = serve(app(Duration::ZERO, Arc::default())).await;

    let begun = Instant::now();
    let slow = tokio::spawn(async move { Http::new().post(first, "/jobs/1").await });
    started.notified().await;
    let checker = tokio::spawn(async move { always_held(second, "/jobs/1", &finished).await });
    let reply = slow.await.unwrap();
    let took = begun.elapsed();
    Watched {
        reply,
        took,
        checks: checker.await.unwrap(),
        most_inside: holders.most(),
    }
}

async fn a_300ms_lease_lasts_through_a_2s_handler(env: Backing) {
    let watched = watch_a_2s_holder(&env.store).await;
    let reply = &watched.reply;
    assert_eq!(
        (reply.status, reply.text()),
        (StatusCode::OK, "slow"),
        "{reply:?}"
    );
    assert!(watched.took >= Duration::from_secs(2));
    let checks = watched.checks.unwrap_or_else(|(asked, reply)| {
        panic!("after {asked} checks, while the holder was inside: {reply:?}")
    });
    assert!(checks >= 10, "only {checks} checks in 2 s");
    assert_eq!(watched.most_inside, 1, "two handlers inside at once");
    // Released before the response: free at once.
    assert!(SHORT.try_lock(&env.store, "1").await.unwrap().is_some());
}

/// The checks of `a_300ms_lease_lasts_through_a_2s_handler` can fail: on a store that lets a
/// second holder in 1 s into the 2 s request, both see it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_holder_is_seen_on_a_store_that_lets_everyone_in() {
    // A broken store: from 1 s on, every acquisition answers "acquired", whoever holds the
    // lease, as if the holder's lease had been lost without anyone noticing.
    let from = Instant::now() + Duration::from_secs(1);
    let store = hooked(Store::memory(), move |answer| {
        if Instant::now() < from {
            return answer;
        }
        Acquisition::Acquired { fence: None }
    });
    let watched = watch_a_2s_holder(&store).await;
    assert_eq!(watched.reply.status, StatusCode::OK, "{watched:?}");
    assert_eq!(watched.most_inside, 2, "{watched:?}");
    let (asked, seen) = watched
        .checks
        .expect_err("the checker saw no second holder");
    assert_eq!(
        seen.status,
        StatusCode::OK,
        "after {asked} checks: {seen:?}"
    );
}

async fn a_300ms_lease_lasts_while_the_client_does_not_read_the_body(env: Backing) {
    // 32 MiB: far more than the socket buffers, so the server blocks writing it and stops
    // polling the body while the client does not read.
    const CHUNKS: usize = 512;
    let app = Router::new()
        .route(
            "/export/{id}",
            post(|| async { Body::new(Chunks::new(CHUNKS, CHUNK)) }),
        )
        .route_layer(layer(&env.store).hold_through_body());
    let first = serve(app.clone()).await;
    let second = serve(app).await;

    let mut client = TcpStream::connect(first).await.unwrap();
    let request =
        "POST /export/1 HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
    client.write_all(request.as_bytes()).await.unwrap();
    let mut head = [0u8; 12];
    client.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");

    // Two seconds of not reading: the lease must stay held the whole time, and the checker
    // must have asked often enough to tell.
    let two_seconds_passed = AtomicBool::new(false);
    let (checks, ()) = tokio::join!(
        always_held(second, "/export/1", &two_seconds_passed),
        async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            two_seconds_passed.store(true, Ordering::SeqCst);
        }
    );
    let checks = checks.unwrap_or_else(|(asked, reply)| {
        panic!("after {asked} checks, while the client did not read: {reply:?}")
    });
    assert!(checks >= 10, "only {checks} checks in 2 s");

    // Read to the end: the terminating chunk comes only after the release.
    let mut rest = Vec::new();
    client.read_to_end(&mut rest).await.unwrap();
    assert!(
        rest.len() > CHUNK * CHUNKS,
        "body cut short: {} bytes",
        rest.len()
    );
    assert!(rest.ends_with(b"0\r\n\r\n"), "no terminating chunk");
    assert_eq!(
        Http::new().post(second, "/export/1").await.status,
        StatusCode::OK
    );
}

const CHUNK: usize = 64 * 1024;

async fn a_lost_lease_cancels_the_handler(env: Backing) {
    const LOCK: Lock<str> = Lock::new("lost", Duration::from_secs(1));
    let started = Arc::new(Notify::new());
    let (dropped, finished) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let handler = {
        let (started, dropped, finished) = (started.clone(), dropped.clone(), finished.clone());
        move || async move {
            let _flag = DropFlag(dropped);
            started.notify_one();
            tokio::time::sleep(Duration::from_secs(5)).await;
            finished.store(true, Ordering::SeqCst);
            "finished"
        }
    };
    let app = Router::new()
        .route("/jobs/{id}", post(handler))
        .route_layer(LockLayer::new(
            env.store.clone(),
            LOCK,
            extract::path_segment(1),
        ));
    let addr = serve(app).await;

    let reply = tokio::spawn(async move { Http::new().post(addr, "/jobs/9").await });
    started.notified().await;
    assert!(
        env.raw().delete(KeyRole::Lock, "lost", b"9").await,
        "the lease's key was not there"
    );
    let deleted = Instant::now();
    let reply = reply.await.unwrap();
    let took = deleted.elapsed();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(reply.problem()["type"], "urn:tower-lease:lease-lost");
    // The lost lease was given back: a client that retries may do so at once.
    assert_eq!(reply.retry_after(), Some(1), "{reply:?}");
    // The next extend (every 333 ms) finds the key gone.
    assert!(
        took < Duration::from_millis(1500),
        "took {took:?} to notice"
    );
    assert!(
        dropped.load(Ordering::SeqCst),
        "the handler was not dropped"
    );
    assert!(!finished.load(Ordering::SeqCst));
}

async fn a_lost_lease_is_signalled_under_continue(env: Backing) {
    const LOCK: Lock<str> = Lock::new("lost", Duration::from_secs(1));
    let started = Arc::new(Notify::new());
    let handler = {
        let started = started.clone();
        move |Extension(lease): Extension<Lease>| async move {
            assert!(lease.is_held());
            started.notify_one();
            tokio::select! {
                () = lease.lost() => format!("lost, held: {}", lease.is_held()),
                () = tokio::time::sleep(Duration::from_secs(5)) => "not lost".to_owned(),
            }
        }
    };
    let app = Router::new()
        .route("/jobs/{id}", post(handler))
        .route_layer(
            LockLayer::new(env.store.clone(), LOCK, extract::path_segment(1))
                .on_lease_lost(LeaseLost::Continue),
        );
    let addr = serve(app).await;

    let reply = tokio::spawn(async move { Http::new().post(addr, "/jobs/9").await });
    started.notified().await;
    assert!(env.raw().delete(KeyRole::Lock, "lost", b"9").await);
    let deleted = Instant::now();
    let reply = reply.await.unwrap();
    assert!(deleted.elapsed() < Duration::from_millis(1500));
    assert_eq!(
        (reply.status, reply.text()),
        (StatusCode::OK, "lost, held: false")
    );
}

async fn max_hold_ends_a_handler_that_never_finishes(env: Backing) {
    let dropped = Arc::new(AtomicBool::new(false));
    let handler = {
        let dropped = dropped.clone();
        move || async move {
            let _flag = DropFlag(dropped);
            std::future::pending::<&'static str>().await
        }
    };
    let max_hold = Duration::from_millis(400);
    let app = Router::new()
        .route("/jobs/{id}", post(handler))
        .route_layer(layer(&env.store).max_hold(max_hold));
    let addr = serve(app).await;

    let begun = Instant::now();
    let reply = Http::new().post(addr, "/jobs/3").await;
    let took = begun.elapsed();
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(reply.problem()["type"], "urn:tower-lease:lease-lost");
    // The lost lease was given back: a client that retries may do so at once.
    assert_eq!(reply.retry_after(), Some(1), "{reply:?}");
    // Not before max_hold, and within max_hold + one TTL (plus slack for a loaded machine).
    assert!(took >= max_hold, "ended after {took:?}");
    assert!(
        took < max_hold + SHORT.ttl() + Duration::from_millis(700),
        "ended after {took:?}"
    );
    assert!(dropped.load(Ordering::SeqCst));
    // The lease is gone (run out, or released by the dropped guard).
    assert!(SHORT.try_lock(&env.store, "3").await.unwrap().is_some());
}

/// Serves `app` for 5 s on a single-threaded runtime of its own, which a handler that blocks
/// freezes whole (the heartbeat included), as `SIGSTOP` freezes a process.
async fn serve_on_a_runtime_of_its_own(app: Router) -> std::net::SocketAddr {
    let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            addr_tx.send(listener.local_addr().unwrap()).unwrap();
            let serve = axum::serve(listener, app);
            let _ = tokio::time::timeout(Duration::from_secs(5), serve).await;
        });
    });
    addr_rx.await.unwrap()
}

async fn a_frozen_process_does_not_answer_200(env: Backing) {
    // The handler freezes its runtime past the 300 ms lease: the heartbeat cannot run, and the
    // layer must notice at completion.
    let handler = || async {
        std::thread::sleep(Duration::from_millis(700));
        "frozen"
    };
    let app = Router::new()
        .route("/jobs/{id}", post(handler))
        .route_layer(LockLayer::new(
            env.store.clone(),
            SHORT,
            extract::path_segment(1),
        ));
    let addr = serve_on_a_runtime_of_its_own(app).await;
    let reply = Http::new().post(addr, "/jobs/5").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(reply.problem()["type"], "urn:tower-lease:lease-lost");
    // The lost lease was given back: a client that retries may do so at once.
    assert_eq!(reply.retry_after(), Some(1), "{reply:?}");
}

async fn a_frozen_process_never_takes_its_next_step(env: Backing) {
    // As above, but the handler has a step after the freeze: waking past its 300 ms lease, the
    // process must not poll the handler again, or it would write after another holder got in.
    let stepped = Arc::new(AtomicBool::new(false));
    let handler = {
        let stepped = stepped.clone();
        move || async move {
            std::thread::sleep(Duration::from_millis(700));
            // The next step, after an await that returns at once.
            tokio::task::yield_now().await;
            stepped.store(true, Ordering::SeqCst);
            "stepped"
        }
    };
    let app = Router::new()
        .route("/jobs/{id}", post(handler))
        .route_layer(LockLayer::new(
            env.store.clone(),
            SHORT,
            extract::path_segment(1),
        ));
    let addr = serve_on_a_runtime_of_its_own(app).await;
    let reply = Http::new().post(addr, "/jobs/6").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert_eq!(reply.problem()["type"], "urn:tower-lease:lease-lost");
    // The lost lease was given back: a client that retries may do so at once.
    assert_eq!(reply.retry_after(), Some(1), "{reply:?}");
    assert!(
        !stepped.load(Ordering::SeqCst),
        "the handler took its next step after its lease ran out"
    );
}
