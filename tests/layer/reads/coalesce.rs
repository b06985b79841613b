//! Read coalescing in `RwLockLayer` over real TCP: overlapping GETs of one name share one
//! reader lease per layer (one member of the `:r` sorted set however many requests), the last
//! one out releases it, `.coalesce_reads(false)` gives each request its own; a shared lease lost
//! behind the layer's back answers `503` to every request sharing it and takes no newcomer; and
//! clients that go away leave the count right.

use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::{Extension, Router};
use http::StatusCode;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tower_lease::backend::{Acquisition, Backend, BoxFuture, Extended, LeaseRef, LockRef};
use tower_lease::store::KeyRole;
use tower_lease::{Lease, LeaseLost, RwLock, RwLockLayer, Store, extract};

use tower_lease_harness::http::{Http, Reply, serve};
use tower_lease_harness::{Backing, Gate};

const SLOW: RwLock<str> = RwLock::new("shared-docs", Duration::from_secs(2));
/// Short, so that a lost lease is found within 100 ms (the default heartbeat, a third of it).
const SHORT: RwLock<str> = RwLock::new("short-docs", Duration::from_millis(300));

tower_lease_harness::store_tests!(
    Layer: [dropped_requests_leave_the_count_right],
    redis: [
        overlapping_reads_share_one_reader_lease_per_layer,
        a_lost_shared_lease_answers_503_to_every_request_sharing_it,
        a_lost_shared_lease_takes_no_newcomer,
        a_lingering_share_is_reused_and_a_preferred_writer_ends_the_linger,
        a_write_through_the_layer_ends_its_own_lingering_share_at_once,
    ]
);

/// Stays inside until the gate opens; answers whether its lease was still held when it left.
async fn read(State(gate): State<Gate>, Extension(lease): Extension<Lease>) -> &'static str {
    gate.pass().await;
    if lease.is_held() { "held" } else { "lost" }
}

async fn write() -> &'static str {
    "written"
}

async fn app(
    layer: RwLockLayer<tower_lease::extract::PathSegment>,
    gate: &Gate,
) -> std::net::SocketAddr {
    let app = Router::new()
        .route("/docs/{id}", get(read).put(write))
        .route_layer(layer)
        .with_state(gate.clone());
    serve(app).await
}

fn get_all(addr: std::net::SocketAddr, path: &'static str, n: usize) -> Vec<JoinHandle<Reply>> {
    (0..n)
        .map(|_| tokio::spawn(async move { Http::new().get(addr, path).await }))
        .collect()
}

/// Two GETs of `path` that overlap (both inside until the gate opens), then leave: the first
/// is answered, the last one's answer waits while their share lingers. Answers that last one,
/// still on its way. Leaves the gate open.
async fn overlap_and_leave(
    addr: std::net::SocketAddr,
    path: &'static str,
    opener: &tokio::sync::watch::Sender<bool>,
    gate: &Gate,
) -> JoinHandle<Reply> {
    opener.send_replace(false);
    let mut burst = get_all(addr, path, 2);
    gate.until_inside(2).await;
    opener.send_replace(true);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while !burst.iter().any(JoinHandle::is_finished) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "neither read answered"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    burst.retain(|read| !read.is_finished());
    let last = burst
        .pop()
        .expect("the last read's answer waits while its share lingers");
    assert_eq!(burst.len(), 0);
    last
}

/// The members of the reader set of `name`: one per reader lease in Redis.
async fn readers(env: &Backing, lock: RwLock<str>, name: &str) -> usize {
    let key = env
        .raw()
        .key(KeyRole::Readers, lock.namespace(), name.as_bytes());
    env.raw().query(redis::cmd("ZCARD").arg(key)).await
}

