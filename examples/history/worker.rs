//! One client process: takes a lease (a fenced `Lock`, a fenced `RwLock`'s read or write
//! lease, or a `Semaphore` permit, by its kind), keeps it alive with `keep_alive` while it works
//! a few steps (longer, in all, than the lease's TTL) and, holding an exclusive lease, writes to
//! the fenced register at each step; then releases it. Records every operation.
//!
//! Under `--control` it is the broken client the checker must catch: no heartbeat, no expiry
//! check before its next step, and unconditional writes, for work that often outlasts the TTL.
//!
//! Under `--steady` it is the steady writer of the histories that fail over: the other
//! clients hold their leases for seconds, so the store's exclusive acquisitions come a median
//! 1.4 s apart, too far apart to time a failover's write gap by.

use std::future::Future;
use std::io::Write;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tower_lease::{Held, Lock, LockToken, Permit, RwLock, Semaphore, Store};

use crate::connect::{Locks, connect, scaled};
use crate::record::{Hold, acquire, now_us, op};

/// The names each kind of client takes.
pub const LOCK_NAMES: [&str; 2] = ["a", "b"];
pub const RW_NAME: &str = "doc";
pub const POOL_NAME: &str = "pool";
/// The steady writer's lock names, a new one each time: a lease it could not release (the store
/// failing over) keeps no later acquisition waiting.
const STEADY_PREFIX: &str = "steady-";
/// How many permits the semaphore has.
pub const PERMITS: u32 = 2;

const REGISTER: &str = include_str!("register.lua");

/// The locks every client takes, the layer's included, with leases of `ttl`.
pub fn lock(ttl: Duration) -> Lock<str> {
    Lock::new("history", ttl).fenced()
}

pub fn docs(ttl: Duration) -> RwLock<str> {
    RwLock::new("history-docs", ttl).fenced()
}

fn pool(ttl: Duration) -> Semaphore<str> {
    Semaphore::new("history-pool", PERMITS, ttl)
}

/// How long an acquisition waits for a held lock.
pub fn wait(ttl: Duration) -> Duration {
    scaled(ttl, 200)
}

/// Which lease a client takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Lock,
    RwLock,
    Semaphore,
}

impl Kind {
    /// The kind of client `process` is: two of each lock, three readers-or-writers, three permit
    /// holders (one more than the permits).
    pub fn of(process: u64) -> Self {
        match process % 8 {
            0 | 1 => Kind::Lock,
            2..=4 => Kind::RwLock,
            _ => Kind::Semaphore,
        }
    }
}

pub struct Worker {
    pub process: u64,
    pub locks: Locks,
    pub register_url: String,
    pub secs: u64,
    /// The broken client: no heartbeat, no expiry check, unconditional writes.
    pub control: bool,
    /// The broken lock: see `broken.rs`.
    pub broken_lock: bool,
    /// Takes and releases a lock every 100 ms (for leases of 300 ms, scaled), and nothing else.
    pub steady: bool,
    pub seed: u64,
    pub ttl: Duration,
}

/// A lease taken: an exclusive one with its fence, a reader's, or a permit.
enum Taken {
    Exclusive(LockToken<Lock<str>>, u64),
    Write(LockToken<RwLock<str>>, u64),
    Read(tower_lease::ReadToken<RwLock<str>>),
    Permit(Permit<Semaphore<str>>),
}

