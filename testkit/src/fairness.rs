//! `Fairness::PhaseFair`, the default of `RwLock::new`: reads and writes take turns across
//! stores (the [`Env`]'s second store, where it has one, stands for another process).
//!
//! - A writer is not starved by reads that keep overlapping in another store, whether it
//!   waits (`try_write_for`), retries soon after each refusal (`try_write`), or comes back only
//!   after each refusal's `Retry-After` in whole seconds, as an HTTP client that obeys it.
//! - Reads that arrive while a writer waits wait for its write, and then get in before a second
//!   writer that came before them; nobody overlaps a writer.
//! - Hand-offs: a waiting writer gets in promptly once the last read before it ends, and the
//!   reads that waited get in promptly once the write ends; a writer waiting for a read phase
//!   gets in promptly once its reads end; waiters queued in one process (writers, and a
//!   `Lock`'s) each get in promptly once the one before leaves.
//! - A read phase whose reader never comes (it gave up) holds writers off no longer than the
//!   phase (500 ms, at most the TTL).
//!
//! The bounds are generous (a loaded 2-core machine; a store without notifications polls every
//! 100 ms at most): [`HANDOFF`] for a hand-off.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::{Instant, sleep};
use tower_lease::{Fairness, Lock, RwLock, Store};

use crate::Env;

const TTL: Duration = Duration::from_secs(2);
/// The default policy, as a catalog uses it.
const DOCS: RwLock<str> = RwLock::new("fair", TTL);
/// The longest a hand-off may take: a notification and a round trip, or a poll, on a loaded
/// machine.
pub const HANDOFF: Duration = Duration::from_millis(300);
/// How long a read is held in the streams of reads.
const READ: Duration = Duration::from_millis(150);
/// The read phase's bound (500 ms, shorter than the TTL).
const PHASE: Duration = Duration::from_millis(500);

/// The two stores of the [`Env`]: the store under test, and the second one if there is one
/// (else the same again).
fn stores(env: &Env) -> (Store, Store) {
    let elsewhere = env.elsewhere().unwrap_or_else(|| env.store.clone());
    (env.store.clone(), elsewhere)
}

/// Who is inside the lock: asserts that a writer is alone.
#[derive(Clone, Default)]
struct Inside {
    readers: Arc<AtomicUsize>,
    writers: Arc<AtomicUsize>,
}

impl Inside {
    fn read(&self) -> Left {
        self.readers.fetch_add(1, Ordering::SeqCst);
        assert_eq!(
            self.writers.load(Ordering::SeqCst),
            0,
            "a reader got in while a writer held the lock"
        );
        Left(self.readers.clone())
    }

    fn write(&self) -> Left {
        let writers = self.writers.fetch_add(1, Ordering::SeqCst);
        assert_eq!(writers, 0, "two writers held the lock");
        assert_eq!(
            self.readers.load(Ordering::SeqCst),
            0,
            "a writer got in while a reader held the lock"
        );
        Left(self.writers.clone())
    }
}

/// Leaves the count when dropped.
struct Left(Arc<AtomicUsize>);

impl Drop for Left {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Reads of `name` on `store` that keep overlapping until `stop`: one starts every 40 ms (when
/// the lock lets it in at once) and is held for [`READ`].
fn steady_reads(
    lock: RwLock<str>,
    store: Store,
    name: &'static str,
    inside: Inside,
    stop: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut served = 0;
        let mut reads = Vec::new();
        while stop.load(Ordering::SeqCst) == 0 {
            if let Some(token) = lock.try_read(&store, name).await.unwrap() {
                served += 1;
                let inside = inside.clone();
                reads.push(tokio::spawn(async move {
                    let left = inside.read();
                    sleep(READ).await;
                    drop(left);
                    assert!(token.release().await.unwrap());
                }));
            }
            sleep(Duration::from_millis(40)).await;
        }
        for read in reads {
            read.await.unwrap();
        }
        served
    })
}