async fn overlapping_reads_share_one_reader_lease_per_layer(env: Backing) {
    let (opener, gate) = Gate::new();
    let layer = || RwLockLayer::new(env.store.clone(), SLOW, extract::path_segment(1));
    // Two layers: two processes, as far as sharing goes.
    let (one, two) = (app(layer(), &gate).await, app(layer(), &gate).await);
    let apart = app(layer().coalesce_reads(false), &gate).await;

    let mut reads = get_all(one, "/docs/a", 5);
    reads.extend(get_all(two, "/docs/a", 5));
    reads.extend(get_all(one, "/docs/b", 3));
    reads.extend(get_all(apart, "/docs/c", 4));
    gate.until_inside(17).await;
    assert_eq!(readers(&env, SLOW, "a").await, 2, "one lease per layer");
    assert_eq!(readers(&env, SLOW, "b").await, 1, "one lease per name");
    assert_eq!(readers(&env, SLOW, "c").await, 4, "one lease per request");
    // A shared lease refuses a writer like any reader's.
    let refused = Http::new().put(one, "/docs/a").await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{refused:?}");

    opener.send_replace(true);
    for read in reads {
        let reply = read.await.unwrap();
        assert_eq!((reply.status, reply.text()), (StatusCode::OK, "held"));
    }
    // Every read released its lease, or its part in a share, before it was answered: the
    // last read of each share answered once the share was released.
    for name in ["a", "b", "c"] {
        let key = env
            .raw()
            .key(KeyRole::Readers, SLOW.namespace(), name.as_bytes());
        assert!(!env.raw().exists(&key).await, "{name}'s readers are gone");
    }
    assert_eq!(Http::new().put(two, "/docs/a").await.text(), "written");
}

async fn a_lost_shared_lease_answers_503_to_every_request_sharing_it(env: Backing) {
    let (_opener, gate) = Gate::new();
    let layer = RwLockLayer::new(env.store.clone(), SHORT, extract::path_segment(1));
    let addr = app(layer, &gate).await;
    let reads = get_all(addr, "/docs/a", 4);
    gate.until_inside(4).await;
    assert_eq!(readers(&env, SHORT, "a").await, 1);

    assert!(
        env.raw()
            .delete(KeyRole::Readers, SHORT.namespace(), b"a")
            .await
    );
    // The next extension (within a beat, 100 ms) finds the lease gone; the gate stays shut.
    let all = async {
        let mut replies = Vec::new();
        for read in reads {
            replies.push(read.await.unwrap());
        }
        replies
    };
    let replies = tokio::time::timeout(Duration::from_secs(2), all)
        .await
        .expect("every request sharing the lost lease is answered");
    for reply in replies {
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
        assert_eq!(
            reply.problem()["type"],
            "urn:tower-lease:lease-lost",
            "{reply:?}"
        );
    }
}

async fn a_lost_shared_lease_takes_no_newcomer(env: Backing) {
    let (opener, gate) = Gate::new();
    let layer = RwLockLayer::new(env.store.clone(), SHORT, extract::path_segment(1))
        .on_lease_lost(LeaseLost::Continue);
    let addr = app(layer, &gate).await;
    let first = get_all(addr, "/docs/a", 3);
    gate.until_inside(3).await;
    assert!(
        env.raw()
            .delete(KeyRole::Readers, SHORT.namespace(), b"a")
            .await
    );
    // Two beats and then some: the heartbeat has found the loss.
    tokio::time::sleep(Duration::from_millis(400)).await;

    // A newcomer takes a lease of its own instead of joining the lost one.
    let late = get_all(addr, "/docs/a", 1);
    gate.until_inside(4).await;
    assert_eq!(readers(&env, SHORT, "a").await, 1, "a fresh lease");
    opener.send_replace(true);
    for read in first {
        let reply = read.await.unwrap();
        assert_eq!((reply.status, reply.text()), (StatusCode::OK, "lost"));
    }
    for read in late {
        let reply = read.await.unwrap();
        assert_eq!((reply.status, reply.text()), (StatusCode::OK, "held"));
    }
}

