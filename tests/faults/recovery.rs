//! How soon a store answers again once Redis is back after an outage, with the connection
//! `RedisStore::connect` builds, while requests keep arriving every 20 ms.

use std::time::{Duration, Instant};

use tower_lease::{Lock, RedisStore, Store};

use tower_lease_harness::port::is_ephemeral;
use tower_lease_harness::server::{ping, server_binary};
use tower_lease_harness::{Endpoint, RedisServer};

const JOBS: Lock<str> = Lock::new("jobs", Duration::from_secs(5));

/// Stops the server for `down`, with a lock attempt every 20 ms, and answers how long after the
/// restart the first attempt succeeded.
async fn recovery_after(store: &Store, server: &mut RedisServer, down: Duration) -> Duration {
    let token = JOBS.try_lock(store, "before").await.unwrap().unwrap();
    assert!(token.release().await.unwrap());
    server.stop();
    let stopped = Instant::now();
    while stopped.elapsed() < down {
        assert!(JOBS.try_lock(store, "down").await.is_err(), "Redis is down");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.restart();
    let restarted = Instant::now();
    loop {
        if let Ok(Some(token)) = JOBS.try_lock(store, "after").await {
            let took = restarted.elapsed();
            assert!(token.release().await.unwrap());
            return took;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(30),
            "never recovered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_connected_store_answers_within_a_second_of_redis_coming_back() {
    let mut server = RedisServer::start();
    let store: Store = RedisStore::connect(&server.url()).await.unwrap().into();
    for down in [Duration::from_secs(1), Duration::from_secs(10)] {
        let took = recovery_after(&store, &mut server, down).await;
        println!("down {down:?}: answering again {took:?} after the restart");
        assert!(
            took < Duration::from_secs(1),
            "down {down:?}: answered again only {took:?} after the restart"
        );
    }
}

/// What the test above relies on: a server stopped for seconds gets its own port back. The
/// port is never one the kernel hands out by itself (to another test's server, or as a
/// connection's source port), and a restart that finds another process's server answering on
/// it fails instead of handing the test a stranger.
#[test]
fn a_restarted_server_is_the_one_the_test_started() {
    let mut server = RedisServer::start();
    let port = server.port();
    assert!(!is_ephemeral(port), "{port} is a port the kernel hands out");
    server.stop();
    let mut stranger = std::process::Command::new(server_binary())
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !ping(port) {
        assert!(started.elapsed() < Duration::from_secs(10), "no stranger");
        std::thread::sleep(Duration::from_millis(10));
    }
    let restarted = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| server.restart()));
    let _ = stranger.kill();
    let _ = stranger.wait();
    assert!(
        restarted.is_err(),
        "the restart answered with another process's server on port {port}"
    );
}
