//! Real `redis-server` processes on free loopback ports, started by the tests, and what the
//! tests do to them directly (fill their memory, change their config).
//!
//! The binary is `redis-server`, or the one `TOWER_LEASE_SERVER` names (a `valkey-server`, to run
//! the suites on Valkey). The cluster is still joined with `redis-cli`, which speaks to either.
//!
//! Every server runs without persistence, is asked to die with the test process (so a crashed
//! test leaves nothing behind), and is killed when its handle drops.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpStream};

pub use crate::port::free_port;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` child process listening on `127.0.0.1:port`.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    port: u16,
    extra_args: Vec<String>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers `PING`.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Like [`start`](Self::start), with extra `redis-server` arguments (`--maxmemory 1mb` …).
    pub fn start_with(extra_args: &[&str]) -> Self {
        let extra_args: Vec<String> = extra_args.iter().map(|a| a.to_string()).collect();
        // Another process may take the free port between our probe and redis-server's bind: try
        // a few ports before giving up.
        for _ in 0..10 {
            let port = free_port();
            let mut server = RedisServer {
                child: None,
                port,
                extra_args: extra_args.clone(),
            };
            // A file an earlier server of this port left (a replica's full sync writes one)
            // must not seed a fresh one.
            let _ = std::fs::remove_file(std::env::temp_dir().join(dump_file(port)));
            if server.spawn_and_wait() {
                return server;
            }
        }
        panic!("redis-server did not start on any of 10 free ports");
    }

    /// Like [`start`](Self::start), with persistence: every write appended and fsynced to an
    /// append-only file in a directory of its own, so a [`restart`](Self::restart), even after
    /// `SIGKILL`, finds the data again.
    pub fn start_persistent() -> Self {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tower-lease-aof-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a directory for the append-only file");
        let dir = dir.to_string_lossy().into_owned();
        Self::start_with(&[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--dir",
            &dir,
        ])
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Sends `SCRIPT FLUSH` every 2 ms for `how_long`, as a hostile operator would under load;
    /// answers how many flushes went through.
    pub async fn flush_scripts_for(&self, how_long: Duration) -> usize {
        let mut conn = self.connection().await;
        let started = Instant::now();
        let mut flushes = 0;
        while started.elapsed() < how_long {
            let () = redis::cmd("SCRIPT")
                .arg("FLUSH")
                .query_async(&mut conn)
                .await
                .expect("SCRIPT FLUSH");
            flushes += 1;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        flushes
    }

    /// Kills the server (SIGKILL) and waits for it to exit. The port stays reserved for
    /// [`restart`](Self::restart) only by convention: nothing else on this machine binds it in
    /// between in practice.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port: empty, unless it was started with
    /// [`start_persistent`](Self::start_persistent).
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.spawn_and_wait() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not restart on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts the server again on the same port like [`restart`](Self::restart), with
    /// `extra_args` from now on instead of those it was started with (a primary brought back
    /// as a replica: `--replicaof 127.0.0.1 <port>`).
    pub fn restart_with(&mut self, extra_args: &[&str]) {
        self.extra_args = extra_args.iter().map(|a| a.to_string()).collect();
        self.restart();
    }

    /// The OS process id, for tests that signal the server.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Spawns redis-server on `self.port`; `false` when it exited (port taken) before answering.
    fn spawn_and_wait(&mut self) -> bool {
        let mut command = Command::new(server_binary());
        command
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", ""])
            .args(["--appendonly", "no"])
            .args(["--protected-mode", "no"])
            .args(["--dir", &std::env::temp_dir().to_string_lossy()])
            // One file per port, not the shared `dump.rdb`: a replica's full sync writes its
            // file even without `--save`, and every server started after it would load it.
            .args(["--dbfilename", &dump_file(self.port)])
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        die_with_parent(&mut command);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                "{} is not installed: run scripts/test (it installs redis-server), \
                 or `apt-get install redis-server`",
                server_binary()
            ),
            Err(e) => panic!("could not start {}: {e}", server_binary()),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            // Another process's server on this port answers PING too: only ours will do.
            if ping(self.port) && process_id(self.port) == Some(child.id()) {
                self.child = Some(child);
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }
}

impl Endpoint for RedisServer {
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_file(std::env::temp_dir().join(dump_file(self.port)));
    }
}

/// The server binary the tests start: `TOWER_LEASE_SERVER` when set (a path to
/// `valkey-server`, say), `redis-server` otherwise. Sentinels are this binary with `--sentinel`.
pub fn server_binary() -> String {
    std::env::var("TOWER_LEASE_SERVER")
        .ok()
        .filter(|binary| !binary.is_empty())
        .unwrap_or_else(|| "redis-server".to_owned())
}

/// Whether the tests run on Valkey (`TOWER_LEASE_SERVER` names a `valkey-server`).
pub fn on_valkey() -> bool {
    server_binary().contains("valkey")
}

/// Something redis-rs connects to: a [`RedisServer`], or anything in front of one that
/// implements it (the fault proxy, a sentinel, a benchmark's server); this file knows none of
/// them, which all build on it.
pub trait Endpoint {
    /// `redis://127.0.0.1:port/`.
    fn url(&self) -> String;

    /// A redis-rs client for this endpoint.
    fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("valid url")
    }

    /// A multiplexed connection.
    fn connection(&self) -> impl Future<Output = redis::aio::MultiplexedConnection> + Send {
        let client = self.client();
        async move {
            client
                .get_multiplexed_async_connection()
                .await
                .expect("connect to the test redis-server")
        }
    }

    /// A connection manager (reconnects by itself).
    fn connection_manager(&self) -> impl Future<Output = redis::aio::ConnectionManager> + Send {
        let client = self.client();
        async move {
            redis::aio::ConnectionManager::new(client)
                .await
                .expect("connect to the test redis-server")
        }
    }
}

