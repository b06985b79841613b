//! The HTTP benchmarks' plumbing: an axum app served on loopback, and keep-alive HTTP/1
//! connections to it.

use std::net::SocketAddr;

use axum::Router;
use bytes::Bytes;
use http_body_util::Empty;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};

/// Serves `app` on a free 127.0.0.1 port until the runtime ends.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// One keep-alive HTTP/1 connection's sending half.
pub type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// Opens `connections` keep-alive connections to `addr`, with `TCP_NODELAY`.
pub async fn connect(addr: SocketAddr, connections: usize) -> Vec<Sender> {
    let mut senders = Vec::with_capacity(connections);
    for _ in 0..connections {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        senders.push(sender);
    }
    senders
}