/// A writer waiting on one store is not starved by reads that keep overlapping on the other:
/// it gets in within the reads in flight when it came, plus a hand-off; readers that come after
/// it are held off (they get in again after its write).
pub async fn a_waiting_writer_is_not_starved_by_overlapping_reads(env: Env) {
    assert_eq!(DOCS.fairness_policy(), Fairness::PhaseFair, "the default");
    let (readers, writers) = stores(&env);
    let (inside, stop) = (Inside::default(), Arc::new(AtomicUsize::new(0)));
    let reads = steady_reads(DOCS, readers, "steady", inside.clone(), stop.clone());
    // The reads overlap by now.
    sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let writer = DOCS
        .try_write_for(&writers, "steady", Duration::from_secs(3))
        .await
        .unwrap();
    let took = started.elapsed();
    let writer = writer.expect("the writer got in among steady reads");
    let left = inside.write();
    assert!(
        took <= READ + HANDOFF,
        "the writer got in after {took:?}, more than the reads in flight ({READ:?}) and a hand-off"
    );
    sleep(Duration::from_millis(50)).await;
    drop(left);
    assert!(writer.release().await.unwrap());
    // Reads come in again after the write.
    sleep(Duration::from_millis(300)).await;
    stop.store(1, Ordering::SeqCst);
    let served = reads.await.unwrap();
    assert!(served >= 6, "reads were served before and after: {served}");
}

/// A writer that does not wait (`try_write`) but retries after each refusal's `retry_after`
/// gets in among reads that keep overlapping in another store: its refused attempts leave an
/// intent that holds new reads off.
pub async fn a_retrying_writer_is_not_starved_by_overlapping_reads(env: Env) {
    let (readers, writers) = stores(&env);
    let (inside, stop) = (Inside::default(), Arc::new(AtomicUsize::new(0)));
    let reads = steady_reads(DOCS, readers, "retried", inside.clone(), stop.clone());
    sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let mut attempts = 0;
    let writer = loop {
        attempts += 1;
        let attempt = DOCS.attempt_write(&writers, "retried").await.unwrap();
        if let Some(retry_after) = attempt.retry_after() {
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "the retrying writer is starved ({attempts} attempts)"
            );
            // A client honours the refusal's retry-after (with a little slack).
            sleep(retry_after.min(Duration::from_millis(400)) + Duration::from_millis(5)).await;
            continue;
        }
        break attempt.acquired().expect("acquired");
    };
    let took = started.elapsed();
    let left = inside.write();
    assert!(
        took <= READ + 2 * HANDOFF,
        "the retrying writer got in after {took:?} ({attempts} attempts)"
    );
    drop(left);
    assert!(writer.release().await.unwrap());
    stop.store(1, Ordering::SeqCst);
    reads.await.unwrap();
}

/// A lock with leases shorter than a second, so that every `Retry-After` a layer could answer
/// for it is the shortest one, 1 s.
const BRIEF: RwLock<str> = RwLock::new("fair-brief", Duration::from_millis(800));

/// The wait a `Retry-After` header says for `retry_after`, as the layer writes it: whole
/// seconds, rounded up, never 0.
fn retry_after_header(retry_after: Duration) -> Duration {
    let secs = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    Duration::from_secs(secs.max(1))
}

