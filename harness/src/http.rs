//! The layer's black-box tests and the HTTP benchmarks over real TCP: axum servers on
//! 127.0.0.1:0, an HTTP/1 client, keep-alive connections, and response bodies of many chunks.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{TcpListener, TcpStream};

/// A handler that counts its runs in its state, works for the `x-work-ms` header's milliseconds
/// (none without it) and answers "done".
pub async fn count(State(runs): State<Arc<AtomicUsize>>, headers: HeaderMap) -> &'static str {
    runs.fetch_add(1, Ordering::SeqCst);
    let work = headers
        .get("x-work-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .map(Duration::from_millis);
    if let Some(work) = work {
        tokio::time::sleep(work).await;
    }
    "done"
}

/// Serves `app` on a fresh 127.0.0.1 port until the runtime ends.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// One keep-alive HTTP/1 connection's sending half.
pub type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Empty<Bytes>>;

/// Opens `connections` keep-alive connections to `addr`, with `TCP_NODELAY`: the benchmarks'
/// clients.
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

/// Serves `app` like [`serve`], and counts the server's open connections: hyper runs a task
/// per connection, which a test that counts the runtime's tasks must tell apart from its own.
pub async fn serve_counting_connections(app: Router) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let open = Arc::new(AtomicUsize::new(0));
    let counting = CountingListener {
        listener,
        open: open.clone(),
    };
    tokio::spawn(async move { axum::serve(counting, app).await.unwrap() });
    (addr, open)
}

struct CountingListener {
    listener: TcpListener,
    open: Arc<AtomicUsize>,
}

impl axum::serve::Listener for CountingListener {
    type Io = CountedStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (stream, addr) = axum::serve::Listener::accept(&mut self.listener).await;
        self.open.fetch_add(1, Ordering::SeqCst);
        let open = self.open.clone();
        (CountedStream { stream, open }, addr)
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// A server-side connection, counted as open until hyper drops it.
struct CountedStream {
    stream: tokio::net::TcpStream,
    open: Arc<AtomicUsize>,
}

impl Drop for CountedStream {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::SeqCst);
    }
}

impl tokio::io::AsyncRead for CountedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for CountedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).expect("utf-8 body")
    }

    /// The body as JSON, checking it is a problem document of this reply's status.
    pub fn problem(&self) -> serde_json::Value {
        assert_eq!(
            self.headers
                .get("content-type")
                .map(|v| v.to_str().unwrap()),
            Some("application/problem+json"),
            "{self:?}"
        );
        let json: serde_json::Value = serde_json::from_slice(&self.body).expect("a JSON body");
        assert_eq!(json["status"], self.status.as_u16(), "{json}");
        for field in ["type", "title", "detail"] {
            assert!(json[field].is_string(), "problem without {field}: {json}");
        }
        json
    }

    pub fn retry_after(&self) -> Option<u64> {
        self.headers
            .get("retry-after")
            .map(|v| v.to_str().unwrap().parse().unwrap())
    }
}

/// An HTTP/1 client.
#[derive(Clone)]
pub struct Http {
    client: Client<HttpConnector, Full<Bytes>>,
}

impl Default for Http {
    fn default() -> Self {
        Self::new()
    }
}

impl Http {
    pub fn new() -> Self {
        Http {
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub async fn send(
        &self,
        addr: SocketAddr,
        method: Method,
        path: &str,
        headers: &[(&str, &[u8])],
    ) -> Reply {
        self.send_body(addr, method, path, headers, Bytes::new())
            .await
    }

    /// Like [`send`](Self::send), with a request body.
    pub async fn send_body(
        &self,
        addr: SocketAddr,
        method: Method,
        path: &str,
        headers: &[(&str, &[u8])],
        body: Bytes,
    ) -> Reply {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let res = self
            .client
            .request(req.body(Full::new(body)).unwrap())
            .await
            .unwrap();
        let (parts, body) = res.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    pub async fn get(&self, addr: SocketAddr, path: &str) -> Reply {
        self.send(addr, Method::GET, path, &[]).await
    }

    pub async fn post(&self, addr: SocketAddr, path: &str) -> Reply {
        self.send(addr, Method::POST, path, &[]).await
    }

    pub async fn put(&self, addr: SocketAddr, path: &str) -> Reply {
        self.send(addr, Method::PUT, path, &[]).await
    }
}

/// A response body of `count` chunks of `size` bytes, or an endless one, produced as fast as
/// the server polls it.
pub struct Chunks {
    left: Option<usize>,
    chunk: Bytes,
}

impl Chunks {
    pub fn new(count: usize, size: usize) -> Self {
        Chunks {
            left: Some(count),
            chunk: Bytes::from(vec![b'x'; size]),
        }
    }

    pub fn endless(size: usize) -> Self {
        Chunks {
            left: None,
            chunk: Bytes::from(vec![b'x'; size]),
        }
    }
}

impl http_body::Body for Chunks {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match &mut self.left {
            Some(0) => return Poll::Ready(None),
            Some(left) => *left -= 1,
            None => {}
        }
        Poll::Ready(Some(Ok(Frame::data(self.chunk.clone()))))
    }
}
