//! `Relay`: an outside backend whose "server" is one [`MemoryStore`] shared by every store
//! made on it, and whose "pub/sub" is a broadcast channel: what a backend on a real server
//! (Postgres's LISTEN/NOTIFY, a message bus) delivers, with nothing but this crate's public
//! API. Each [`Relay::store`] stands for one process.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::broadcast;
use tower_lease::backend::{
    Acquisition, Backend, BoxFuture, Extended, LeaseRef, LockRef, Mode, NotificationSink,
};
use tower_lease::store::MemoryStore;
use tower_lease::{Result, Store};

/// What one process of the relay tells the others.
#[derive(Clone, Debug)]
enum Event {
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

/// The server and the bus that the relay's processes share.
#[derive(Clone)]
pub struct Relay {
    server: Arc<MemoryStore>,
    bus: broadcast::Sender<Event>,
}

impl Default for Relay {
    fn default() -> Self {
        Relay {
            server: Arc::default(),
            bus: broadcast::channel(1024).0,
        }
    }
}

/// What a test sees of one process's backend: how many acquisitions it sent, and a switch
/// that stalls them.
#[derive(Clone, Default)]
pub struct Probe {
    pub acquisitions: Arc<AtomicUsize>,
    /// While set, each acquisition waits [`STALL`] before it reaches the server (and then
    /// acts): a server that hangs, then catches up.
    pub stalled: Arc<AtomicBool>,
}

/// How long a stalled acquisition takes.
pub const STALL: Duration = Duration::from_secs(3);

impl Relay {
    /// One process on the relay: a store whose backend reaches the shared server.
    pub fn store(&self) -> (Store, Probe) {
        let probe = Probe::default();
        let process = Process {
            relay: self.clone(),
            probe: probe.clone(),
        };
        (Store::from_backend(process), probe)
    }
}

/// One process's backend.
struct Process {
    relay: Relay,
    probe: Probe,
}

impl Process {
    fn publish(&self, event: Event) {
        // No listener (no store subscribed yet) is not an error.
        let _ = self.relay.bus.send(event);
    }

    fn released(&self, lease: LeaseRef<'_>) {
        self.publish(Event::Released {
            mode: lease.mode,
            namespace: lease.lock.namespace.to_owned(),
            name: lease.lock.name.to_vec(),
        });
    }
}

impl Backend for Process {
    fn acquire<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Acquisition>> {
        Box::pin(async move {
            self.probe.acquisitions.fetch_add(1, Ordering::SeqCst);
            if self.probe.stalled.load(Ordering::SeqCst) {
                tokio::time::sleep(STALL).await;
            }
            let acquisition = self.relay.server.acquire(lease).await?;
            if let Acquisition::Busy { .. } = acquisition
                && lease.mode == Mode::Write
                && lease.lock.write_intent().is_some()
            {
                self.publish(Event::WriteIntent {
                    namespace: lease.lock.namespace.to_owned(),
                    name: lease.lock.name.to_vec(),
                });
            }
            Ok(acquisition)
        })
    }

    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Extended>> {
        self.relay.server.extend(lease)
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let released = self.relay.server.release(lease).await?;
            if released {
                self.released(lease);
            }
            Ok(released)
        })
    }

    fn withdraw_intent<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            let withdrawn = self.relay.server.withdraw_intent(lease).await?;
            if withdrawn {
                self.released(lease);
            }
            Ok(withdrawn)
        })
    }

    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, Result<u32>> {
        self.relay.server.in_use(lock)
    }

    fn notify_to(&self, sink: NotificationSink) -> bool {
        let mut events = self.relay.bus.subscribe();
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
