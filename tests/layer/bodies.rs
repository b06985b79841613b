//! Request bodies over raw TCP: a trickling upload holds no lock and gets 408 under
//! `buffer_body`, and streamed under the lock it is cut off at `body_timeout` (408, the lock
//! released); an oversized one gets 413 without locking, a whole one runs under the lock; and
//! `on_rejection` renders the layer's refusals in an application's own format.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::{Extension, Router};
use bytes::Bytes;
use http::{Response, StatusCode, header};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower_lease::rejection::{Reason, Rejection};
use tower_lease::{Lease, Lock, LockLayer, extract};

use tower_lease_harness::Backing;
use tower_lease_harness::http::{Http, serve};

const UPLOADS: Lock<str> = Lock::new("upload", Duration::from_secs(5));

tower_lease_harness::store_tests!(
    Layer: [
        a_trickling_body_holds_no_lock_when_buffered_and_gets_408,
        a_trickling_body_under_the_lock_is_cut_off_at_the_body_timeout,
        an_oversized_body_gets_413_and_takes_no_lock,
        a_whole_body_reaches_the_handler_under_the_lock,
        on_rejection_renders_refusals_in_the_applications_format,
    ]
);

/// Answers with the body's length and whether the request held its lease.
async fn echo(Extension(lease): Extension<Lease>, body: Bytes) -> String {
    format!("{} bytes, held {}", body.len(), lease.is_held())
}

fn uploads(layer_app: impl FnOnce(Router) -> Router) -> Router {
    layer_app(Router::new().route("/uploads/{name}", post(echo)))
}

/// Sends the head of a POST to `path` that announces `length` body bytes and the first
/// `sent` of them, and leaves the connection open.
async fn start_upload(addr: SocketAddr, path: &str, length: usize, sent: usize) -> TcpStream {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: test\r\ncontent-length: {length}\r\nconnection: close\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(&vec![b'x'; sent]).await.unwrap();
    tcp
}

/// Reads the whole response off `tcp` and answers its status line.
async fn status_line(mut tcp: TcpStream) -> String {
    let mut response = Vec::new();
    tcp.read_to_end(&mut response).await.unwrap();
    let response = String::from_utf8_lossy(&response);
    response.lines().next().unwrap_or_default().to_owned()
}

async fn a_trickling_body_holds_no_lock_when_buffered_and_gets_408(env: Backing) {
    let layer = LockLayer::new(env.store.clone(), UPLOADS, extract::path_segment(1));
    let streamed = serve(uploads(|r| r.route_layer(layer.clone()))).await;
    let timeout = Duration::from_millis(600);
    let buffered = layer.buffer_body(1024).body_timeout(timeout);
    let buffered = serve(uploads(|r| r.route_layer(buffered))).await;

    // Without buffering the handler holds the lock while it waits for the body: the witness
    // that the buffered case is different.
    let upload = start_upload(streamed, "/uploads/a", 100, 10).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        UPLOADS.try_lock(&env.store, "a").await.unwrap().is_none(),
        "a streamed upload holds the lock while it trickles"
    );
    drop(upload);

    let begun = Instant::now();
    let upload = start_upload(buffered, "/uploads/b", 100, 10).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let free = UPLOADS.try_lock(&env.store, "b").await.unwrap();
    let free = free.expect("a buffered upload takes no lock before its body is in");
    assert!(free.release().await.unwrap());
    let status = status_line(upload).await;
    let took = begun.elapsed();
    assert!(status.contains(" 408 "), "{status}");
    assert!(took >= timeout, "answered after {took:?}");
    assert!(
        took < timeout + Duration::from_secs(1),
        "answered after {took:?}"
    );
}

