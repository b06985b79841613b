//! Release notifications: a release, withdrawn write intent or completed idempotency key
//! `NOTIFY`s the channel named as the store's schema (`tower_lease`) in the function that made
//! it (delivered when it commits) when a refused call marked the name as waited on, and each
//! store listens on a connection of its own ([`listener`]), handing what it hears to the
//! core's [`NotificationSink`]. The listener hears every lock, so watching one
//! only waits until it listens.

mod listener;
mod payload;

use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tower_lease::backend::NotificationSink;
use tower_lease::{Error, Result};

use crate::naming::Schema;

/// How a store listens: the database to connect to, the schema whose channel it listens on,
/// and whether its listener is listening now (set once the store's
/// [`Store`](tower_lease::Store) handed it its sink).
#[derive(Debug)]
pub(crate) struct Listening {
    config: tokio_postgres::Config,
    schema: Schema,
    listening: Arc<Mutex<Option<watch::Receiver<bool>>>>,
}

impl Clone for Listening {
    /// A clone made into another `Store` listens for that one: it starts without a listener.
    fn clone(&self) -> Self {
        Listening::new(self.config.clone(), self.schema)
    }
}

impl Listening {
    pub(crate) fn new(config: tokio_postgres::Config, schema: Schema) -> Self {
        Listening {
            config,
            schema,
            listening: Arc::default(),
        }
    }

    /// Starts the listener that delivers to `sink`; `false` outside a tokio runtime, where
    /// nothing can listen.
    pub(crate) fn start(&self, sink: NotificationSink) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        let (tell, listening) = watch::channel(false);
        *self.listening.lock().unwrap_or_else(|e| e.into_inner()) = Some(listening);
        let listen = format!("LISTEN {}", self.schema.quoted());
        runtime.spawn(listener::listen(self.config.clone(), listen, sink, tell));
        true
    }

    /// Resolves once the listener listens (at once while it does): from then on every
    /// notification reaches the sink.
    pub(crate) async fn listening(&self) -> Result<()> {
        let listening = self
            .listening
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(mut listening) = listening else {
            return Err(Error::Backend("the store has no listener".into()));
        };
        match listening.wait_for(|now| *now).await {
            Ok(_) => Ok(()),
            Err(_) => Err(Error::Backend("the store's listener stopped".into())),
        }
    }
}