async fn dropped_requests_leave_the_count_right(env: Backing) {
    let (opener, gate) = Gate::new();
    let layer = RwLockLayer::new(env.store.clone(), SLOW, extract::path_segment(1));
    let addr = app(layer, &gate).await;
    // Two clients that go away mid-request, one that stays.
    let mut gone = Vec::new();
    for _ in 0..2 {
        let mut client = TcpStream::connect(addr).await.unwrap();
        let request = "GET /docs/a HTTP/1.1\r\nhost: test\r\n\r\n";
        client.write_all(request.as_bytes()).await.unwrap();
        gone.push(client);
    }
    gate.until_inside(2).await;
    let stays = get_all(addr, "/docs/a", 1);
    gate.until_inside(3).await;
    drop(gone);
    gate.until_inside(1).await;

    // The one left still holds the shared lease: the dropped two did not release it.
    let http = Http::new();
    let refused = http.put(addr, "/docs/a").await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{refused:?}");
    assert!(SLOW.try_write(&env.store, "a").await.unwrap().is_none());

    // And its end releases it: the count went 3, 2, 1, 0.
    opener.send_replace(true);
    let reply = stays.into_iter().next().unwrap().await.unwrap();
    assert_eq!((reply.status, reply.text()), (StatusCode::OK, "held"));
    assert_eq!(http.put(addr, "/docs/a").await.text(), "written");
}

/// The members of the reader set of `name`: the secrets of its reader leases.
async fn reader_secrets(env: &Backing, lock: RwLock<str>, name: &str) -> Vec<Vec<u8>> {
    let key = env
        .raw()
        .key(KeyRole::Readers, lock.namespace(), name.as_bytes());
    env.raw()
        .query(redis::cmd("ZRANGE").arg(key).arg(0).arg(-1))
        .await
}

/// With `.linger_reads(..)`, a share whose last request left keeps its reader lease for the
/// linger, and that request's answer waits: a GET that comes meanwhile joins the share (the
/// same member in the reader set, no new acquisition) and the waiting answer goes out at once.
/// A refused writer of a writer-preferred lock elsewhere (another layer: another process) ends
/// the linger at once: the last read is answered, its lease released, and the writer's next
/// attempt, well within the linger, gets in.
async fn a_lingering_share_is_reused_and_a_preferred_writer_ends_the_linger(env: Backing) {
    const LINGER: Duration = Duration::from_millis(400);
    const PREFERRED: RwLock<str> = RwLock::new("lingering-docs", Duration::from_secs(6))
        .fairness(tower_lease::Fairness::WritersFirst);
    let (opener, gate) = Gate::new();
    opener.send_replace(true);
    let layer = || RwLockLayer::new(env.store.clone(), PREFERRED, extract::path_segment(1));
    let addr = app(layer().linger_reads(LINGER), &gate).await;
    let elsewhere = app(layer(), &gate).await;
    let http = Http::new();

    let started = tokio::time::Instant::now();
    let first = overlap_and_leave(addr, "/docs/a", &opener, &gate).await;
    let secrets = reader_secrets(&env, PREFERRED, "a").await;
    assert_eq!(secrets.len(), 1, "the share lingers with its lease");
    opener.send_replace(false);
    let second = get_all(addr, "/docs/a", 1).pop().unwrap();
    gate.until_inside(1).await;
    assert_eq!(first.await.unwrap().text(), "held");
    assert!(
        started.elapsed() < LINGER,
        "answered after {:?}, once the next read took the share over",
        started.elapsed()
    );
    assert_eq!(
        reader_secrets(&env, PREFERRED, "a").await,
        secrets,
        "the next read joined the lingering share"
    );

    let refused = http.put(elsewhere, "/docs/a").await;
    assert_eq!(refused.status, StatusCode::CONFLICT, "{refused:?}");
    let left = tokio::time::Instant::now();
    opener.send_replace(true);
    assert_eq!(second.await.unwrap().text(), "held");
    assert!(reader_secrets(&env, PREFERRED, "a").await.is_empty());
    let written = http.put(elsewhere, "/docs/a").await;
    assert_eq!(written.text(), "written", "{written:?}");
    assert!(
        left.elapsed() < LINGER,
        "in after {:?}, within the linger",
        left.elapsed()
    );
}