/// A writer that does not wait but comes back after each refusal's `Retry-After`, as an HTTP
/// client that obeys the header does (at least a whole second, longer than a waiting writer's
/// intent window), gets in among reads that keep overlapping in another store: the intent its
/// refusal left still holds new reads off when it comes back, so it finds only the reads that
/// were in when it was refused, gone by then. It gets in at its second attempt (a third is
/// allowed for a loaded machine); it is starved if its intent ended before it came back.
pub async fn a_writer_that_obeys_retry_after_is_not_starved(env: Env) {
    let (readers, writers) = stores(&env);
    let (inside, stop) = (Inside::default(), Arc::new(AtomicUsize::new(0)));
    let reads = steady_reads(BRIEF, readers, "obeyed", inside.clone(), stop.clone());
    sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let mut told = Vec::new();
    let writer = loop {
        let attempt = BRIEF.attempt_write(&writers, "obeyed").await.unwrap();
        let Some(retry_after) = attempt.retry_after() else {
            break attempt.acquired().expect("acquired");
        };
        let header = retry_after_header(retry_after);
        told.push(header);
        assert!(
            told.len() < 4,
            "the writer that obeys Retry-After is starved: refused {} times over {:?}, told {told:?}",
            told.len(),
            started.elapsed()
        );
        sleep(header).await;
    };
    let left = inside.write();
    drop(left);
    assert!(writer.release().await.unwrap());
    // The reads come in again after the write.
    sleep(Duration::from_millis(300)).await;
    stop.store(1, Ordering::SeqCst);
    let served = reads.await.unwrap();
    assert!(served >= 6, "reads were served before and after: {served}");
}

/// One task's wait for the lock, and when it got in and left.
#[derive(Debug, Clone, Copy)]
struct Turn {
    entered: Instant,
    left: Instant,
}

/// Waits up to 4 s on `store` for a read (or a write) of `name`, holds it for `hold`, and
/// answers when it got in and left; `entered` hears when it got in.
fn waiter(
    store: Store,
    name: &'static str,
    write: bool,
    hold: Duration,
    inside: Inside,
    entered: Option<tokio::sync::oneshot::Sender<()>>,
) -> tokio::task::JoinHandle<Turn> {
    tokio::spawn(async move {
        let wait = Duration::from_secs(4);
        let (entered_at, left, release) = if write {
            let token = DOCS.try_write_for(&store, name, wait).await.unwrap();
            let token = token.expect("the writer got in within its wait");
            (Instant::now(), inside.write(), Ok(token))
        } else {
            let token = DOCS.try_read_for(&store, name, wait).await.unwrap();
            let token = token.expect("the reader got in within its wait");
            (Instant::now(), inside.read(), Err(token))
        };
        if let Some(entered) = entered {
            let _ = entered.send(());
        }
        sleep(hold).await;
        drop(left);
        let at = Instant::now();
        let released = match release {
            Ok(token) => token.release().await.unwrap(),
            Err(token) => token.release().await.unwrap(),
        };
        assert!(released, "released while held");
        Turn {
            entered: entered_at,
            left: at,
        }
    })
}

