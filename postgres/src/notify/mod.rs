//! Release notifications: a release, withdrawn write intent or completed idempotency key
//! `NOTIFY`s the channel named as the store's schema (`tower_lease`) in the function that made
//! it (delivered when it commits) when a refused call marked the name as waited on, and each
//! store listens on a connection of its own ([`listener`]), handing what it hears to the
//! core's [`NotificationSink`]. The listener hears every lock, so watching one only waits
//! until it first listens; while it is down (its connection lost, a new one not yet
//! listening), watching answers an error at once, and the waiter polls.

mod listener;
mod payload;

use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tower_lease::backend::NotificationSink;
use tower_lease::{Error, Result};

use crate::naming::Schema;
use crate::tls::Connector;

/// Where a store's listener is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum State {
    /// Connecting for the first time.
    Starting,
    /// Listening: every notification from now on reaches the sink.
    Listening,
    /// Its connection failed or was lost, and a new one does not listen yet: notifications
    /// go unheard.
    Down,
}

/// How a store listens: the database to connect to and how (TLS), the schema whose channel it
/// listens on, and where its listener is now (set once the store's
/// [`Store`](tower_lease::Store) handed it its sink).
#[derive(Debug)]
pub(crate) struct Listening {
    config: tokio_postgres::Config,
    schema: Schema,
    tls: Connector,
    state: Arc<Mutex<Option<watch::Receiver<State>>>>,
}

impl Clone for Listening {
    /// A clone made into another `Store` listens for that one: it starts without a listener.
    fn clone(&self) -> Self {
        Listening::new(self.config.clone(), self.schema, self.tls.clone())
    }
}

impl Listening {
    pub(crate) fn new(config: tokio_postgres::Config, schema: Schema, tls: Connector) -> Self {
        Listening {
            config,
            schema,
            tls,
            state: Arc::default(),
        }
    }

    /// Starts the listener that delivers to `sink`; `false` outside a tokio runtime, where
    /// nothing can listen.
    pub(crate) fn start(&self, sink: NotificationSink) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let (tell, state) = watch::channel(State::Starting);
        *self.state.lock().unwrap_or_else(|e| e.into_inner()) = Some(state);
        let listen = format!("LISTEN {}", self.schema.quoted());
        let (config, tls) = (self.config.clone(), self.tls.clone());
        runtime.spawn(listener::listen(config, tls, listen, sink, tell));
        true
    }

    /// Resolves once the listener listens (at once while it does; when it first connects,
    /// once it listens): from then on every notification reaches the sink. An error while
    /// it is down, at once: a waiter then polls rather than trust notifications that go
    /// unheard.
    pub(crate) async fn listening(&self) -> Result<()> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(mut state) = state else {
            return Err(Error::Backend("the store has no listener".into()));
        };
        let listening = match state.wait_for(|now| *now != State::Starting).await {
            Ok(now) => *now == State::Listening,
            Err(_) => return Err(Error::Backend("the store's listener stopped".into())),
        };
        if listening {
            Ok(())
        } else {
            Err(Error::Backend(
                "the store's listener is down (reconnecting): polling".into(),
            ))
        }
    }
}