/// Writes 1 KiB values without a TTL, 100 to a pipeline, until Redis refuses a write (`true`)
/// or `stop`, asked after each pipeline, says enough (`false`). Panics after 40 MiB.
pub async fn fill(
    conn: &mut redis::aio::MultiplexedConnection,
    mut stop: impl AsyncFnMut() -> bool,
) -> bool {
    let value = vec![b'x'; 1024];
    for batch in 0..400 {
        let mut pipe = redis::pipe();
        for i in 0..100 {
            pipe.set(format!("filler:{batch}:{i}"), &value).ignore();
        }
        let refused = pipe.query_async::<()>(conn).await.is_err();
        if stop().await {
            return false;
        }
        if refused {
            return true;
        }
    }
    panic!("wrote 40 MiB without reaching maxmemory");
}

/// Fills a `noeviction` server until it refuses writes, and keeps it refusing: freed client
/// buffers can bring usage back under the limit, so `maxmemory` is then pinned at 1 MB, far
/// below what the server holds.
pub async fn fill_until_full(conn: &mut redis::aio::MultiplexedConnection) {
    assert!(
        fill(conn, async || false).await,
        "Redis never refused a write"
    );
    config_set(conn, "maxmemory", "1mb").await;
}

/// `CONFIG SET name value`.
pub async fn config_set(conn: &mut impl redis::aio::ConnectionLike, name: &str, value: &str) {
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("CONFIG SET {name} {value}: {e}"));
}

/// Whether something on `port` answers `PING` with `+PONG`.
pub fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect((Ipv4Addr::LOCALHOST, port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    matches!(stream.read_exact(&mut reply), Ok(())) && &reply == b"+PONG\r\n"
}

/// The `process_id` that the server on `port` gives in `INFO server`.
pub fn process_id(port: u16) -> Option<u32> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    stream.write_all(b"INFO server\r\n").ok()?;
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&reply);
        if let Some(line) = text.split("\r\n").find(|l| l.starts_with("process_id:"))
            && text.contains(&format!("{line}\r\n"))
        {
            return line["process_id:".len()..].parse().ok();
        }
        match stream.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => reply.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Asks the kernel to kill `command`'s process when the test process dies, so servers never
/// outlive a test that panicked or was killed.
pub fn die_with_parent(command: &mut Command) {
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        command.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// `INFO commandstats` of the server behind `conn`.
pub async fn commandstats(conn: &redis::aio::MultiplexedConnection) -> String {
    redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn.clone())
        .await
        .expect("INFO commandstats")
}

/// How many times `command` ran, from a [`commandstats`] text (commands inside scripts count).
pub fn calls(stats: &str, command: &str) -> u64 {
    stats
        .lines()
        .find(|line| line.starts_with(&format!("cmdstat_{command}:")))
        .and_then(|line| line.split("calls=").nth(1)?.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// The name of the RDB file of the server on `port`.
fn dump_file(port: u16) -> String {
    format!("tower-lease-{port}.rdb")
}