async fn a_trickling_body_under_the_lock_is_cut_off_at_the_body_timeout(env: Backing) {
    let timeout = Duration::from_millis(600);
    let layer = LockLayer::new(env.store.clone(), UPLOADS, extract::path_segment(1));
    let addr = serve(uploads(|r| r.route_layer(layer.body_timeout(timeout)))).await;

    // A client that sends one byte every 100 ms of a 100-byte body: it never stops, it is
    // only too slow, and without a deadline it would hold the lock for 9 s.
    let begun = Instant::now();
    let upload = start_upload(addr, "/uploads/slow", 100, 10).await;
    let (mut from_server, mut to_server) = upload.into_split();
    let trickle = tokio::spawn(async move {
        for _ in 0..90 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if to_server.write_all(b"x").await.is_err() {
                return;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        UPLOADS
            .try_lock(&env.store, "slow")
            .await
            .unwrap()
            .is_none(),
        "the upload holds the lock while its body arrives"
    );

    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !String::from_utf8_lossy(&head).contains("\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(5), from_server.read(&mut buf))
            .await
            .expect("an answer within the deadline")
            .unwrap();
        assert!(n > 0, "connection closed before a response head");
        head.extend_from_slice(&buf[..n]);
    }
    let took = begun.elapsed();
    let head = String::from_utf8_lossy(&head).to_lowercase();
    assert!(head.starts_with("http/1.1 408"), "{head}");
    assert!(
        head.contains("content-type: application/problem+json"),
        "{head}"
    );
    assert!(took >= timeout, "answered after {took:?}");
    assert!(
        took < timeout + Duration::from_secs(1),
        "answered after {took:?}"
    );
    // Released before the head went out: the next buyer gets in at once.
    let next = UPLOADS.try_lock(&env.store, "slow").await.unwrap();
    assert!(next.expect("the lock is free").release().await.unwrap());
    trickle.abort();
}

async fn an_oversized_body_gets_413_and_takes_no_lock(env: Backing) {
    let layer = LockLayer::new(env.store.clone(), UPLOADS, extract::path_segment(1));
    let addr = serve(uploads(|r| r.route_layer(layer.buffer_body(64)))).await;

    // A declared length over the limit: refused before a byte of body is read.
    let upload = start_upload(addr, "/uploads/c", 65, 0).await;
    assert!(status_line(upload).await.contains(" 413 "));
    // No declared length (chunked): refused once more than the limit has arrived.
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    let head = "POST /uploads/c HTTP/1.1\r\nhost: test\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(format!("64\r\n{}\r\n", "y".repeat(100)).as_bytes())
        .await
        .unwrap();
    assert!(status_line(tcp).await.contains(" 413 "));
    let taken = UPLOADS.try_lock(&env.store, "c").await.unwrap();
    assert!(taken.expect("never locked").release().await.unwrap());
}

async fn a_whole_body_reaches_the_handler_under_the_lock(env: Backing) {
    let layer = LockLayer::new(env.store.clone(), UPLOADS, extract::path_segment(1));
    let addr = serve(uploads(|r| r.route_layer(layer.buffer_body(1024)))).await;
    let upload = start_upload(addr, "/uploads/d", 100, 100).await;
    let mut response = Vec::new();
    let mut upload = upload;
    upload.read_to_end(&mut response).await.unwrap();
    let response = String::from_utf8_lossy(&response);
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with("100 bytes, held true"), "{response}");

    // Held by someone else: refused after the body is read, as without buffering.
    let holder = UPLOADS.try_lock(&env.store, "d").await.unwrap().unwrap();
    let upload = start_upload(addr, "/uploads/d", 100, 100).await;
    assert!(status_line(upload).await.contains(" 409 "));
    assert!(holder.release().await.unwrap());
}

fn render(rejection: &Rejection) -> Response<Bytes> {
    match rejection.reason() {
        Reason::Busy { .. } => Response::builder()
            .status(StatusCode::TOO_MANY_REQUESTS)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::RETRY_AFTER, "2")
            .body(Bytes::from(format!(
                r#"{{"error":"busy","namespace":"{}"}}"#,
                rejection.namespace()
            )))
            .unwrap(),
        _ => rejection.problem_response(),
    }
}

async fn on_rejection_renders_refusals_in_the_applications_format(env: Backing) {
    let layer = LockLayer::new(env.store.clone(), UPLOADS, extract::path_segment(1));
    let addr = serve(uploads(|r| r.route_layer(layer.on_rejection(render)))).await;
    let http = Http::new();

    let holder = UPLOADS.try_lock(&env.store, "e").await.unwrap().unwrap();
    let reply = http.post(addr, "/uploads/e").await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{reply:?}");
    assert_eq!(reply.retry_after(), Some(2));
    assert_eq!(reply.text(), r#"{"error":"busy","namespace":"upload"}"#);
    assert!(holder.release().await.unwrap());

    // What the hook passes on is the layer's own answer.
    let reply = http.post(addr, "/uploads/%00").await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.problem()["type"], "urn:tower-lease:invalid-lock-name");
}