/// The phase order: a reader holds; writer 1 comes and waits; then readers 1 and 2 come (on
/// either store) and wait for writer 1's write. When the first reader leaves, writer 1 gets in
/// (promptly); writer 2 comes while it writes. When writer 1 leaves, readers 1 and 2 get in
/// (promptly), before writer 2, which gets in (promptly) once they left. Nobody overlaps a
/// writer.
pub async fn reads_that_came_after_a_waiting_writer_go_after_it_and_before_the_next(env: Env) {
    let (a, b) = stores(&env);
    let inside = Inside::default();
    let name = "phases";
    let first = DOCS.try_read(&a, name).await.unwrap().expect("free");
    let first_inside = inside.read();
    let hold = Duration::from_millis(200);
    let (entered, writer1_in) = tokio::sync::oneshot::channel();
    let writer1 = waiter(
        b.clone(),
        name,
        true,
        hold * 2,
        inside.clone(),
        Some(entered),
    );
    sleep(Duration::from_millis(150)).await;
    let reader1 = waiter(a.clone(), name, false, hold, inside.clone(), None);
    let reader2 = waiter(b.clone(), name, false, hold, inside.clone(), None);
    sleep(Duration::from_millis(150)).await;
    assert!(
        !reader1.is_finished() && !reader2.is_finished(),
        "reads that came after a waiting writer wait for its write"
    );
    drop(first_inside);
    let released = Instant::now();
    assert!(first.release().await.unwrap());
    writer1_in.await.expect("writer 1 got in");
    let writer2 = waiter(a.clone(), name, true, hold, inside.clone(), None);

    let writer1 = writer1.await.unwrap();
    let (reader1, reader2) = (reader1.await.unwrap(), reader2.await.unwrap());
    let writer2 = writer2.await.unwrap();
    let handoff = writer1.entered.saturating_duration_since(released);
    assert!(
        handoff <= HANDOFF,
        "writer 1 got in {handoff:?} after the last read before it ended"
    );
    for (which, reader) in [("1", reader1), ("2", reader2)] {
        assert!(
            reader.entered >= writer1.left,
            "reader {which} got in before writer 1's write ended: {reader:?}, {writer1:?}"
        );
        let handoff = reader.entered.saturating_duration_since(writer1.left);
        assert!(
            handoff <= HANDOFF,
            "reader {which} got in {handoff:?} after writer 1's write ended"
        );
        assert!(
            reader.left <= writer2.entered,
            "reader {which} went before writer 2: {reader:?}, {writer2:?}"
        );
    }
    let last_read = reader1.left.max(reader2.left);
    let handoff = writer2.entered.saturating_duration_since(last_read);
    assert!(
        handoff <= HANDOFF,
        "writer 2 got in {handoff:?} after the read phase's reads ended"
    );
}

/// A reader that waited for a write and gave up before it ended is let in by the write's
/// release all the same; its read phase holds the next writer off no longer than the phase
/// (500 ms), and a reader that did not wait is not held by it.
pub async fn a_read_phase_nobody_comes_to_ends_by_itself(env: Env) {
    let (a, b) = stores(&env);
    let name = "phase-gone";
    let writer = DOCS.try_write(&a, name).await.unwrap().expect("free");
    // Waits 200 ms of the write's 600: gives up, its note lives on.
    let gave_up = DOCS
        .try_read_for(&b, name, Duration::from_millis(200))
        .await
        .unwrap();
    assert!(gave_up.is_none(), "the writer holds");
    sleep(Duration::from_millis(400)).await;
    assert!(writer.release().await.unwrap());
    let released = Instant::now();
    let next = DOCS
        .try_write_for(&a, name, Duration::from_secs(2))
        .await
        .unwrap();
    let took = released.elapsed();
    let next = next.expect("the next writer gets in once the phase ended");
    assert!(
        took <= PHASE + HANDOFF,
        "the next writer waited {took:?} for a read phase nobody came to"
    );
    assert!(next.release().await.unwrap());
    let reader = DOCS.try_read(&b, name).await.unwrap();
    assert!(
        reader.expect("a reader gets in").release().await.unwrap(),
        "released"
    );
}

/// Reads and a writer waiting side by side in one process all hear the releases that concern
/// them: a write holds on one store; four readers, then a writer, wait on the other. When the
/// write ends, every one of the four readers gets in promptly (not only the first one woken),
/// before the second writer; when their reads end, that writer gets in promptly.
pub async fn waiters_side_by_side_in_one_process_all_hear_their_release(env: Env) {
    let (a, b) = stores(&env);
    let inside = Inside::default();
    let name = "side-by-side";
    let first = DOCS.try_write(&a, name).await.unwrap().expect("free");
    let first_inside = inside.write();
    let hold = Duration::from_millis(100);
    let readers: Vec<_> = (0..4)
        .map(|_| waiter(b.clone(), name, false, hold, inside.clone(), None))
        .collect();
    // The readers wait for the write (each noted as waiting) before the writer comes.
    sleep(Duration::from_millis(150)).await;
    let writer = waiter(b.clone(), name, true, hold, inside.clone(), None);
    sleep(Duration::from_millis(150)).await;
    drop(first_inside);
    let released = Instant::now();
    assert!(first.release().await.unwrap());
    let mut last_read = released;
    for (i, reader) in readers.into_iter().enumerate() {
        let reader = reader.await.unwrap();
        let handoff = reader.entered.saturating_duration_since(released);
        assert!(
            handoff <= HANDOFF,
            "reader {i} got in {handoff:?} after the write it waited for ended"
        );
        last_read = last_read.max(reader.left);
    }
    let writer = writer.await.unwrap();
    assert!(
        writer.entered >= last_read,
        "the writer got in before the reads that waited for the last write ended"
    );
    let handoff = writer.entered.saturating_duration_since(last_read);
    assert!(
        handoff <= HANDOFF,
        "the writer got in {handoff:?} after the reads before it ended"
    );
}

