//! A client that sends a million distinct names leaves nothing behind in the memory store, nor
//! in this process's wait rooms, once their leases (and fence counters) have ended.

use std::time::Duration;

use super::*;
use crate::Result;
use crate::backend::{Backend, BoxFuture, Extended, LockRef};
use crate::{Lock, RwLock, Semaphore, Store};

const TTL: Duration = Duration::from_millis(100);
const JOBS: Lock<str> = Lock::new("jobs", TTL);
const FENCED: Lock<str> = Lock::new("fenced", TTL).fenced();
const DOCS: RwLock<str> = RwLock::new("docs", TTL).fenced();
const SEATS: Semaphore<str> = Semaphore::new("seats", 2, TTL);

/// The store behind a [`Store`] handle, so the test can count its entries.
struct Shared(std::sync::Arc<MemoryStore>);

impl Backend for Shared {
    fn acquire<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Acquisition>> {
        self.0.acquire(lease)
    }
    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Extended>> {
        self.0.extend(lease)
    }
    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        self.0.release(lease)
    }
    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, Result<u32>> {
        self.0.in_use(lock)
    }
}

#[tokio::test(start_paused = true)]
async fn a_million_distinct_names_leave_no_entry_once_their_leases_and_fences_end() {
    let memory = std::sync::Arc::new(MemoryStore::new());
    let store = Store::from_backend(Shared(memory.clone()));
    const NAMES: usize = 1_000_000;
    let mut most = 0;
    for i in 0..NAMES {
        let name = i.to_string();
        // Tokens dropped unreleased: their leases end by expiry, the way abandoned ones do.
        let acquired = match i % 5 {
            0 => JOBS.try_lock(&store, &name).await.unwrap().is_some(),
            1 => FENCED.try_lock(&store, &name).await.unwrap().is_some(),
            2 => DOCS.try_write(&store, &name).await.unwrap().is_some(),
            3 => DOCS.try_read(&store, &name).await.unwrap().is_some(),
            _ => SEATS.try_acquire(&store, &name).await.unwrap().is_some(),
        };
        assert!(acquired);
        if i % 1000 == 999 {
            tokio::time::advance(Duration::from_millis(1)).await;
            most = most.max(memory.entries());
        }
    }
    // Leases are swept as they end (a sweep per as many calls as the last one kept entries);
    // what piles up meanwhile is the fence counters, for their hour: at most twice what lives.
    let fenced = 2 * NAMES / 5;
    assert!(most <= 2 * (fenced + 100 * 1000), "{most} entries at most");

    tokio::time::advance(super::fence_counters::FENCE_LIFE + TTL).await;
    // The next calls sweep: as many as there are entries, on one name.
    let left = memory.entries();
    for _ in 0..=left {
        let token = JOBS.try_lock(&store, "probe").await.unwrap().unwrap();
        assert!(token.release().await.unwrap());
    }
    assert_eq!(
        memory.entries(),
        0,
        "every lease and fence counter forgotten"
    );
    assert_eq!(store.wait_rooms().rooms(), 0);
}

#[tokio::test(start_paused = true)]
async fn waits_on_many_names_leave_no_room_behind() {
    let store = Store::memory();
    for i in 0..2_000 {
        let name = i.to_string();
        let held = JOBS.try_lock(&store, &name).await.unwrap().unwrap();
        // A wait that outlasts the holder's lease, and one that does not.
        let waited = JOBS.try_lock_for(&store, &name, TTL * 2).await.unwrap();
        assert!(waited.is_some());
        assert!(
            DOCS.try_read_for(&store, &name, TTL / 4)
                .await
                .unwrap()
                .is_some()
        );
        drop(held);
    }
    assert_eq!(store.wait_rooms().rooms(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_fence_counter_outlives_its_lock_by_an_hour_and_readers_keep_it() {
    let store = Store::memory();
    let first = FENCED.try_lock(&store, "a").await.unwrap().unwrap();
    let fence = first.fence().unwrap();
    tokio::time::advance(TTL).await;
    let second = FENCED.try_lock(&store, "a").await.unwrap().unwrap();
    assert!(second.fence().unwrap() > fence);

    let written = DOCS.try_write(&store, "d").await.unwrap().unwrap();
    let generation = written.fence();
    tokio::time::advance(TTL).await;
    // Readers, each within the hour of the one before, keep the write generation.
    for _ in 0..3 {
        tokio::time::advance(Duration::from_secs(50 * 60)).await;
        let read = DOCS.try_read(&store, "d").await.unwrap().unwrap();
        assert_eq!(read.fence(), generation);
    }
    tokio::time::advance(super::fence_counters::FENCE_LIFE + TTL).await;
    let read = DOCS.try_read(&store, "d").await.unwrap().unwrap();
    assert_eq!(
        read.fence(),
        Some(0),
        "no acquisition for an hour: forgotten"
    );
}
