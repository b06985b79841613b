//! Real PostgreSQL servers on free loopback ports, for `tower-lease-postgres`'s tests: the
//! binaries of Debian's `postgresql` package (the newest `/usr/lib/postgresql/*/bin`, or the
//! folder `TOWER_LEASE_PG_BIN` names, or `PATH`).
//!
//! `initdb` runs once per machine and version into a template cluster in the temporary
//! folder; every server starts on a copy of it, in a folder of its own, with `fsync=off`
//! (`TOWER_LEASE_PG_SETTINGS`, e.g. `'fsync=on full_page_writes=on'`, overrides it), trust
//! authentication on `127.0.0.1`, and its socket in its own folder. PostgreSQL refuses
//! to run as root: under root the server runs as the `postgres` user, which owns its folder.
//! [`pause`](PgServer::pause) and [`stop`](PgServer::stop) signal every process of a server
//! (the postmaster and its children); the postmaster is asked to die with the thread that started it (start it on the test's thread,
//! not in `spawn_blocking`, whose threads end when idle), and killed when its handle drops.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A `postgres` server process listening on `127.0.0.1:port`, superuser `postgres` with
/// trust authentication.
#[derive(Debug)]
pub struct PgServer {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
    paused: bool,
    settings: Vec<(String, String)>,
}

/// What a server starts with besides the defaults, for [`PgServer::start_with`]: settings
/// (`-c name=value`, after the defaults and `TOWER_LEASE_PG_SETTINGS`), files written into its
/// data folder before it starts (owned by the server's user, mode 0600, as a key file must
/// be), and the lines of its `pg_hba.conf` instead of the template's.
#[derive(Clone, Debug, Default)]
pub struct PgSetup {
    settings: Vec<(String, String)>,
    files: Vec<(String, Vec<u8>)>,
    hba: Option<String>,
}

impl PgSetup {
    /// Adds the setting `name = value` (`-c name=value` on the server's command line).
    pub fn setting(mut self, name: &str, value: &str) -> Self {
        self.settings.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Writes `contents` to the file `name` in the data folder before the server starts; a
    /// setting names it relative to that folder (`ssl_key_file=server.key`).
    pub fn file(mut self, name: &str, contents: impl Into<Vec<u8>>) -> Self {
        self.files.push((name.to_owned(), contents.into()));
        self
    }

    /// `pg_hba.conf` as `lines` instead of the template's (trust on 127.0.0.1 and the
    /// socket): e.g. `hostssl all all 127.0.0.1/32 trust` alone refuses connections without
    /// TLS.
    pub fn hba(mut self, lines: &str) -> Self {
        self.hba = Some(lines.to_owned());
        self
    }
}

impl PgServer {
    /// Starts a server on a fresh copy of the template cluster, on a free port, and waits
    /// until it accepts connections.
    pub fn start() -> Self {
        Self::start_with(PgSetup::default())
    }

    /// Starts a server as [`start`](Self::start) does, with `setup`'s settings, files and
    /// `pg_hba.conf` (kept on [`restart`](Self::restart)).
    pub fn start_with(setup: PgSetup) -> Self {
        let template = template();
        let dir = fresh_dir();
        copy_dir(&template, &dir);
        let PgSetup {
            settings,
            files,
            hba,
        } = setup;
        if let Some(hba) = hba {
            write_owned(&dir.join("pg_hba.conf"), hba.as_bytes());
        }
        for (name, contents) in files {
            write_owned(&dir.join(name), &contents);
        }
        Self::launch(dir, settings)
    }

    /// Starts a server on the data folder `dir` (the server's user's) on a free port, with
    /// `settings`, and waits until it accepts connections.
    pub(crate) fn launch(dir: PathBuf, settings: Vec<(String, String)>) -> Self {
        let mut server = PgServer {
            child: None,
            port: 0,
            dir,
            paused: false,
            settings,
        };
        // Another process may take the free port between our probe and the server's bind.
        for _ in 0..10 {
            server.port = free_port();
            if server.spawn_and_wait() {
                return server;
            }
        }
        panic!("postgres did not start on any of 10 free ports");
    }

