//! A TCP fault proxy between a client and a server (redis-server, or PostgreSQL with the
//! `postgres` feature): it passes bytes through, or delays, blackholes, drops replies, resets,
//! and severs connections on demand.
//!
//! The mode is read for every chunk, so a change applies to open connections at once (except
//! [`Fault::Reset`], which only refuses new ones). The proxy and all its connections stop when
//! its handle drops.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

#[cfg(feature = "postgres")]
use crate::postgres::PgServer;
#[cfg(feature = "redis")]
use crate::server::{Endpoint, RedisServer};

/// What the proxy does with the bytes it reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything both ways.
    Pass,
    /// Forward everything both ways, each chunk `Duration` after it was read (order kept,
    /// throughput not limited).
    Delay(Duration),
    /// Read and discard everything both ways: requests never arrive, nothing is answered.
    Blackhole,
    /// Forward requests to the server but discard its replies: the server acts, the client
    /// never learns the outcome.
    DropReplies,
    /// Reset new connections at once (`RST`); open connections keep passing.
    Reset,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    Request,
    Reply,
}

#[derive(Debug)]
struct Shared {
    fault: Mutex<Fault>,
    // Cancelled and replaced by `sever`; every connection watches the one current at its start.
    generation: Mutex<CancellationToken>,
    accepted: AtomicUsize,
    // When the proxy last handed the server's bytes to a client.
    last_reply: Mutex<Option<Instant>>,
}

impl Shared {
    fn fault(&self) -> Fault {
        *self.fault.lock().unwrap()
    }
}

/// A running proxy on `127.0.0.1`. Stops, with all its connections, when dropped.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

impl Proxy {
    /// Starts a proxy to `upstream` on a free loopback port, in [`Fault::Pass`] mode. Must be
    /// called inside a tokio runtime, which runs the proxy.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared {
            fault: Mutex::new(Fault::Pass),
            generation: Mutex::new(CancellationToken::new()),
            accepted: AtomicUsize::new(0),
            last_reply: Mutex::new(None),
        });
        let stop = CancellationToken::new();
        tokio::spawn(accept_loop(
            listener,
            upstream,
            shared.clone(),
            stop.clone(),
        ));
        Proxy { addr, shared, stop }
    }

    /// Starts a proxy to `server`.
    #[cfg(feature = "redis")]
    pub async fn to(server: &RedisServer) -> Self {
        Self::start(SocketAddr::from((Ipv4Addr::LOCALHOST, server.port()))).await
    }

    /// Starts a proxy to the PostgreSQL `server`; [`postgres_url`](Self::postgres_url) reaches
    /// it through the proxy.
    #[cfg(feature = "postgres")]
    pub async fn to_postgres(server: &PgServer) -> Self {
        Self::start(SocketAddr::from((Ipv4Addr::LOCALHOST, server.port()))).await
    }

    /// `postgres://postgres@<proxy>/postgres`: the database of a [`PgServer`] behind the proxy.
    #[cfg(feature = "postgres")]
    pub fn postgres_url(&self) -> String {
        format!("postgres://postgres@{}/postgres", self.addr)
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches the fault mode; open connections follow it from their next chunk.
    pub fn set(&self, fault: Fault) {
        *self.shared.fault.lock().unwrap() = fault;
    }

    /// The current fault mode.
    pub fn fault(&self) -> Fault {
        self.shared.fault()
    }

    /// Resets every open connection (both sides get `RST`); new ones are accepted as usual.
    pub fn sever(&self) {
        let old = std::mem::take(&mut *self.shared.generation.lock().unwrap());
        old.cancel();
    }

    /// When the proxy last passed a reply from the server on to a client: for a client that
    /// waits for each reply before its next command, the end of its last confirmed round trip.
    pub fn last_reply(&self) -> Option<Instant> {
        *self.shared.last_reply.lock().unwrap()
    }

    /// How many connections the proxy has accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::Relaxed)
    }
}

/// Connections to the proxy reach the server behind it, faults included.
#[cfg(feature = "redis")]
impl Endpoint for Proxy {
    fn url(&self) -> String {
        format!("redis://{}/", self.addr)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
) {
    // Dropping the set when the loop ends aborts every connection task.
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
            // Reap finished connections so the set stays small in long tests.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let Ok((client, _)) = accepted else { continue };
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        if shared.fault() == Fault::Reset {
            reset(client);
            continue;
        }
        let generation = shared.generation.lock().unwrap().clone();
        connections.spawn(connection(client, upstream, shared.clone(), generation));
    }
}

async fn connection(
    mut client: TcpStream,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    generation: CancellationToken,
) {
    let mut server = match TcpStream::connect(upstream).await {
        Ok(server) => server,
        Err(_) => return reset(client),
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let severed = {
        let (client_read, client_write) = client.split();
        let (server_read, server_write) = server.split();
        let both = async {
            tokio::try_join!(
                pipe(client_read, server_write, Direction::Request, &shared),
                pipe(server_read, client_write, Direction::Reply, &shared),
            )
        };
        tokio::select! {
            () = generation.cancelled() => true,
            _ = both => false,
        }
    };
    if severed {
        reset(client);
        reset(server);
    }
}

/// Closes `stream` with `RST` instead of `FIN`.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn pipe(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    direction: Direction,
    shared: &Shared,
) -> io::Result<()> {
    // Reading and writing run side by side so a delay shifts every chunk by the same amount
    // instead of limiting throughput to one chunk per delay.
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0; 16 * 1024];
        loop {
            let n = from.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, io::Error>(());
            }
            let now = Instant::now();
            let at = match (shared.fault(), direction) {
                (Fault::Blackhole, _) | (Fault::DropReplies, Direction::Reply) => continue,
                (Fault::Delay(delay), _) => now + delay,
                (Fault::Pass | Fault::Reset | Fault::DropReplies, _) => now,
            };
            if tx.send((at, buf[..n].to_vec())).is_err() {
                return Ok(());
            }
        }
    };
    let write = async move {
        while let Some((at, bytes)) = rx.recv().await {
            tokio::time::sleep_until(at).await;
            to.write_all(&bytes).await?;
            if direction == Direction::Reply {
                *shared.last_reply.lock().unwrap() = Some(Instant::now());
            }
        }
        to.shutdown().await
    };
    tokio::try_join!(read, write).map(|_| ())
}
