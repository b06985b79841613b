//! [`Ghosts`]: what a failed call may still take, given back with its secret once the store
//! answers again.
//!
//! A call that timed out is not undone: a paused or slow Redis runs the queued command when it
//! gets to it (a `SET NX` behind a `CLIENT PAUSE`, a script on a busy server), and a lease
//! nobody holds then refuses every retry for its whole TTL. The same holds for a call whose
//! connection broke after it was sent. Its secret is known, though, so the store releases it:
//! at once, and again with backoff while the store fails, for at most the lease's TTL (what a
//! call took by then would have expired anyway). A release finds our secret or does nothing,
//! so giving back what was never taken costs one round trip and no harm.
//!
//! Ordering: the first release leaves right after the failed call, on the same connection where
//! the store keeps one (a `MultiplexedConnection`, a `ConnectionManager`'s current connection,
//! a cluster client's connection to the slot's node). Redis runs one connection's commands in
//! the order sent, so when the queued call lands, the release lands after it. A connection that
//! is replaced (a `ConnectionManager` reconnecting, a cluster redirect) takes the commands it
//! had not delivered with it: the server drops the unread ones when it sees the connection
//! close, and the ones it had read ran before the release, which comes on the new connection.
//! What no order can cover is a command still on the wire when a release on another
//! connection has already answered; that lease ends with its TTL.
//!
//! One task per store gives everything back (spawned on the first failure, ended when nothing
//! is left), as the heartbeat does for extensions.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::Store;
use crate::Error;
use crate::backend::{Fairness, LeaseRef, LockRef, Mode, Secret};

/// The first pause before a release is sent again; it doubles up to [`LAST_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(25);
/// The longest pause between two releases of one ghost: a store that answers again gets it
/// within this, well before a client's retry.
const LAST_RETRY: Duration = Duration::from_millis(250);
/// The most ghosts given back at once. Past it (a store down under a flood of requests) a new
/// one is left to its TTL, rather than retried by the thousand against a store that is gone.
const MOST: usize = 10_000;

/// The ghosts of one store (and its clones), and the task that gives them back.
#[derive(Clone, Default)]
pub(crate) struct Ghosts {
    slot: Arc<Slot>,
}

#[derive(Default)]
struct Slot {
    /// The running task's inbox; `None` while none runs. Ghosts are sent under the lock, and
    /// the task ends under it, so none lands in a task that is leaving.
    inbox: Mutex<Option<mpsc::UnboundedSender<Ghost>>>,
    /// Ghosts sent and not yet given back (or given up).
    pending: AtomicUsize,
}

/// A failed call's lease, owned: what its release needs.
struct Ghost {
    store: Store,
    namespace: Box<str>,
    name: Box<[u8]>,
    ttl: Duration,
    fenced: bool,
    fairness: Fairness,
    permits: u32,
    mode: Mode,
    secret: Secret,
    /// Past this, whatever the call took has expired.
    until: Instant,
}

impl Ghosts {
    /// Gives back what the call on `lease` that failed with `error` may still take, when the
    /// error leaves that open (the store did not answer, or answered something this crate
    /// does not understand); a call the store refused or never saw needs nothing.
    pub(crate) fn give_back(&self, store: &Store, lease: LeaseRef<'_>, error: &Error) {
        if !may_still_land(error) {
            return;
        }
        if self.slot.pending.fetch_add(1, Ordering::AcqRel) >= MOST {
            self.slot.pending.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(
                namespace = lease.lock.namespace,
                "too many failed calls to give back; this one's lease, if it took one, ends with its TTL"
            );
            return;
        }
        let LockRef {
            namespace,
            name,
            ttl,
            fenced,
            fairness,
            permits,
        } = lease.lock;
        let ghost = Ghost {
            store: store.clone(),
            namespace: namespace.into(),
            name: name.into(),
            ttl,
            fenced,
            fairness,
            permits,
            mode: lease.mode,
            secret: lease.secret.clone(),
            until: Instant::now() + ttl,
        };
        let mut inbox = self.slot.inbox.lock().unwrap_or_else(|e| e.into_inner());
        // A task whose runtime shut down left its sender behind: sending fails, start anew.
        let ghost = match inbox.as_ref() {
            Some(tx) => match tx.send(ghost) {
                Ok(()) => return,
                Err(mpsc::error::SendError(ghost)) => ghost,
            },
            None => ghost,
        };
        // Outside a runtime nothing can be sent; the TTL frees whatever the call took.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.slot.pending.fetch_sub(1, Ordering::AcqRel);
            return;
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = tx.send(ghost);
        *inbox = Some(tx);
        runtime.spawn(give_back_all(self.slot.clone(), rx));
    }
}

