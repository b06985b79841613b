//! The store's own timeout across runtimes.

use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

use crate::Error;
use crate::backend::{Backend, LeaseRef, LockRef, Mode, Secret};
use crate::store::redis::RedisStore;

/// A connection that never answers, as a blackholed Redis.
#[derive(Clone)]
struct Silent;

impl ConnectionLike for Silent {
    fn req_packed_command<'a>(
        &'a mut self,
        _cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        Box::pin(std::future::pending())
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        _cmd: &'a redis::Pipeline,
        _offset: usize,
        _count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        Box::pin(std::future::pending())
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// One store used from one runtime after another: the timer of the first runtime dies with
/// it, and the next call starts one in its own.
#[test]
fn the_timeout_holds_in_every_runtime_a_store_is_used_from() {
    let timeout = Duration::from_millis(80);
    let store = RedisStore::new(Silent).timeout(timeout);
    let secret = Secret::random();
    for _ in 0..3 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            for _ in 0..2 {
                let lock = LockRef::new("ns", b"name", Duration::from_secs(1));
                let started = Instant::now();
                let calls = futures_util::future::join(
                    store.acquire(LeaseRef::new(lock, Mode::Exclusive, &secret)),
                    store.release(LeaseRef::new(lock, Mode::Read, &secret)),
                );
                let (acquire, release) = calls.await;
                let elapsed = started.elapsed();
                assert!(matches!(acquire, Err(Error::Timeout(d)) if d == timeout));
                assert!(matches!(release, Err(Error::Timeout(d)) if d == timeout));
                assert!(elapsed >= timeout, "{elapsed:?}");
                assert!(elapsed < timeout * 2, "{elapsed:?}");
            }
        });
    }
}