impl Worker {
    pub async fn run(self, out: &mut impl Write) {
        let store = connect(&self.locks, self.ttl, self.broken_lock).await;
        if self.steady {
            return self.write_steadily(&store, out).await;
        }
        let register = register(&self.register_url).await;
        let (lock, docs, pool, wait) = (
            lock(self.ttl),
            docs(self.ttl),
            pool(self.ttl),
            wait(self.ttl),
        );
        let mut rng = StdRng::seed_from_u64(self.seed);
        let end = now_us() + self.secs * 1_000_000;
        let kind = Kind::of(self.process);
        while now_us() < end {
            let (name, op_name) = match kind {
                Kind::Lock => (LOCK_NAMES[rng.random_range(0..LOCK_NAMES.len())], "lock"),
                Kind::RwLock if rng.random_range(0..3) == 0 => (RW_NAME, "write"),
                Kind::RwLock => (RW_NAME, "read"),
                Kind::Semaphore => (POOL_NAME, "permit"),
            };
            let invoked = now_us();
            let taken = match op_name {
                "lock" => lock.try_lock_for(&store, name, wait).await.map(|t| {
                    t.map(|t| {
                        let fence = t.fence().expect("fenced");
                        Taken::Exclusive(t, fence)
                    })
                }),
                "write" => docs.try_write_for(&store, name, wait).await.map(|t| {
                    t.map(|t| {
                        let fence = t.fence().expect("fenced");
                        Taken::Write(t, fence)
                    })
                }),
                "read" => (docs.try_read_for(&store, name, wait).await).map(|t| t.map(Taken::Read)),
                _ => (pool.try_acquire_for(&store, name, wait).await).map(|t| t.map(Taken::Permit)),
            };
            let acquired = now_us();
            let taken = match taken {
                Ok(Some(taken)) => taken,
                Ok(None) => {
                    writeln!(
                        out,
                        "{}",
                        op(self.process, op_name, name, "busy", invoked, acquired)
                    )
                    .expect("history file");
                    continue;
                }
                // The outcome is unknown: the store may have taken the lease and lost the answer.
                Err(_) => {
                    let line = acquire(self.process, op_name, name, "unknown", invoked, acquired);
                    writeln!(out, "{line}").expect("history file");
                    tokio::time::sleep(scaled(self.ttl, 20)).await;
                    continue;
                }
            };
            let mut hold = Hold {
                process: self.process,
                kind: op_name.to_owned(),
                name: name.to_owned(),
                fence: 0,
                invoked,
                acquired,
                confirmed: 0,
                release_invoked: 0,
                released: None,
                served: false,
            };
            let mut work = Work {
                process: self.process,
                name,
                register: register.clone(),
                rng: &mut rng,
                out: &mut *out,
                control: self.control,
                ttl: self.ttl,
            };
            match taken {
                Taken::Exclusive(token, fence) => {
                    hold.fence = fence;
                    work.hold(
                        token,
                        Some(fence),
                        &mut hold,
                        LockToken::keep_alive,
                        LockToken::release,
                    )
                    .await
                }
                Taken::Write(token, fence) => {
                    hold.fence = fence;
                    work.hold(
                        token,
                        Some(fence),
                        &mut hold,
                        LockToken::keep_alive,
                        LockToken::release,
                    )
                    .await
                }
                Taken::Read(token) => {
                    hold.fence = token.fence().unwrap_or(0);
                    let (keep, release) = (
                        tower_lease::ReadToken::keep_alive,
                        tower_lease::ReadToken::release,
                    );
                    work.hold(token, None, &mut hold, keep, release).await
                }
                Taken::Permit(token) => {
                    work.hold(token, None, &mut hold, Permit::keep_alive, Permit::release)
                        .await
                }
            }
            writeln!(out, "{}", hold.to_json()).expect("history file");
        }
    }

    async fn write_steadily(&self, store: &Store, out: &mut impl Write) {
        let lock = lock(self.ttl);
        let end = now_us() + self.secs * 1_000_000;
        let mut n = 0;
        while now_us() < end {
            n += 1;
            let name = format!("{STEADY_PREFIX}{n}");
            let invoked = now_us();
            let taken = lock.try_lock(store, &name).await;
            let acquired = now_us();
            let line = match taken {
                Ok(Some(token)) => {
                    let mut hold = Hold {
                        process: self.process,
                        kind: "lock".to_owned(),
                        name,
                        fence: token.fence().expect("fenced"),
                        invoked,
                        acquired,
                        confirmed: 0,
                        release_invoked: now_us(),
                        released: None,
                        served: false,
                    };
                    hold.released = token.release().await.ok();
                    hold.to_json()
                }
                Ok(None) => op(self.process, "lock", &name, "busy", invoked, acquired),
                Err(_) => acquire(self.process, "lock", &name, "unknown", invoked, acquired),
            };
            writeln!(out, "{line}").expect("history file");
            tokio::time::sleep(scaled(self.ttl, 10)).await;
        }
    }
}