/// Whether a call that failed with `error` may still act, or may have acted, on the store.
fn may_still_land(error: &Error) -> bool {
    match error {
        #[cfg(feature = "redis")]
        Error::Redis(error) => {
            // Redis answered with an error, or the connection was refused outright: the
            // command did not run. Anything else (a timeout, a connection that broke with the
            // command on it) leaves it open.
            !(error.is_connection_refusal() || matches!(error.kind(), redis::ErrorKind::Server(_)))
        }
        Error::Timeout(_) | Error::UnexpectedReply(_) | Error::NotReplicated { .. } => true,
        // A backend of someone else's: nothing says what its errors leave behind.
        Error::Backend(_) => true,
        _ => false,
    }
}

/// The task: gives back every ghost that arrives, each on its own schedule, and ends when none
/// is left.
async fn give_back_all(slot: Arc<Slot>, mut inbox: mpsc::UnboundedReceiver<Ghost>) {
    let mut giving_back = FuturesUnordered::new();
    loop {
        tokio::select! {
            ghost = inbox.recv() => match ghost {
                Some(ghost) => giving_back.push(give_back(ghost)),
                None => return,
            },
            Some(()) = giving_back.next(), if !giving_back.is_empty() => {
                slot.pending.fetch_sub(1, Ordering::AcqRel);
            }
        }
        if giving_back.is_empty() {
            // Ended under the lock, so that a ghost sent now starts a new task.
            let mut sender = slot.inbox.lock().unwrap_or_else(|e| e.into_inner());
            match inbox.try_recv() {
                Ok(ghost) => giving_back.push(give_back(ghost)),
                Err(_) => {
                    *sender = None;
                    return;
                }
            }
        }
    }
}

/// Releases `ghost` (and withdraws the write intent a refused writer of a writer-preferred
/// lock may have left), at once and then with backoff until the store answers or the lease
/// would have expired.
async fn give_back(ghost: Ghost) {
    let lock = LockRef {
        namespace: &ghost.namespace,
        name: &ghost.name,
        ttl: ghost.ttl,
        fenced: ghost.fenced,
        fairness: ghost.fairness,
        permits: ghost.permits,
    };
    let lease = LeaseRef::new(lock, ghost.mode, &ghost.secret);
    let store = &ghost.store;
    let mut pause = FIRST_RETRY;
    loop {
        // A reservation may have left its at-most-once marker too: both go with its secret.
        let released = match lease.mode {
            Mode::Reservation => store.free(lease).await,
            _ => store.release(lease).await,
        };
        let withdrawn = match (&released, lease.mode) {
            (Ok(_), Mode::Write) if lock.fairness.leaves_write_intent() => {
                store.withdraw_intent(lease).await.map(|_| ())
            }
            _ => Ok(()),
        };
        let error = match (released, withdrawn) {
            (Ok(released), Ok(())) => {
                store
                    .wait_rooms()
                    .given_back(lease.mode, lock.namespace, lock.name);
                if released {
                    tracing::debug!(
                        namespace = lock.namespace,
                        mode = lease.mode.as_str(),
                        "gave back the lease of a call that had failed"
                    );
                }
                return;
            }
            (Err(error), _) | (_, Err(error)) => error,
        };
        if Instant::now() + pause >= ghost.until {
            tracing::debug!(
                namespace = lock.namespace,
                %error,
                "could not give back the lease of a failed call; it ends with its TTL"
            );
            return;
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LAST_RETRY);
    }
}
