//! [`SharedReads`]' tests: counting, joining, and the races at the ends of a share.

use std::borrow::Cow;
use std::time::Duration;

use tokio::task::JoinHandle;

use super::*;
use crate::Result;
use crate::backend::BoxFuture;
use crate::backend::Mode;
use crate::definition::attempt::Attempt;
use crate::telemetry::LossReason;
use crate::{RwLock, Store};

const DOCS: RwLock<str> = RwLock::new("docs", Duration::from_millis(300));
const TIMING: HeartbeatTiming = HeartbeatTiming {
    every: Duration::from_millis(100),
    max_hold: None,
};

async fn holding(store: &Store) -> Result<Attempt<RawLease>> {
    RawLease::acquire(
        store.clone(),
        DOCS.definition(),
        Mode::Read,
        Cow::Borrowed(b"d"),
    )
    .await
}

/// Leads the share of `d` and publishes a fresh reader lease to it.
async fn lead(reads: &Arc<SharedReads>, store: &Store) -> SharedRead {
    let Entry::Leading(leader) = reads.enter(b"d") else {
        panic!("no share yet: this request leads")
    };
    let attempt = holding(store).await;
    match leader.publish(attempt, Instant::now(), TIMING) {
        Ok(Attempt::Acquired(read)) => read,
        _ => panic!("the lock is free"),
    }
}

fn members(reads: &SharedReads) -> Option<usize> {
    let shares = reads.lock();
    shares
        .get(&b"d"[..])
        .map(|share| share.members.load(Ordering::Relaxed))
}

async fn writer_gets_in(store: &Store) -> bool {
    DOCS.try_write(store, "d").await.unwrap().is_some()
}

