//! Debian's `pgbouncer` (`/usr/sbin/pgbouncer`, or the binary `TOWER_LEASE_PGBOUNCER` names)
//! in front of a [`PgServer`], in transaction pooling mode, on a free loopback port: what
//! `tower-lease-postgres` meets behind a transaction pooler.
//!
//! Its configuration is generated in a folder of its own (the socket, the log, the users
//! file): `pool_mode = transaction`, trust authentication, and a small pool per database and
//! user, so that its clients share a few server connections and one client's transactions go
//! to different ones; on PgBouncer 1.21 and later, `max_prepared_statements = 0`, so that
//! prepared statements pass through untracked as before 1.21. pgbouncer refuses to run as
//! root: under root it runs as the `postgres` user, as the server does, and dies with the
//! thread that started it; its handle kills it when dropped.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::postgres::{PgServer, as_postgres, free_port, own};

/// A `pgbouncer` process in transaction pooling mode on `127.0.0.1:port`, in front of the
/// database `postgres` of one server.
#[derive(Debug)]
pub struct PgBouncer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

impl PgBouncer {
    /// Starts pgbouncer in front of `server` with `pool_size` server connections per database
    /// and user (`default_pool_size`), and waits until it accepts connections.
    pub fn start(server: &PgServer, pool_size: usize) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("tower-lease-pgbouncer-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a folder for pgbouncer");
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").expect("the users file");
        let mut bouncer = PgBouncer {
            child: None,
            port: 0,
            dir,
        };
        // Another process may take the free port between our probe and pgbouncer's bind.
        for _ in 0..10 {
            bouncer.port = free_port();
            bouncer.write_ini(server.port(), pool_size);
            own(&bouncer.dir);
            if bouncer.spawn_and_wait() {
                return bouncer;
            }
        }
        panic!(
            "pgbouncer did not start on any of 10 free ports; its log: {}",
            std::fs::read_to_string(bouncer.dir.join("pgbouncer.log")).unwrap_or_default()
        );
    }

    /// `postgres://postgres@127.0.0.1:port/postgres`, through pgbouncer.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The port pgbouncer listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// What pgbouncer logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }

    fn write_ini(&self, server_port: u16, pool_size: usize) {
        let dir = self.dir.display();
        let ini = format!(
            "[databases]\n\
             postgres = host=127.0.0.1 port={server_port} dbname=postgres user=postgres\n\
             \n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir = {dir}\n\
             logfile = {dir}/pgbouncer.log\n\
             auth_type = trust\n\
             auth_file = {dir}/users.txt\n\
             pool_mode = transaction\n\
             default_pool_size = {pool_size}\n\
             min_pool_size = 0\n\
             reserve_pool_size = 0\n\
             max_client_conn = 500\n\
             max_db_connections = {pool_size}\n\
             ignore_startup_parameters = extra_float_digits,options\n\
             log_connections = 0\n\
             log_disconnections = 0\n\
             {prepared}",
            port = self.port,
            prepared = if tracks_prepared_statements(&binary()) {
                // 1.22 and later track prepared statements by default: not the pooler this
                // stands for.
                "max_prepared_statements = 0\n"
            } else {
                ""
            },
        );
        std::fs::write(self.dir.join("pgbouncer.ini"), ini).expect("pgbouncer.ini");
    }

    /// Starts pgbouncer on `self.port`; `false` when it exited (the port taken) or did not
    /// accept connections within 20 s.
    fn spawn_and_wait(&mut self) -> bool {
        let binary = binary();
        let mut command = Command::new(&binary);
        command
            .arg(self.dir.join("pgbouncer.ini"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Out of the test's process group: a terminal's ^C or ^Z is the test's alone.
            .process_group(0);
        as_postgres(&mut command);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                "{} is not installed: run scripts/test (it installs pgbouncer), or \
                 `apt-get install pgbouncer`",
                binary.display()
            ),
            Err(e) => panic!("could not start {}: {e}", binary.display()),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            let addr = (std::net::Ipv4Addr::LOCALHOST, self.port).into();
            if std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok() {
                self.child = Some(child);
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `TOWER_LEASE_PGBOUNCER`, else Debian's `/usr/sbin/pgbouncer`.
fn binary() -> PathBuf {
    std::env::var_os("TOWER_LEASE_PGBOUNCER")
        .filter(|b| !b.is_empty())
        .map_or_else(|| PathBuf::from("/usr/sbin/pgbouncer"), PathBuf::from)
}

/// Whether `binary` is PgBouncer 1.21 or later, which has `max_prepared_statements` (and
/// refuses it before): its `--version`'s first line, `PgBouncer 1.18.0`.
fn tracks_prepared_statements(binary: &std::path::Path) -> bool {
    let Ok(out) = Command::new(binary).arg("--version").output() else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .unwrap_or("");
    let mut parts = version
        .split('.')
        .map(|part| part.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= (1, 21)
}
