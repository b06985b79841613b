//! Several replica processes (the `replica` example) sharing one pool of K permits: however the
//! load falls on the replicas, no more than K requests of the pool run at once, counted by a
//! witness in Redis; and the control without the layer, where the witness sees more.

use std::net::SocketAddr;

use http::{Method, StatusCode};

use super::replicas::Replica;
use tower_lease_harness::http::Http;
use tower_lease_harness::{Endpoint, RedisServer};

/// What 30 clients × 10 requests to `/pools/p/enter`, round robin over the replicas, came to:
/// the 200s, the 429s, and the most requests ever inside at once, as the witness kept it.
async fn load(server: &RedisServer, replicas: &[Replica]) -> (usize, usize, usize) {
    let addrs: Vec<SocketAddr> = replicas.iter().map(|r| r.addr).collect();
    let http = Http::new();
    let mut clients = tokio::task::JoinSet::new();
    for client in 0..30 {
        let (http, addrs) = (http.clone(), addrs.clone());
        clients.spawn(async move {
            let mut statuses = Vec::new();
            for i in 0..10 {
                let addr = addrs[(client + i) % addrs.len()];
                let reply = http.send(addr, Method::POST, "/pools/p/enter", &[]).await;
                statuses.push(reply.status);
            }
            statuses
        });
    }
    let (mut ok, mut full) = (0, 0);
    while let Some(statuses) = clients.join_next().await {
        for status in statuses.unwrap() {
            match status {
                StatusCode::OK => ok += 1,
                StatusCode::TOO_MANY_REQUESTS => full += 1,
                other => panic!("only 200 and 429 expected, got {other}"),
            }
        }
    }
    let mut conn = server.connection().await;
    let most: Option<usize> = redis::cmd("GET")
        .arg("pool:{p}:most")
        .query_async(&mut conn)
        .await
        .unwrap();
    (ok, full, most.unwrap_or(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_never_run_more_than_k_requests_of_a_pool_at_once() {
    let server = RedisServer::start();
    let env = [("PERMITS", "3"), ("WORK_MS", "20"), ("WAIT_MS", "5000")];
    let replicas: Vec<Replica> = (0..3)
        .map(|_| Replica::start(&server.url(), &env))
        .collect();
    let (ok, full, most) = load(&server, &replicas).await;
    eprintln!("limited: {ok} ok, {full} full, at most {most} inside");
    assert!(most <= 3, "{most} requests of a 3-permit pool ran at once");
    assert_eq!(
        most, 3,
        "the load never filled the pool: nothing was tested"
    );
    assert!(
        ok >= 200,
        "too few requests were served: {ok} ok, {full} full"
    );
}

/// The control: without the layer the witness sees the excess, so the test above can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_layer_the_witness_sees_more_than_k_inside() {
    let server = RedisServer::start();
    let env = [("LOCKED", "0"), ("WORK_MS", "20")];
    let replicas: Vec<Replica> = (0..3)
        .map(|_| Replica::start(&server.url(), &env))
        .collect();
    let (ok, _, most) = load(&server, &replicas).await;
    eprintln!("unlimited: {ok} ok, at most {most} inside");
    assert!(most > 3, "only {most} inside at once without the layer");
}