#[tokio::test(start_paused = true)]
async fn the_last_one_out_releases_and_the_next_one_takes_a_fresh_lease() {
    let (store, reads) = (Store::memory(), Arc::new(SharedReads::default()));
    let first = lead(&reads, &store).await;
    let Entry::Joined(second) = reads.enter(b"d") else {
        panic!("a held share takes newcomers")
    };
    assert_eq!(members(&reads), Some(2));

    first.release().await;
    assert_eq!(members(&reads), Some(1), "one left, the lease stays");
    assert!(!writer_gets_in(&store).await);
    second.release().await;
    assert_eq!(
        members(&reads),
        None,
        "out of the registry with its last request"
    );
    assert!(
        matches!(reads.enter(b"d"), Entry::Leading(_)),
        "the next one never joins a released lease"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lost_share_takes_no_newcomer_and_its_end_leaves_the_new_one_alone() {
    let (store, reads) = (Store::memory(), Arc::new(SharedReads::default()));
    let lost = lead(&reads, &store).await;
    lost.state().declare_lost(LossReason::StoreSaidGone);
    let Entry::Leading(fresh) = reads.enter(b"d") else {
        panic!("a lost share takes nobody")
    };
    // The lost share's last request leaves: the fresh share stays registered.
    lost.release().await;
    assert_eq!(members(&reads), Some(1));
    assert!(
        matches!(reads.enter(b"d"), Entry::Waiting(_)),
        "newcomers wait for the fresh acquisition"
    );
    drop(fresh);
}

#[tokio::test(start_paused = true)]
async fn a_share_whose_extension_found_a_writer_takes_no_newcomer() {
    let (store, reads) = (Store::memory(), Arc::new(SharedReads::default()));
    let read = lead(&reads, &store).await;
    read.state().writer_waits();
    assert!(reads.join(b"d").is_none());
    assert!(matches!(reads.enter(b"d"), Entry::Leading(_)));
    drop(read);
}

#[tokio::test(start_paused = true)]
async fn waiters_share_the_answer_and_dropped_ones_leave() {
    let (store, reads) = (Store::memory(), Arc::new(SharedReads::default()));
    let writer = DOCS.try_write(&store, "d").await.unwrap().unwrap();
    let Entry::Leading(leader) = reads.enter(b"d") else {
        panic!("leads")
    };
    let (Entry::Waiting(waiter), Entry::Waiting(gone)) = (reads.enter(b"d"), reads.enter(b"d"))
    else {
        panic!("the others wait for the acquisition on the wire")
    };
    assert_eq!(members(&reads), Some(3));
    drop(gone);
    assert_eq!(members(&reads), Some(2));

    let answer = leader.publish(holding(&store).await, Instant::now(), TIMING);
    assert!(matches!(answer, Ok(Attempt::Busy { .. })), "a writer holds");
    let waited = waiter.outcome().await.expect("answered");
    assert!(
        matches!(waited, Ok(Attempt::Busy { .. })),
        "the same answer"
    );
    assert_eq!(members(&reads), None, "a refused share leaves the registry");
    writer.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_abandoned_leader_sends_its_waiters_back_and_a_waiter_can_be_the_last_out() {
    let (store, reads) = (Store::memory(), Arc::new(SharedReads::default()));
    let Entry::Leading(leader) = reads.enter(b"d") else {
        panic!("leads")
    };
    let Entry::Waiting(waiter) = reads.enter(b"d") else {
        panic!("waits")
    };
    drop(leader);
    assert!(waiter.outcome().await.is_none(), "enter again");

    // A waiter whose share got its lease, dropped before it looked: the last one out.
    let Entry::Leading(leader) = reads.enter(b"d") else {
        panic!("leads anew")
    };
    let Entry::Waiting(waiter) = reads.enter(b"d") else {
        panic!("waits")
    };
    let Ok(Attempt::Acquired(read)) = leader.publish(holding(&store).await, Instant::now(), TIMING)
    else {
        panic!("the lock is free")
    };
    read.release().await;
    assert!(!writer_gets_in(&store).await, "the waiter still holds");
    drop(waiter);
    tokio::task::yield_now().await;
    assert!(writer_gets_in(&store).await, "released in the background");
}

/// Shares of many distinct names, each led, joined and left: the registry keeps no entry for a
/// name once its last request is out.
#[tokio::test(start_paused = true)]
async fn shares_of_many_names_leave_no_entry_behind() {
    let (store, reads) = (Store::memory(), Arc::new(SharedReads::default()));
    for i in 0..10_000u32 {
        let name = i.to_string();
        let Entry::Leading(leader) = reads.enter(name.as_bytes()) else {
            panic!("no share yet: this request leads")
        };
        let attempt = RawLease::acquire(
            store.clone(),
            DOCS.definition(),
            Mode::Read,
            Cow::Owned(name.as_bytes().to_vec()),
        )
        .await;
        let Ok(Attempt::Acquired(first)) = leader.publish(attempt, Instant::now(), TIMING) else {
            panic!("the lock is free")
        };
        let Entry::Joined(second) = reads.enter(name.as_bytes()) else {
            panic!("a held share takes newcomers")
        };
        first.release().await;
        second.release().await;
    }
    assert!(
        reads.lock().is_empty(),
        "{} shares left",
        reads.lock().len()
    );
}

/// Tasks on two threads join, wait, lead and leave one name as fast as they can: nobody ever
/// holds a released lease, and at the end the registry is empty and the lock free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_joins_and_leaves_never_hold_a_released_lease() {
    let (store, reads) = (Store::memory(), Arc::new(SharedReads::default()));
    let tasks: Vec<_> = (0..8)
        .map(|task| {
            let (store, reads) = (store.clone(), reads.clone());
            tokio::spawn(async move {
                for round in 0..400 {
                    let read = loop {
                        let read = match reads.enter(b"d") {
                            Entry::Joined(read) => read,
                            Entry::Waiting(waiter) => match waiter.outcome().await {
                                Some(Ok(Attempt::Acquired(read))) => read,
                                None => continue,
                                Some(_) => panic!("nothing refuses a reader here"),
                            },
                            Entry::Leading(leader) => {
                                let attempt = holding(&store).await;
                                match leader.publish(attempt, Instant::now(), TIMING) {
                                    Ok(Attempt::Acquired(read)) => read,
                                    _ => panic!("nothing refuses a reader here"),
                                }
                            }
                        };
                        break read;
                    };
                    assert!(!read.state().is_over(), "joined a released lease");
                    tokio::task::yield_now().await;
                    if (task + round) % 3 == 0 {
                        drop(read);
                    } else {
                        read.release().await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(members(&reads), None);
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(
        writer_gets_in(&store).await,
        "every shared lease was released"
    );
}

/// Counts the extensions a store is asked for.
#[derive(Default)]
struct Counting {
    memory: crate::store::MemoryStore,
    extends: AtomicUsize,
}

impl crate::backend::Backend for Arc<Counting> {
    fn acquire<'a>(
        &'a self,
        lease: crate::backend::LeaseRef<'a>,
    ) -> BoxFuture<'a, Result<crate::backend::Acquisition>> {
        self.memory.acquire(lease)
    }

    fn extend<'a>(
        &'a self,
        lease: crate::backend::LeaseRef<'a>,
    ) -> BoxFuture<'a, Result<crate::backend::Extended>> {
        self.extends.fetch_add(1, Ordering::SeqCst);
        self.memory.extend(lease)
    }

    fn release<'a>(&'a self, lease: crate::backend::LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        self.memory.release(lease)
    }

    fn in_use<'a>(&'a self, lock: crate::backend::LockRef<'a>) -> BoxFuture<'a, Result<u32>> {
        self.memory.in_use(lock)
    }
}

#[tokio::test(start_paused = true)]
async fn the_heartbeat_extends_a_shared_lease_once_per_beat() {
    let counting = Arc::new(Counting::default());
    let store = Store::from_backend(counting.clone());
    let reads = Arc::new(SharedReads::default());
    let mut first = lead(&reads, &store).await;
    let joined: Vec<_> = (0..9)
        .map(|_| reads.join(b"d").expect("a held share takes newcomers"))
        .collect();
    let heartbeat = Heartbeat::default();
    first.enrol_now(&heartbeat);
    // Beats at 100, 200 and 300 ms, ten requests sharing the lease: three extensions.
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(counting.extends.load(Ordering::SeqCst), 3);
    assert!(joined.iter().all(|read| read.valid_at(Instant::now())));
    assert!(!writer_gets_in(&store).await, "kept past its 300 ms TTL");
    for read in joined {
        read.release().await;
    }
    first.release().await;
    assert!(writer_gets_in(&store).await);
}

/// A lingering share is released only after a whole linger with no request: reads that come
/// and go more often than that keep it, however often it is idle for a moment. Each read's
/// answer waits until the share is settled: taken over by the next read, or released.
#[tokio::test(start_paused = true)]
async fn a_lingering_share_is_kept_while_reads_keep_coming_and_released_a_linger_after() {
    const LINGER: Duration = Duration::from_millis(22);
    let store = Store::memory();
    let reads = Arc::new(SharedReads::lingering(Linger(LINGER)));
    let mut answer = overlap_and_leave(&reads, &store).await;
    let share = reads.lock().get(&b"d"[..]).cloned().expect("a share of d");
    // Reads of 5 ms, 5 ms apart, for ten lingers: idle half the time, never 22 ms on end (an
    // earlier linger's end lands 2 ms into a gap).
    for i in 0..20 {
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(!is_answered(&answer).await, "read {i}: answered while idle");
        let Entry::Joined(read) = reads.enter(b"d") else {
            panic!("read {i}: a share idle for less than its linger was released")
        };
        assert!(Arc::ptr_eq(&share, &read.share), "read {i}: a new share");
        assert!(
            is_answered(&answer).await,
            "read {i}: the last one's answer waits on"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
        answer = tokio::spawn(read.release());
    }
    assert!(!writer_gets_in(&store).await, "the lingering share holds");
    tokio::time::sleep(LINGER + Duration::from_millis(10)).await;
    assert!(is_answered(&answer).await);
    assert_eq!(
        members(&reads),
        None,
        "released a linger after the last read"
    );
    assert!(writer_gets_in(&store).await);
}

/// By default a share lingers only if its reads overlapped: a name read by one request at a
/// time is released at its leave, a hot one a moment later, and a write of this layer ends
/// that moment at once. The last read is answered only once the share is released.
#[tokio::test(start_paused = true)]
async fn only_a_share_whose_reads_overlapped_lingers_by_default_and_a_write_here_ends_it() {
    let store = Store::memory();
    let reads = Arc::new(SharedReads::lingering(Linger::DEFAULT));

    let alone = lead(&reads, &store).await;
    alone.release().await;
    assert_eq!(members(&reads), None, "a read alone is released at once");
    assert!(writer_gets_in_and_out(&store).await);

    let last = overlap_and_leave(&reads, &store).await;
    assert_eq!(members(&reads), Some(0), "overlapping reads linger");
    assert!(
        !is_answered(&last).await,
        "the last read waits for the linger"
    );
    tokio::time::sleep(Linger::DEFAULT.0 + Duration::from_millis(1)).await;
    assert!(is_answered(&last).await);
    assert_eq!(members(&reads), None, "released after its linger");
    assert!(writer_gets_in_and_out(&store).await);

    let last = overlap_and_leave(&reads, &store).await;
    assert_eq!(members(&reads), Some(0), "overlapping reads linger");
    let idle = reads.end_linger(b"d").expect("an idle share to end");
    assert!(!is_answered(&last).await, "answered before the release");
    idle.release().await;
    assert!(is_answered(&last).await, "answered once released");
    assert_eq!(members(&reads), None);
    assert!(writer_gets_in(&store).await, "no linger after a write here");
}

/// Two reads of `d` that overlap, then leave: the second's answer, waiting in a task.
async fn overlap_and_leave(reads: &Arc<SharedReads>, store: &Store) -> JoinHandle<()> {
    let first = lead(reads, store).await;
    let Entry::Joined(second) = reads.enter(b"d") else {
        panic!("a held share takes newcomers")
    };
    first.release().await;
    tokio::spawn(second.release())
}

/// Whether the answer waiting in `task` may go out, once every task ready to run has run.
async fn is_answered(task: &JoinHandle<()>) -> bool {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    task.is_finished()
}

async fn writer_gets_in_and_out(store: &Store) -> bool {
    match DOCS.try_write(store, "d").await.unwrap() {
        Some(token) => token.release().await.unwrap(),
        None => false,
    }
}