/// Phase-fair writers that wait go in the order their waits began, whichever of them left the
/// write intent first: a younger writer's intent is taken over by an older one's attempt, and
/// then refuses the younger one; once the reader leaves, the older one gets in first.
pub async fn waiting_writers_go_in_the_order_their_waits_began(env: Env) {
    use tower_lease::backend::{Acquisition, LeaseRef, LockRef, Mode, Secret};
    let backend = env.backend();
    let name = b"writers-in-line";
    let lock = LockRef::new(DOCS.namespace(), name, TTL).fairness(Fairness::PhaseFair);
    let older = Secret::queued();
    // A queued secret stamps the wall clock's millisecond, which a paused tokio clock does not
    // move: the younger one must be stamped at least a millisecond of real time later.
    std::thread::sleep(Duration::from_millis(3));
    let younger = Secret::queued();
    let reader = Secret::random();
    let write = |secret| LeaseRef::new(lock, Mode::Write, secret).waiting();
    let read = LeaseRef::new(lock, Mode::Read, &reader);
    let acquired = |a: &Acquisition| matches!(a, Acquisition::Acquired { .. });
    assert!(acquired(&backend.acquire(read).await.unwrap()), "free");
    // The younger writer comes first and leaves its intent; the older one's attempt takes it
    // over (both are refused by the reader).
    let first = backend.acquire(write(&younger)).await.unwrap();
    assert!(!acquired(&first), "the reader holds");
    let second = backend.acquire(write(&older)).await.unwrap();
    assert!(!acquired(&second), "the reader holds");
    assert!(backend.release(read).await.unwrap(), "the reader leaves");
    let younger_again = backend.acquire(write(&younger)).await.unwrap();
    assert!(
        !acquired(&younger_again),
        "the writer whose wait began later got in before the one that began earlier"
    );
    let older_again = backend.acquire(write(&older)).await.unwrap();
    assert!(
        acquired(&older_again),
        "the writer whose wait began first gets in once the reader left: {older_again:?}"
    );
    assert!(backend.release(write(&older)).await.unwrap());
    let last = backend.acquire(write(&younger)).await.unwrap();
    assert!(acquired(&last), "then the younger one: {last:?}");
    assert!(backend.release(write(&younger)).await.unwrap());
}

