//! Loopback ports for the servers the tests start, reserved so that a server stopped for a
//! while finds its port free again when the test restarts it.
//!
//! A port the kernel hands out (`bind` to port 0, or the source port of a connection) is in its
//! ephemeral range, and a server stopped for ten seconds in a busy test run can see its port
//! given to another test's server in the meantime; its restart would then find a stranger
//! answering there. So the ports here come from below that range, where the kernel never picks
//! one by itself, and each is reserved across the test processes of this machine by a lock on
//! a file named after it, held until the process that reserved it exits.

use std::collections::hash_map::RandomState;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, TcpListener};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Mutex;

/// The lowest port handed out: above the usual fixed ports of services a machine may run.
const LOWEST: u16 = 10_000;

/// The locks of the ports this process reserved, held for as long as it runs.
static RESERVED: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// A port on 127.0.0.1 that is free now, that no other process of these tests holds, and that
/// the kernel does not give to anyone by itself: it stays this process's until it exits.
pub fn free_port() -> u16 {
    let highest = ephemeral_start().saturating_sub(1);
    if highest <= LOWEST {
        return kernel_port();
    }
    let span = u64::from(highest - LOWEST) + 1;
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    let start = hasher.finish() % span;
    for offset in 0..span {
        let port = LOWEST + ((start + offset) % span) as u16;
        let Some(lock) = lock(port) else { continue };
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok() {
            RESERVED
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(lock);
            return port;
        }
    }
    panic!("no free port from {LOWEST} to {highest} on 127.0.0.1");
}

/// Whether `port` is one the kernel may hand out by itself (a `bind` to port 0, the source
/// port of a connection).
pub fn is_ephemeral(port: u16) -> bool {
    port >= ephemeral_start()
}

/// The first port of the kernel's ephemeral range (`ip_local_port_range`), 32768 when it
/// cannot be read.
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// The lock that reserves `port`, or `None` when another process (or this one) holds it.
fn lock(port: u16) -> Option<File> {
    let dir = lock_dir();
    std::fs::create_dir_all(&dir).ok()?;
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
        .ok()?;
    // SAFETY: flock only reads the descriptor, which `file` keeps open.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
    locked.then_some(file)
}

fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("tower-lease-ports")
}

/// A port the kernel picks (a fallback for a machine whose ephemeral range starts too low).
fn kernel_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a probe socket on 127.0.0.1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserved_port_is_not_handed_out_again_while_this_process_runs() {
        let first = free_port();
        let others: Vec<u16> = (0..200).map(|_| free_port()).collect();
        assert!(!others.contains(&first), "{first} handed out twice");
        assert!(lock(first).is_none(), "{first} not locked");
    }
}
