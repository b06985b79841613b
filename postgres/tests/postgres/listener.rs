//! The listener of release notifications through its losses: a release made while the
//! listener's session is gone (terminated, and reconnecting) still wakes the waiters of a
//! `Lock` and of an `RwLock` (a reader, a writer) promptly, after the first loss and after the
//! next; a listener cut off from the server without a reset (a black hole) is found within
//! seconds and replaced, the waiters still get in while it is down, and after the heal a
//! release wakes them through notifications again.

use crate::support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::Client;
use tower_lease::{Lock, RwLock, Store};
use tower_lease_harness::PgServer;
use tower_lease_harness::proxy::{Fault, Proxy};

/// Leases far longer than the tests: a waiter gets in by a release, never by a lease's end.
const JOBS: Lock<str> = Lock::new("listener", Duration::from_secs(20));
const DOCS: RwLock<str> = RwLock::new("listener", Duration::from_secs(20));
/// How long a waiter waits: far longer than it should need.
const WAIT: Duration = Duration::from_secs(15);
/// Woken promptly: well under the second after which a waiter that trusts notifications
/// looks again by itself.
const PROMPT: Duration = Duration::from_millis(400);
/// A waiter that trusts notifications polls once a second: that, with a margin.
const POLL_BOUND: Duration = Duration::from_millis(1500);
/// How long the listener may take to find its connection dead, or to listen again.
const WITHIN: Duration = Duration::from_secs(10);

/// A store whose listener connects to `host_port` as `listener` (its `application_name`), and
/// whose pool goes straight to `server`.
async fn listening_store(server: &PgServer, host_port: SocketAddr, listener: &str) -> Store {
    let config: tokio_postgres::Config =
        format!("postgres://postgres@{host_port}/postgres?application_name={listener}")
            .parse()
            .unwrap();
    support::pg_store(server).await.listen(config).into()
}