/// A phase-fair writer's waiting attempt that got in, sent again (its reply was lost on the
/// way), answers acquired with the fence it was given, even when a writer whose wait began
/// earlier queued in between: the resend finds its own lease before it looks at the order of
/// waits. Answered busy, its caller would give up while the lease it holds refuses everyone for
/// its whole TTL.
pub async fn a_waiting_write_sent_again_after_it_got_in_answers_acquired(env: Env) {
    use tower_lease::backend::{Acquisition, LeaseRef, LockRef, Mode, Secret};
    let backend = env.backend();
    let lock = LockRef::new(DOCS.namespace(), b"write-sent-again", TTL)
        .fairness(Fairness::PhaseFair)
        .fenced();
    let older = Secret::queued();
    // As above: a millisecond of real time between the two stamps.
    std::thread::sleep(Duration::from_millis(3));
    let younger = Secret::queued();
    let write = |secret| LeaseRef::new(lock, Mode::Write, secret).waiting();
    let fence = |a: &Acquisition| match a {
        Acquisition::Acquired { fence } => *fence,
        Acquisition::Busy { .. } => None,
    };
    let first = backend.acquire(write(&younger)).await.unwrap();
    let given = fence(&first).expect("the name is free: acquired, fenced");
    // The older writer waits for it, and leaves its intent.
    let queued = backend.acquire(write(&older)).await.unwrap();
    assert_eq!(fence(&queued), None, "the younger writer holds");
    let again = backend.acquire(write(&younger)).await.unwrap();
    assert_eq!(
        fence(&again),
        Some(given),
        "the resend of a write that got in: {again:?}"
    );
    assert!(backend.release(write(&younger)).await.unwrap());
    let next = backend.acquire(write(&older)).await.unwrap();
    assert!(fence(&next).is_some(), "then the older writer: {next:?}");
    assert!(backend.release(write(&older)).await.unwrap());
}

/// Waiters queued behind each other in one process hand on promptly: a write of an `RwLock`
/// (then a `Lock`) holds, and three waiters wait for it on the same store (the first contends,
/// the others queue behind it in the process). Each gets in within [`HANDOFF`] of the lease
/// before it ending, also the ones that never sent an attempt while the lock was this
/// process's, which a store that notifies only the releases someone was refused for does not
/// announce.
pub async fn writers_queued_in_one_process_hand_on_promptly(env: Env) {
    let (a, _) = stores(&env);
    let hold = Duration::from_millis(50);
    // Seated in this order, each before the next.
    let seated = Duration::from_millis(50);
    let inside = Inside::default();
    let name = "queued-here";
    let first = DOCS.try_write(&a, name).await.unwrap().expect("free");
    let first_inside = inside.write();
    let mut writers = Vec::new();
    for _ in 0..3 {
        writers.push(waiter(a.clone(), name, true, hold, inside.clone(), None));
        sleep(seated).await;
    }
    drop(first_inside);
    let ended = Instant::now();
    assert!(first.release().await.unwrap());
    let mut turns = Vec::new();
    for writer in writers {
        turns.push(writer.await.unwrap());
    }
    in_turn("RwLock writer", ended, turns);

    const JOB: Lock<str> = Lock::new("fair-job", TTL);
    let first = JOB.try_lock(&a, name).await.unwrap().expect("free");
    let mut holders = Vec::new();
    for _ in 0..3 {
        let a = a.clone();
        holders.push(tokio::spawn(async move {
            let wait = Duration::from_secs(4);
            let token = JOB.try_lock_for(&a, name, wait).await.unwrap();
            let token = token.expect("the waiter got in within its wait");
            let entered = Instant::now();
            sleep(hold).await;
            let left = Instant::now();
            assert!(token.release().await.unwrap(), "released while held");
            Turn { entered, left }
        }));
        sleep(seated).await;
    }
    let ended = Instant::now();
    assert!(first.release().await.unwrap());
    let mut turns = Vec::new();
    for holder in holders {
        turns.push(holder.await.unwrap());
    }
    in_turn("Lock waiter", ended, turns);
}

/// Asserts that each turn began within [`HANDOFF`] of the one before ending (the first, of
/// `ended`), and none overlapped.
fn in_turn(who: &str, mut ended: Instant, mut turns: Vec<Turn>) {
    turns.sort_by_key(|turn| turn.entered);
    for (i, turn) in turns.iter().enumerate() {
        assert!(
            turn.entered >= ended,
            "{who} {i} got in before the one before it left"
        );
        let handoff = turn.entered.saturating_duration_since(ended);
        assert!(
            handoff <= HANDOFF,
            "queued {who} {i} got in {handoff:?} after the lease before it ended"
        );
        ended = turn.left;
    }
}
