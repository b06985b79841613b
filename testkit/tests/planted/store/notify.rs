//! The planted store's notifications: every store made on one [`MemoryStore`] (each standing for
//! a process) hears the releases and write intents of all of them through an in-process bus, as
//! `tests/backend/relay.rs` in the main crate does; and the notification bugs ([`Bug`]) planted
//! in it.

use std::time::Duration;

use tokio::sync::broadcast;
use tower_lease::backend::{LeaseRef, Mode, NotificationSink};

use super::{Bug, MemoryStore};

/// What one store on the planted backend tells the others.
#[derive(Clone, Debug)]
pub(super) enum Event {
    Released {
        mode: Mode,
        namespace: String,
        name: Vec<u8>,
    },
    WriteIntent {
        namespace: String,
        name: Vec<u8>,
    },
}

/// How long a [`Bug::NoticeBeforeRelease`] release takes between its notice and its change, as
/// a `NOTIFY` sent before the `COMMIT` that makes the release visible.
const COMMIT: Duration = Duration::from_millis(20);

/// A new bus, shared by every clone of a store.
pub(super) fn bus() -> broadcast::Sender<Event> {
    broadcast::channel(1024).0
}

impl MemoryStore {
    fn publish(&self, event: Event) {
        // No listener (no store made yet) is not an error.
        let _ = self.bus.send(event);
    }

    /// `lease` was released (or its write intent withdrawn, or its reservation completed or
    /// freed): the stores on this backend hear of it, under the mode `WrongModeNotice` gets
    /// wrong.
    pub(super) fn announce_release(&self, lease: LeaseRef<'_>) {
        let mode = match (self.bug, lease.mode) {
            (Bug::WrongModeNotice, Mode::Read | Mode::Write) => Mode::Exclusive,
            (_, mode) => mode,
        };
        self.publish(Event::Released {
            mode,
            namespace: lease.lock.namespace.to_owned(),
            name: lease.lock.name.to_vec(),
        });
    }

    /// A write attempt of `lease` was refused and left its intent.
    pub(super) fn announce_intent(&self, lease: LeaseRef<'_>) {
        if self.bug != Bug::NoIntentNotice {
            self.publish(Event::WriteIntent {
                namespace: lease.lock.namespace.to_owned(),
                name: lease.lock.name.to_vec(),
            });
        }
    }

    /// Releases `lease` (`release`: the change, done at once) and announces it, as the planted
    /// bug has it: no notice (`NoReleaseNotice`), or the notice first and the change a
    /// [`COMMIT`] later (`NoticeBeforeRelease`).
    pub(super) async fn release_and_announce(
        &self,
        lease: LeaseRef<'_>,
        release: impl FnOnce() -> bool,
    ) -> bool {
        match self.bug {
            Bug::NoReleaseNotice => release(),
            Bug::NoticeBeforeRelease => {
                self.announce_release(lease);
                tokio::time::sleep(COMMIT).await;
                release()
            }
            _ => {
                let released = release();
                if released {
                    self.announce_release(lease);
                }
                released
            }
        }
    }

    /// The listener of one store: hands what the bus carries to `sink` (nothing, with
    /// `NotifiesNothing`, though it claims to).
    pub(super) fn listen(&self, sink: NotificationSink) -> bool {
        if self.bug == Bug::NotifiesNothing {
            return true;
        }
        let mut events = self.bus.subscribe();
        tokio::spawn(async move {
            loop {
                let event = match events.recv().await {
                    Ok(event) => event,
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        sink.missed();
                        continue;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                if sink.is_closed() {
                    return;
                }
                match event {
                    Event::Released {
                        mode,
                        namespace,
                        name,
                    } => sink.released(mode, &namespace, &name),
                    Event::WriteIntent { namespace, name } => sink.write_intent(&namespace, &name),
                }
            }
        });
        true
    }
}
