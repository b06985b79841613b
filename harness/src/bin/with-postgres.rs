//! Runs a command with `DATABASE_URL` naming a PostgreSQL server of its own: a fresh `initdb`
//! cluster on a free loopback port, as the tests start (`PgServer`), stopped and removed when
//! the command ends. `scripts/test` runs the Postgres example under it:
//!
//! ```text
//! cargo run -p tower-lease-harness --features postgres --bin with-postgres -- \
//!     cargo run -p tower-lease-postgres --example shop
//! ```
//!
//! Exits with the command's status (1 when it died of a signal).

use std::process::{Command, ExitCode};

use tower_lease_harness::PgServer;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let Some(program) = args.next() else {
        eprintln!("usage: with-postgres COMMAND [ARGUMENTS...]");
        return ExitCode::from(2);
    };
    let server = PgServer::start();
    let status = Command::new(&program)
        .args(args)
        .env("DATABASE_URL", server.url())
        .status();
    // Dropped before exiting, which would skip it: the server stops and its folder goes.
    drop(server);
    match status {
        Ok(status) => ExitCode::from(status.code().map_or(1, |code| code as u8)),
        Err(e) => {
            eprintln!(
                "with-postgres: could not run {}: {e}",
                program.to_string_lossy()
            );
            ExitCode::from(127)
        }
    }
}