/// A write through the layer ends the layer's own idle share of the name before it asks the
/// store: it gets in at once, however long the linger; the last read's answer, which waited
/// for the share to settle, goes out with the release; the reader lease is gone.
async fn a_write_through_the_layer_ends_its_own_lingering_share_at_once(env: Backing) {
    const DOCS: RwLock<str> = RwLock::new("idle-docs", Duration::from_secs(6));
    let (opener, gate) = Gate::new();
    opener.send_replace(true);
    let layer = RwLockLayer::new(env.store.clone(), DOCS, extract::path_segment(1));
    // Kept at most a quarter of a beat: 500 ms.
    let addr = app(layer.linger_reads(Duration::from_secs(5)), &gate).await;
    let http = Http::new();

    let started = tokio::time::Instant::now();
    let read = overlap_and_leave(addr, "/docs/w", &opener, &gate).await;
    assert_eq!(reader_secrets(&env, DOCS, "w").await.len(), 1, "lingering");
    let written = http.put(addr, "/docs/w").await;
    assert_eq!(written.text(), "written", "{written:?}");
    assert!(read.is_finished(), "the read answered before the write ran");
    assert_eq!(read.await.unwrap().text(), "held");
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "in after {:?}, not after the linger",
        started.elapsed()
    );
    assert!(reader_secrets(&env, DOCS, "w").await.is_empty());
    assert_eq!(
        http.get(addr, "/docs/w").await.text(),
        "held",
        "reads go on"
    );
}

/// A waiting write whose client goes away while the layer's idle share is being released still
/// sends that release to its end: no reader lease is left to block writers for its TTL.
#[tokio::test]
async fn a_dropped_write_still_releases_the_idle_share_it_ended() {
    const DOCS: RwLock<str> = RwLock::new("slow-release-docs", Duration::from_secs(5));
    let (opener, gate) = Gate::new();
    opener.send_replace(true);
    let memory = Store::memory();
    let slow = Store::from_backend(SlowReleases(memory.clone()));
    let layer = RwLockLayer::new(slow, DOCS, extract::path_segment(1))
        .linger_reads(Duration::from_secs(5))
        .max_wait(Duration::from_secs(2));
    let addr = app(layer, &gate).await;
    // The last read's answer waits for its share to settle; meanwhile the share lingers.
    let _read = overlap_and_leave(addr, "/docs/r", &opener, &gate).await;
    assert!(
        DOCS.try_write(&memory, "r").await.unwrap().is_none(),
        "the share lingers"
    );

    // The write ends the idle share, and its client leaves while that release is on its way.
    let mut client = TcpStream::connect(addr).await.unwrap();
    let request = "PUT /docs/r HTTP/1.1\r\nhost: test\r\ncontent-length: 0\r\n\r\n";
    client.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(SlowReleases::DELAY / 3).await;
    drop(client);
    tokio::time::sleep(SlowReleases::DELAY * 2).await;
    let written = DOCS.try_write(&memory, "r").await.unwrap();
    assert!(
        written.is_some(),
        "the reader lease was released, not left for its TTL"
    );
}

/// The memory store, each release answered `DELAY` late (and sent only then).
struct SlowReleases(Store);

impl SlowReleases {
    const DELAY: Duration = Duration::from_millis(300);
}

impl Backend for SlowReleases {
    fn acquire<'a>(
        &'a self,
        lease: LeaseRef<'a>,
    ) -> BoxFuture<'a, tower_lease::Result<Acquisition>> {
        self.0.backend().acquire(lease)
    }

    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, tower_lease::Result<Extended>> {
        self.0.backend().extend(lease)
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, tower_lease::Result<bool>> {
        Box::pin(async move {
            tokio::time::sleep(Self::DELAY).await;
            self.0.backend().release(lease).await
        })
    }

    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, tower_lease::Result<u32>> {
        self.0.backend().in_use(lock)
    }
}