/// The process id of a session named `listener` (other than `not`) that has sent a statement
/// (its `LISTEN`, or what it sends after), waiting up to [`WITHIN`] for one.
async fn listener_session(direct: &Client, listener: &str, not: i32) -> i32 {
    let deadline = Instant::now() + WITHIN;
    loop {
        let rows = direct
            .query(
                "SELECT pid FROM pg_stat_activity \
                 WHERE application_name = $1 AND query <> '' AND pid <> $2",
                &[&listener, &not],
            )
            .await
            .unwrap();
        if let Some(row) = rows.first() {
            return row.get(0);
        }
        assert!(
            Instant::now() < deadline,
            "no session {listener} listening within {WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Terminates the session `pid`, and waits until the server has ended it.
async fn terminate(direct: &Client, pid: i32) {
    let killed: bool = direct
        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap()
        .get(0);
    assert!(killed, "no session {pid} to terminate");
    let deadline = Instant::now() + WITHIN;
    loop {
        let left: i64 = direct
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                &[&pid],
            )
            .await
            .unwrap()
            .get(0);
        if left == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "session {pid} still there");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A waiter for `name` (a `Lock`'s, an `RwLock` reader's or writer's, by `kind`) in `store`:
/// answers when it got in (and released at once).
fn waiter(store: &Store, kind: &'static str, name: String) -> JoinHandle<Instant> {
    let store = store.clone();
    tokio::spawn(async move {
        let lost = "the waiter got in once released";
        match kind {
            "lock" => {
                let token = JOBS.try_lock_for(&store, &name, WAIT).await.unwrap();
                let at = Instant::now();
                assert!(token.expect(lost).release().await.unwrap());
                at
            }
            "reader" => {
                let token = DOCS.try_read_for(&store, &name, WAIT).await.unwrap();
                let at = Instant::now();
                assert!(token.expect(lost).release().await.unwrap());
                at
            }
            _ => {
                let token = DOCS.try_write_for(&store, &name, WAIT).await.unwrap();
                let at = Instant::now();
                assert!(token.expect(lost).release().await.unwrap());
                at
            }
        }
    })
}

/// What `holder` holds for three waiters: a `Lock`, an `RwLock`'s write (a reader waits) and
/// another's read (a writer waits), all named after `round`.
struct Held {
    lock: tower_lease::LockToken<Lock<str>>,
    write: tower_lease::LockToken<RwLock<str>>,
    read: tower_lease::ReadToken<RwLock<str>>,
}

impl Held {
    async fn take(holder: &Store, round: &str) -> Held {
        Held {
            lock: JOBS.try_lock(holder, round).await.unwrap().expect("free"),
            write: DOCS
                .try_write(holder, &format!("{round}-w"))
                .await
                .unwrap()
                .expect("free"),
            read: DOCS
                .try_read(holder, &format!("{round}-r"))
                .await
                .unwrap()
                .expect("free"),
        }
    }

    /// The waiters of all three in `store`.
    fn waiters(store: &Store, round: &str) -> Vec<(&'static str, JoinHandle<Instant>)> {
        vec![
            ("lock", waiter(store, "lock", round.to_owned())),
            ("reader", waiter(store, "reader", format!("{round}-w"))),
            ("writer", waiter(store, "writer", format!("{round}-r"))),
        ]
    }

    /// Releases all three at once; answers when all were released.
    async fn release(self) -> Instant {
        let (a, b, c) = tokio::join!(
            self.lock.release(),
            self.write.release(),
            self.read.release()
        );
        assert!(a.unwrap() && b.unwrap() && c.unwrap());
        Instant::now()
    }
}

/// Each waiter got in within `bound` of `released`.
async fn got_in_within(
    waiters: Vec<(&'static str, JoinHandle<Instant>)>,
    released: Instant,
    bound: Duration,
    when: &str,
) {
    for (kind, waiter) in waiters {
        let after = waiter.await.unwrap().saturating_duration_since(released);
        eprintln!("{when}: the {kind} waiter got in {after:?} after the release");
        assert!(
            after <= bound,
            "{when}: the {kind} waiter got in {after:?} after the release (bound {bound:?})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_while_the_listener_reconnects_wakes_the_waiters() {
    let server = support::server().await;
    let direct = support::client(&server.url()).await;
    let holder: Store = support::pg_store(&server).await.into();
    let at = SocketAddr::from((Ipv4Addr::LOCALHOST, server.port()));
    let store = listening_store(&server, at, "listener-a").await;
    let mut pid = 0;
    // The first session's loss, then a later one's.
    for round in ["first", "second"] {
        pid = listener_session(&direct, "listener-a", pid).await;
        let held = Held::take(&holder, round).await;
        let waiters = Held::waiters(&store, round);
        // Refused, and watching: from now on they trust the notifications.
        tokio::time::sleep(Duration::from_millis(300)).await;
        terminate(&direct, pid).await;
        // The listener found its session gone, and is reconnecting: the releases go unheard.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let released = held.release().await;
        got_in_within(
            waiters,
            released,
            PROMPT,
            &format!("released while the {round} session was gone"),
        )
        .await;
    }
    listener_session(&direct, "listener-a", pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_cut_off_without_a_reset_is_found_and_replaced() {
    let server = support::server().await;
    let direct = support::client(&server.url()).await;
    let holder: Store = support::pg_store(&server).await.into();
    let proxy = Proxy::start(SocketAddr::from((Ipv4Addr::LOCALHOST, server.port()))).await;
    let store = listening_store(&server, proxy.addr(), "listener-b").await;
    let pid = listener_session(&direct, "listener-b", 0).await;
    assert_eq!(
        proxy.accepted(),
        1,
        "the listener alone goes through the proxy"
    );

    // Waiters watching before the cut.
    let before_found = Held::take(&holder, "before-found").await;
    let after_found = Held::take(&holder, "after-found").await;
    let early = Held::waiters(&store, "before-found");
    let watching = Held::waiters(&store, "after-found");
    tokio::time::sleep(Duration::from_millis(300)).await;

    proxy.set(Fault::Blackhole);
    let cut = Instant::now();
    // Released before the listener can know: a waiter that trusts notifications looks again
    // within its poll.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released = before_found.release().await;
    got_in_within(early, released, POLL_BOUND, "released in the cut").await;

    // The listener finds its connection dead and tries another.
    while proxy.accepted() < 2 {
        assert!(
            cut.elapsed() < WITHIN,
            "the listener did not find its connection cut within {WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let found = cut.elapsed();
    eprintln!("the cut was found after {found:?}");
    // Down: the waiters that watched before and those that come now get in promptly.
    let later = Held::take(&holder, "while-down").await;
    let mut waiters = Held::waiters(&store, "while-down");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = later.release().await;
    got_in_within(
        waiters,
        released,
        PROMPT,
        "released while down (new waiters)",
    )
    .await;
    let released = after_found.release().await;
    got_in_within(
        watching,
        released,
        PROMPT,
        "released while down (waiters from before the cut)",
    )
    .await;

    // Healed: it listens again, and a release wakes the waiters, who trust it again.
    proxy.set(Fault::Pass);
    let healed = Instant::now();
    listener_session(&direct, "listener-b", pid).await;
    eprintln!("listening again {:?} after the heal", healed.elapsed());
    let last = Held::take(&holder, "healed").await;
    waiters = Held::waiters(&store, "healed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = last.release().await;
    got_in_within(waiters, released, PROMPT, "released after the heal").await;
}