    /// Starts a server on the data folder `dir` on `port` (one a stopped server left, which
    /// the kernel may take a moment to release), with `settings`.
    pub(crate) fn launch_on(dir: PathBuf, settings: Vec<(String, String)>, port: u16) -> Self {
        let mut server = PgServer {
            child: None,
            port,
            dir,
            paused: false,
            settings,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !server.spawn_and_wait() {
            assert!(
                Instant::now() < deadline,
                "postgres did not start on port {port}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// The server's data folder.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// `postgres://postgres@127.0.0.1:port/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The postmaster's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills every process of the server (`SIGKILL`, as a crash would) and waits for the
    /// postmaster to exit. The data stays: [`restart`](Self::restart) recovers it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal_group(child.id(), libc::SIGKILL);
            let _ = child.wait();
            self.paused = false;
        }
    }

    /// Stops the server and starts it again on the same port and data, which PostgreSQL
    /// recovers as after a crash.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + Duration::from_secs(20);
        // The kernel may take a moment to release the port and the old processes' memory.
        while !self.spawn_and_wait() {
            assert!(
                Instant::now() < deadline,
                "postgres did not restart on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops every process of the server (`SIGSTOP`): connections stay open and nothing
    /// answers, as on a stalled machine, until [`resume`](Self::resume).
    pub fn pause(&mut self) {
        if let Some(child) = &self.child {
            signal_group(child.id(), libc::SIGSTOP);
            self.paused = true;
        }
    }

    /// Lets a [paused](Self::pause) server run on (`SIGCONT`).
    pub fn resume(&mut self) {
        if let Some(child) = &self.child {
            signal_group(child.id(), libc::SIGCONT);
            self.paused = false;
        }
    }

    /// Starts `postgres` on `self.port`; `false` when it exited (the port taken) or did not
    /// accept connections within 20 s.
    fn spawn_and_wait(&mut self) -> bool {
        let mut command = Command::new(binary("postgres"));
        command
            .arg("-D")
            .arg(&self.dir)
            .args(["-p", &self.port.to_string()])
            .arg("-k")
            .arg(&self.dir)
            .args(["-c", "listen_addresses=127.0.0.1"])
            .args(["-c", "fsync=off"])
            .args(["-c", "full_page_writes=off"])
            .args(["-c", "shared_buffers=16MB"])
            .args(["-c", "max_connections=60"]);
        // Settings of the caller's, after the defaults, which they override: e.g. a benchmark
        // against a server that flushes its WAL, as production runs one.
        if let Ok(settings) = std::env::var("TOWER_LEASE_PG_SETTINGS") {
            for setting in settings.split_whitespace() {
                command.args(["-c", setting]);
            }
        }
        for (name, value) in &self.settings {
            command.args(["-c", &format!("{name}={value}")]);
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Out of the test's process group: a terminal's ^C or ^Z is the test's alone.
            .process_group(0);
        as_postgres(&mut command);
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {}: {e}", binary("postgres").display()));
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return false;
            }
            if ready(self.port) {
                self.child = Some(child);
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        signal_group(child.id(), libc::SIGKILL);
        let _ = child.wait();
        false
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if self.paused {
            self.resume();
        }
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A data folder of this process's that nothing uses yet, in the temporary folder.
pub(crate) fn fresh_dir() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tower-lease-pg-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

pub(crate) use crate::port::free_port;

/// Sends `signal` to the postmaster `pid` and to every process it started. Each backend is a
/// session of its own (PostgreSQL calls `setsid` in every child), so they are found by their
/// parent, not by a process group: listed before the postmaster is signalled (a killed one's
/// children move to another parent) and after (a stopped one starts no more).
fn signal_group(pid: u32, signal: i32) {
    let send = |pid: i32| {
        // SAFETY: kill has no memory effects; a process that is gone answers ESRCH.
        unsafe {
            libc::kill(pid, signal);
        }
    };
    let mut all = children(pid);
    send(pid as i32);
    all.extend(children(pid));
    all.sort_unstable();
    all.dedup();
    for child in all {
        send(child);
    }
}

/// The processes whose parent is `pid`, from `/proc`.
fn children(pid: u32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let child: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid …`: the name may hold spaces and parentheses.
            let after = &stat[stat.rfind(')')? + 1..];
            let ppid: u32 = after.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == pid).then_some(child)
        })
        .collect()
}

/// Whether the server on `port` accepts connections (`pg_isready`).
fn ready(port: u16) -> bool {
    Command::new(binary("pg_isready"))
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-t", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// The folder of the PostgreSQL binaries: `TOWER_LEASE_PG_BIN`, else the newest Debian
/// `/usr/lib/postgresql/<version>/bin` that has `initdb`, else none (found on `PATH`).
fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("TOWER_LEASE_PG_BIN").filter(|d| !d.is_empty()) {
        return Some(dir.into());
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

pub(crate) fn binary(name: &str) -> PathBuf {
    match bin_dir() {
        Some(dir) => dir.join(name),
        None => name.into(),
    }
}

/// The template cluster, made by `initdb` once per version: in a folder of this process's
/// first, renamed into place, so parallel test processes never see half of one.
fn template() -> PathBuf {
    let version = bin_dir()
        .and_then(|bin| Some(bin.parent()?.file_name()?.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "path".into());
    let uid = unsafe { libc::getuid() };
    let template = std::env::temp_dir().join(format!("tower-lease-pg-template-{version}-{uid}"));
    if template.join("PG_VERSION").exists() {
        return template;
    }
    let making = template.with_extension(format!("making-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&making);
    std::fs::create_dir_all(&making).expect("a folder for the template cluster");
    own(&making);
    let mut initdb = Command::new(binary("initdb"));
    initdb
        .arg("-D")
        .arg(&making)
        .args([
            "-U",
            "postgres",
            "--auth=trust",
            "-N",
            "-E",
            "UTF8",
            "--locale=C",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    as_postgres(&mut initdb);
    let out = match initdb.output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "initdb is not installed: run scripts/test (it installs postgresql), or \
             `apt-get install postgresql`"
        ),
        Err(e) => panic!("could not run initdb: {e}"),
    };
    assert!(
        out.status.success(),
        "initdb failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    if std::fs::rename(&making, &template).is_err() {
        // Another test process put its own in place first.
        let _ = std::fs::remove_dir_all(&making);
    }
    template
}

/// Copies the template cluster to `to`, owned by the server's user, mode 0700.
fn copy_dir(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .expect("cp");
    assert!(status.success(), "could not copy the template cluster");
    own(to);
}

/// Writes `contents` to `path`, mode 0600, owned by the server's user.
pub(crate) fn write_owned(path: &Path, contents: &[u8]) {
    std::fs::write(path, contents)
        .unwrap_or_else(|e| panic!("could not write {}: {e}", path.display()));
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod 0600");
    if let Some((uid, gid)) = postgres_user() {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .unwrap_or_else(|e| panic!("could not chown {}: {e}", path.display()));
    }
}

/// Gives `dir` to the `postgres` user when running as root.
pub(crate) fn own(dir: &Path) {
    if let Some((uid, gid)) = postgres_user() {
        let status = Command::new("chown")
            .arg("-R")
            .arg(format!("{uid}:{gid}"))
            .arg(dir)
            .status()
            .expect("chown");
        assert!(status.success(), "could not chown {}", dir.display());
    }
    let _ = std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700));
}

/// Under root: the `postgres` user's uid and gid, which the server runs as.
fn postgres_user() -> Option<(u32, u32)> {
    // SAFETY: getuid has no memory effects; getpwnam's answer is copied out at once, and the
    // tests call it from one thread at a time per process in practice (a race only garbles
    // a static buffer both readers fill with the same entry).
    unsafe {
        if libc::getuid() != 0 {
            return None;
        }
        let entry = libc::getpwnam(c"postgres".as_ptr());
        assert!(
            !entry.is_null(),
            "running as root, and there is no `postgres` user to run PostgreSQL as: install \
             Debian's postgresql package"
        );
        Some(((*entry).pw_uid, (*entry).pw_gid))
    }
}

/// Makes `command` run as the `postgres` user under root, and die with the test process.
pub(crate) fn as_postgres(command: &mut Command) {
    let user = postgres_user();
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if let Some((uid, gid)) = user
                && (libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(gid) != 0
                    || libc::setuid(uid) != 0)
            {
                return Err(std::io::Error::last_os_error());
            }
            // After setuid, which clears it.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}