/// The work done under one lease.
struct Work<'a, W> {
    process: u64,
    name: &'static str,
    register: redis::aio::ConnectionManager,
    rng: &'a mut StdRng,
    out: &'a mut W,
    control: bool,
    ttl: Duration,
}

impl<W: Write> Work<'_, W> {
    /// Works one to four steps under `token`'s lease (writing to the register with `fence`, for
    /// an exclusive lease), then releases it; fills in `hold`.
    async fn hold<T, R>(
        &mut self,
        token: T,
        fence: Option<u64>,
        hold: &mut Hold,
        keep_alive: fn(T) -> Held<T>,
        release: fn(T) -> R,
    ) where
        R: Future<Output = tower_lease::Result<bool>>,
    {
        let steps = self.rng.random_range(1..=4);
        if self.control {
            // Broken on purpose: works past the TTL without a heartbeat, believes it holds the
            // lease throughout, and writes without the fence's condition.
            for _ in 0..steps {
                if let Some(fence) = fence {
                    let at = now_us();
                    let accepted =
                        write(&self.register, self.name, fence, self.process, false).await;
                    self.line(op(
                        self.process,
                        "write",
                        self.name,
                        outcome(&accepted),
                        at,
                        now_us(),
                    ));
                }
                let pause = scaled(self.ttl, self.rng.random_range(50..250));
                tokio::time::sleep(pause).await;
            }
            hold.confirmed = now_us();
            hold.release_invoked = now_us();
            hold.released = release(token).await.ok();
            return;
        }
        let held = keep_alive(token);
        for _ in 0..steps {
            let at = now_us();
            if !held.is_held() {
                break;
            }
            hold.confirmed = at;
            let step = async {
                match fence {
                    Some(fence) => {
                        Some(write(&self.register, self.name, fence, self.process, true).await)
                    }
                    None => None,
                }
            };
            // `run` checks the lease's expiry before it polls the step.
            match held.run(step).await {
                None => {
                    self.line(op(
                        self.process,
                        "write",
                        self.name,
                        "not_sent",
                        at,
                        now_us(),
                    ));
                    break;
                }
                Some(Some(accepted)) => self.line(op(
                    self.process,
                    "write",
                    self.name,
                    outcome(&accepted),
                    at,
                    now_us(),
                )),
                Some(None) => {}
            }
            let pause = scaled(self.ttl, self.rng.random_range(20..200));
            tokio::time::sleep(pause).await;
        }
        let at = now_us();
        if held.is_held() {
            hold.confirmed = at;
        }
        hold.release_invoked = now_us();
        hold.released = held.release().await.ok();
    }

    fn line(&mut self, value: serde_json::Value) {
        writeln!(self.out, "{value}").expect("history file");
    }
}

/// A connection to the fenced register.
pub async fn register(url: &str) -> redis::aio::ConnectionManager {
    let client = redis::Client::open(url).expect("register URL");
    redis::aio::ConnectionManager::new(client)
        .await
        .expect("the register's Redis")
}

/// Writes `fence` to the register of `name`: only if no later fence was accepted, when
/// `conditional`.
pub async fn write(
    register: &redis::aio::ConnectionManager,
    name: &str,
    fence: u64,
    process: u64,
    conditional: bool,
) -> redis::RedisResult<i64> {
    let mut register = register.clone();
    redis::Script::new(REGISTER)
        .key(format!("reg:{name}"))
        .key(format!("reg:{name}:log"))
        .arg(fence)
        .arg(process)
        .arg(if conditional { "1" } else { "0" })
        .invoke_async(&mut register)
        .await
}

pub fn outcome(accepted: &redis::RedisResult<i64>) -> &'static str {
    match accepted {
        Ok(1) => "accepted",
        Ok(_) => "stale",
        Err(_) => "unknown",
    }
}
