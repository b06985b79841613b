//! Streaming standbys of a [`PgServer`], for the failover tests of `tower-lease-postgres`: a
//! copy of a running primary made by `pg_basebackup -R` (which writes `standby.signal` and the
//! `primary_conninfo` it streamed with), started as a hot standby (read-only sessions, as a
//! store's `target_session_attrs=read-write` skips), synchronous or not, and promoted once the
//! primary is killed.
//!
//! The template cluster already allows what replication needs: `wal_level=replica` and
//! `max_wal_senders=10` are PostgreSQL's defaults, and `initdb --auth=trust` lets the
//! `postgres` user open replication connections from 127.0.0.1.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::postgres::{PgServer, as_postgres, binary, fresh_dir, own, write_owned};

/// Whether a primary's commits wait for a standby.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replication {
    /// The primary names the standby in `synchronous_standby_names` (and keeps the default
    /// `synchronous_commit = on`): a commit answers once the standby flushed it, so a
    /// promotion loses nothing that was answered.
    Synchronous,
    /// The primary commits without waiting (`synchronous_standby_names` empty): a promotion
    /// loses what the standby had not received yet.
    Asynchronous,
}

/// How long a standby may take to stream, or a setting to take effect.
const WITHIN: Duration = Duration::from_secs(30);

impl PgServer {
    /// Starts a streaming standby of `primary` (a base backup of it, on a port of its own),
    /// named `standby_name` (its `application_name` on the primary, by `cluster_name`), and
    /// waits until the primary streams to it, as [`Replication::Synchronous`] a synchronous
    /// standby (`sync_state = 'sync'`): the primary's `synchronous_standby_names` is set to
    /// its name (`ALTER SYSTEM`). The standby does not take the primary's
    /// `synchronous_standby_names`: promoted with it, it would wait for standbys it has not.
    pub fn standby_of(primary: &PgServer, standby_name: &str, replication: Replication) -> Self {
        Self::standby_through(primary, primary.port(), standby_name, replication)
    }

    /// A standby of `primary` as [`standby_of`](Self::standby_of) makes it, that streams
    /// through `127.0.0.1:port` (a [`Proxy`](crate::proxy::Proxy) to the primary, which can
    /// delay the stream or cut it off), its base backup too.
    pub fn standby_through(
        primary: &PgServer,
        port: u16,
        standby_name: &str,
        replication: Replication,
    ) -> Self {
        Self::make_standby(primary, port, None, standby_name, replication)
    }

    /// A standby of `primary` as [`standby_of`](Self::standby_of) makes it, listening on
    /// `port`: the port of a primary that died, so a URL naming both hosts names the new
    /// pair after a failover too.
    pub fn standby_at(
        primary: &PgServer,
        port: u16,
        standby_name: &str,
        replication: Replication,
    ) -> Self {
        Self::make_standby(
            primary,
            primary.port(),
            Some(port),
            standby_name,
            replication,
        )
    }

    fn make_standby(
        primary: &PgServer,
        port: u16,
        listen: Option<u16>,
        standby_name: &str,
        replication: Replication,
    ) -> Self {
        let dir = fresh_dir();
        std::fs::create_dir_all(&dir).expect("a folder for the standby");
        own(&dir);
        let mut backup = Command::new(binary("pg_basebackup"));
        backup
            .arg("-D")
            .arg(&dir)
            .args(["-h", "127.0.0.1", "-p", &port.to_string()])
            .args(["-U", "postgres", "-R", "-X", "stream", "-c", "fast"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_postgres(&mut backup);
        let out = backup.output().expect("run pg_basebackup");
        assert!(
            out.status.success(),
            "pg_basebackup failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let auto = dir.join("postgresql.auto.conf");
        let kept: String = std::fs::read_to_string(&auto)
            .unwrap_or_default()
            .lines()
            .filter(|line| !line.trim_start().starts_with("synchronous_standby_names"))
            .map(|line| format!("{line}\n"))
            .collect();
        write_owned(&auto, kept.as_bytes());
        let settings = vec![("cluster_name".to_owned(), standby_name.to_owned())];
        let standby = match listen {
            Some(port) => PgServer::launch_on(dir, settings, port),
            None => PgServer::launch(dir, settings),
        };
        let state = match replication {
            Replication::Synchronous => {
                primary.psql(&[
                    &format!("ALTER SYSTEM SET synchronous_standby_names = '\"{standby_name}\"'"),
                    "SELECT pg_reload_conf()",
                ]);
                "sync"
            }
            Replication::Asynchronous => "async",
        };
        primary.await_standby(standby_name, state);
        standby
    }

    /// Waits until the standby `standby_name` streams from this server with `sync_state`
    /// `state` (`sync`, `potential`, `async`, `quorum`).
    pub fn await_standby(&self, standby_name: &str, state: &str) {
        let sql = format!(
            "SELECT count(*) FROM pg_stat_replication WHERE application_name = '{standby_name}' \
             AND state = 'streaming' AND sync_state = '{state}'"
        );
        let deadline = Instant::now() + WITHIN;
        while self.psql(&[&sql]) != "1" {
            assert!(
                Instant::now() < deadline,
                "the standby {standby_name} is not streaming as {state} within {WITHIN:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Promotes this standby to a primary (`pg_ctl promote`), and waits until it takes writes.
    pub fn promote(&self) {
        let mut promote = Command::new(binary("pg_ctl"));
        promote
            .arg("promote")
            .arg("-D")
            .arg(self.dir())
            .args(["-w", "-t", "30"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_postgres(&mut promote);
        let out = promote.output().expect("run pg_ctl promote");
        assert!(
            out.status.success(),
            "pg_ctl promote failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Runs each of `commands` with `psql` as the superuser, each in a transaction of its own
    /// (`ALTER SYSTEM` takes none), and returns what the last printed, unaligned and trimmed.
    pub fn psql(&self, commands: &[&str]) -> String {
        let mut psql = Command::new(binary("psql"));
        psql.args(["-h", "127.0.0.1", "-p", &self.port().to_string()])
            .args([
                "-U",
                "postgres",
                "-d",
                "postgres",
                "-Atq",
                "-v",
                "ON_ERROR_STOP=1",
            ]);
        for command in commands {
            psql.args(["-c", command]);
        }
        let out = psql.stdin(Stdio::null()).output().expect("run psql");
        assert!(
            out.status.success(),
            "psql {commands:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let printed = String::from_utf8_lossy(&out.stdout);
        printed.lines().last().unwrap_or("").trim().to_owned()
    }
}
