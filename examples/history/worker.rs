//! One client process: takes a fenced `Lock` on one of a few names, keeps it alive with
//! `keep_alive` while it writes to the fenced register a few times (longer, in all, than the
//! lease's TTL), and releases it; records every operation.
//!
//! Under `--control` it is the broken client the checker must catch: no heartbeat, no deadline
//! check before its next step, and unconditional writes, for work that often outlasts the TTL.

use std::io::Write;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tower_lease::{Lock, RedisStore, Store};

use crate::record::{Hold, now_us, op};

pub const TTL: Duration = Duration::from_millis(300);
pub const NAMES: [&str; 2] = ["a", "b"];
const LOCK: Lock<str> = Lock::new("history", TTL).fenced();
const REGISTER: &str = include_str!("register.lua");

pub struct Worker {
    pub process: u64,
    pub locks_url: String,
    pub register_url: String,
    pub secs: u64,
    pub control: bool,
    pub seed: u64,
}

impl Worker {
    pub async fn run(self, out: &mut impl Write) {
        let store: Store = loop {
            match RedisStore::connect(&self.locks_url).await {
                Ok(store) => break store.timeout(Duration::from_millis(250)).into(),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        };
        let client = redis::Client::open(self.register_url.as_str()).expect("register URL");
        let mut register = redis::aio::ConnectionManager::new(client)
            .await
            .expect("the register's Redis");
        let script = redis::Script::new(REGISTER);
        let mut rng = rand::rngs::StdRng::seed_from_u64(self.seed);
        let end = now_us() + self.secs * 1_000_000;
        let p = self.process;
        let mut line = |value: serde_json::Value| {
            writeln!(out, "{value}").expect("history file");
        };
        while now_us() < end {
            let name = NAMES[rng.random_range(0..NAMES.len())];
            let invoked = now_us();
            let taken = LOCK
                .try_lock_for(&store, name, Duration::from_millis(200))
                .await;
            let acquired = now_us();
            let token = match taken {
                Ok(Some(token)) => token,
                Ok(None) => {
                    line(op(p, "acquire", name, "busy", invoked, acquired));
                    continue;
                }
                // The outcome is unknown: the store may have taken the lease and lost the answer.
                Err(_) => {
                    line(op(p, "acquire", name, "unknown", invoked, acquired));
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            };
            let fence = token.fence().expect("the lock is fenced");
            let steps = rng.random_range(1..=4);
            let mut hold = Hold {
                process: p,
                name: name.to_owned(),
                fence,
                invoked,
                acquired,
                confirmed: 0,
                release_invoked: 0,
                released: None,
            };
            let write = |register: &mut redis::aio::ConnectionManager, conditional: bool| {
                let mut call = script.prepare_invoke();
                call.key(format!("reg:{name}"))
                    .key(format!("reg:{name}:log"))
                    .arg(fence)
                    .arg(p)
                    .arg(if conditional { "1" } else { "0" });
                let mut register = register.clone();
                async move { call.invoke_async::<i64>(&mut register).await }
            };
            if self.control {
                // Broken on purpose: works past the TTL without a heartbeat, believes it holds
                // the lock throughout, and writes without the fence's condition.
                for _ in 0..steps {
                    let at = now_us();
                    let accepted = write(&mut register, false).await;
                    line(op(p, "write", name, outcome(&accepted), at, now_us()));
                    tokio::time::sleep(Duration::from_millis(rng.random_range(50..250))).await;
                }
                hold.confirmed = now_us();
                hold.release_invoked = now_us();
                hold.released = token.release().await.ok();
            } else {
                let held = token.keep_alive();
                for _ in 0..steps {
                    let at = now_us();
                    if !held.is_held() {
                        break;
                    }
                    hold.confirmed = at;
                    // `run` checks the lease's deadline before it polls the write.
                    let Some(accepted) = held.run(write(&mut register, true)).await else {
                        line(op(p, "write", name, "not_sent", at, now_us()));
                        break;
                    };
                    line(op(p, "write", name, outcome(&accepted), at, now_us()));
                    let pause = Duration::from_millis(rng.random_range(20..200));
                    tokio::time::sleep(pause).await;
                }
                let at = now_us();
                if held.is_held() {
                    hold.confirmed = at;
                }
                hold.release_invoked = now_us();
                hold.released = held.release().await.ok();
            }
            line(hold.to_json());
        }
    }
}

fn outcome(accepted: &redis::RedisResult<i64>) -> &'static str {
    match accepted {
        Ok(1) => "accepted",
        Ok(_) => "stale",
        Err(_) => "unknown",
    }
}
