//! The waiting rooms of a store: one per name that has waiters in this process, with the turn
//! to contend on the store and the wake-ups of this process's releases.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, Semaphore};
use tokio::time::{Instant, sleep_until};

use crate::backend::Mode;

/// Which lease a waiter waits for. Readers and writers of an `RwLock` wait in rooms of their
/// own: a waiting writer must not hold back readers that would be let in at once, nor the
/// other way round.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Name {
    mode: Mode,
    namespace: &'static str,
    name: Box<[u8]>,
}

impl Name {
    fn new(mode: Mode, namespace: &'static str, name: &[u8]) -> Self {
        Name {
            mode,
            namespace,
            name: name.into(),
        }
    }
}

/// The waiters of one name in this process.
struct Room {
    /// One permit: whoever holds it contends on the store.
    turn: Semaphore,
    /// Told when this process releases a lease of the name.
    released: Notify,
    /// Told when the waiter with the turn found the store failing: the others try at once
    /// rather than queue behind one failing call after another until their deadlines.
    store_failed: Notify,
    /// Set by a waiter that took the lock as it passes the turn on: the next one waits for this
    /// process's release instead of asking the store about a lock it knows is held.
    held_here: AtomicBool,
}

/// A store's waiting rooms, one per name that has waiters.
#[derive(Default)]
pub(crate) struct WaitRooms {
    rooms: Mutex<HashMap<Name, Arc<Room>>>,
    /// How many rooms there are, read without the lock: every release asks, and almost always
    /// nobody waits.
    open: AtomicUsize,
}

impl fmt::Debug for WaitRooms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner()).len();
        f.debug_struct("WaitRooms").field("rooms", &rooms).finish()
    }
}

impl WaitRooms {
    /// Enters the room of `name`; leaving is dropping the [`Seat`].
    pub(crate) fn enter(
        self: &Arc<Self>,
        mode: Mode,
        namespace: &'static str,
        name: &[u8],
    ) -> Seat {
        let name = Name::new(mode, namespace, name);
        let mut rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        // Cloned under the map's lock, as seats are dropped, so a room's count of references
        // says how many are seated.
        let room = rooms.entry(name.clone()).or_insert_with(|| {
            Arc::new(Room {
                turn: Semaphore::new(1),
                released: Notify::new(),
                store_failed: Notify::new(),
                held_here: AtomicBool::new(false),
            })
        });
        let room = room.clone();
        self.open.store(rooms.len(), Ordering::Release);
        Seat {
            rooms: self.clone(),
            name,
            room,
        }
    }

    /// Says this process released a lease of `name`: the waiter whose turn it is tries now.
    pub(crate) fn released(&self, mode: Mode, namespace: &'static str, name: &[u8]) {
        if self.open.load(Ordering::Acquire) == 0 {
            return;
        }
        let rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
        // A writer's release (or its intent's) may let readers or a writer in; a reader's only
        // a writer: readers wait for writers and their intents, never for another reader.
        let freed: &[Mode] = match mode {
            Mode::Exclusive => &[Mode::Exclusive],
            Mode::Permit => &[Mode::Permit],
            Mode::Reservation => &[Mode::Reservation],
            Mode::Read => &[Mode::Write],
            Mode::Write => &[Mode::Read, Mode::Write],
        };
        let mut name = Name::new(mode, namespace, name);
        for &mode in freed {
            name.mode = mode;
            if let Some(room) = rooms.get(&name) {
                if mode == Mode::Read {
                    // Phase-fair readers wait together (see `Seat::together`): every one of
                    // them tries again.
                    room.released.notify_waiters();
                }
                room.released.notify_one();
            }
        }
    }

    /// Says this process gave back a lease of `name` that a failed call took after all (a late
    /// acquisition, a ghost): the same wake-up as [`released`](Self::released), found by a
    /// look through the rooms, since such a release knows its namespace only as a borrowed
    /// name. Its notification, like any release's, may be dropped when it comes back
    /// (`Backend::delivers_own_releases`).
    pub(crate) fn given_back(&self, mode: Mode, namespace: &str, name: &[u8]) {
        if self.open.load(Ordering::Acquire) == 0 {
            return;
        }
        let found = {
            let rooms = self.rooms.lock().unwrap_or_else(|e| e.into_inner());
            rooms
                .keys()
                .find(|room| room.namespace == namespace && *room.name == *name)
                .map(|room| room.namespace)
        };
        if let Some(namespace) = found {
            self.released(mode, namespace, name);
        }
    }

    /// How many names have waiters in this process (for tests: 0 once every waiter is gone).
    #[cfg(test)]
    pub(crate) fn rooms(&self) -> usize {
        self.rooms.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// A waiter's place in the room of a name; the room goes with its last seat.
pub(crate) struct Seat {
    rooms: Arc<WaitRooms>,
    name: Name,
    room: Arc<Room>,
}

impl Seat {
    /// Waits for this waiter's turn to contend, until `deadline`; `None` when it passed first,
    /// or when the waiter with the turn found the store failing.
    pub(crate) async fn turn(&self, deadline: Instant) -> Option<Turn<'_>> {
        if let Ok(_permit) = self.room.turn.try_acquire() {
            let queued = false;
            return Some(Turn {
                seat: self,
                _permit: Some(_permit),
                queued,
            });
        }
        tokio::select! {
            permit = self.room.turn.acquire() => {
                let _permit = Some(permit.expect("the turn semaphore is never closed"));
                let queued = true;
                Some(Turn { seat: self, _permit, queued })
            }
            () = self.room.store_failed.notified() => None,
            () = sleep_until(deadline) => None,
        }
    }
}

impl Seat {
    /// A turn that does not wait for the others: every waiter of the room contends at once, each
    /// woken by this process's releases. Phase-fair readers wait so, since the store lets in
    /// the readers that waited for a write, and only those, before the next writer: a reader
    /// queued behind another here would not be among them.
    pub(crate) fn together(&self) -> Turn<'_> {
        Turn {
            seat: self,
            _permit: None,
            queued: false,
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        let mut rooms = self.rooms.rooms.lock().unwrap_or_else(|e| e.into_inner());
        // The map's copy and ours: nobody else is seated.
        if Arc::strong_count(&self.room) == 2 {
            rooms.remove(&self.name);
            self.rooms.open.store(rooms.len(), Ordering::Release);
        }
    }
}

/// The right to contend on the store for a name, until dropped.
pub(crate) struct Turn<'a> {
    seat: &'a Seat,
    /// `None` for a turn taken [together](Seat::together) with the others.
    _permit: Option<tokio::sync::SemaphorePermit<'a>>,
    /// Whether the waiter queued for it behind others of this process.
    pub(crate) queued: bool,
}

impl Turn<'_> {
    /// A wake-up registered now, before the attempt it follows, so a release that lands between
    /// the attempt and the wait is not missed.
    pub(crate) fn released(&self) -> tokio::sync::futures::Notified<'_> {
        self.seat.room.released.notified()
    }

    /// Whether the waiter that had the turn before took the lock (and so this process holds it).
    pub(crate) fn inherit_held(&self) -> bool {
        self.seat.room.held_here.swap(false, Ordering::AcqRel)
    }

    /// Says the store failed this waiter's attempt, for the ones queued behind it.
    pub(crate) fn pass_on_failure(&self) {
        self.seat.room.store_failed.notify_waiters();
    }

    /// Says this waiter took the lock, for the next one.
    pub(crate) fn pass_on_held(&self) {
        self.seat.room.held_here.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests;
