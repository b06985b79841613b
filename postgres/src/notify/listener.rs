//! The listening task: a connection of its own (with TLS as the store's pool has it) that
//! `LISTEN`s on the schema's channel, hands each notification to the sink, and sends a
//! heartbeat every second, so that a connection cut off without a reset (a half-open one,
//! which would look healthy for hours) is found within seconds. A lost connection is
//! replaced, with backoff; it stops once every `Store` on the backend is gone.
//!
//! A release made while nobody listens goes unheard, so the sink hears that notifications may
//! have been missed ([`NotificationSink::missed`], which makes every waiter of the process try
//! again):
//!
//! - when the connection is found lost: a release between its death and that moment (up to
//!   the heartbeat's bound) went unheard, and the waiters whose release it was need not wait
//!   for a new connection, which may take long, to get in;
//! - every [`NUDGE`] while it is down: the waiters that trusted the notifications poll at the
//!   pace of those that have none, and the new ones do not trust them (the state is
//!   [`State::Down`], and watching answers an error), until the new `LISTEN` is in place;
//! - once the new `LISTEN` is in place: a release made before it, while reconnecting, went
//!   unheard, and from then on every release is heard.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_postgres::config::TargetSessionAttrs;
use tokio_postgres::{AsyncMessage, Client, Notification, SimpleQueryMessage};
use tower_lease::backend::NotificationSink;

use super::State;
use super::payload::Heard;
use crate::tls::Connector;

/// The first pause before connecting again after a failure or a loss; it doubles up to
/// [`LAST_PAUSE`] while connecting fails.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const LAST_PAUSE: Duration = Duration::from_secs(2);
/// How often a listening connection sends its heartbeat, and looks whether its store is gone.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long a heartbeat, or a connection and its `LISTEN`, may take: past it, the connection
/// counts as lost.
const ANSWER_WITHIN: Duration = Duration::from_secs(2);
/// While the listener is down, how often the waiters look again: the slowest poll of a waiter
/// without notifications.
const NUDGE: Duration = Duration::from_millis(100);
/// The heartbeat: what the server answers at once, and whether it still takes writes.
const HEARTBEAT_QUERY: &str = "SHOW transaction_read_only";

pub(super) async fn listen(
    config: tokio_postgres::Config,
    tls: Connector,
    listen: String,
    sink: NotificationSink,
    state: watch::Sender<State>,
) {
    let read_write = config.get_target_session_attrs() == TargetSessionAttrs::ReadWrite;
    let mut pause = Duration::ZERO;
    while !sink.is_closed() {
        let down = *state.borrow() == State::Down;
        let connecting = async {
            tokio::time::sleep(pause).await;
            tokio::time::timeout(ANSWER_WITHIN, Session::start(&config, &tls, &listen)).await
        };
        let started = tokio::select! {
            started = connecting => started,
            () = nudge(&sink), if down => return,
        };
        let session = match started {
            Ok(Ok(session)) => session,
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "tower_lease listener: connecting failed");
                state.send_replace(State::Down);
                pause = (pause * 2).clamp(FIRST_PAUSE, LAST_PAUSE);
                continue;
            }
            Err(_) => {
                tracing::debug!(
                    within = ?ANSWER_WITHIN,
                    "tower_lease listener: connecting took too long"
                );
                state.send_replace(State::Down);
                pause = (pause * 2).clamp(FIRST_PAUSE, LAST_PAUSE);
                continue;
            }
        };
        state.send_replace(State::Listening);
        // Every release from now on is heard; one made before, while nobody listened, was not.
        sink.missed();
        let Some(lost) = session.hear(&sink, read_write).await else {
            // The store is gone.
            return;
        };
        tracing::debug!(why = %lost, "tower_lease listener: connection lost");
        state.send_replace(State::Down);
        // A release between the connection's loss and now went unheard.
        sink.missed();
        pause = FIRST_PAUSE;
    }
}

/// Tells the sink every [`NUDGE`] that releases may go unheard; returns once the store is gone.
async fn nudge(sink: &NotificationSink) {
    loop {
        tokio::time::sleep(NUDGE).await;
        if sink.is_closed() {
            return;
        }
        sink.missed();
    }
}

/// A connection that listens.
struct Session {
    client: Client,
    heard: mpsc::UnboundedReceiver<Notification>,
    /// The task that reads the connection's messages: aborted, the connection closes.
    reader: Reader,
}

/// The reading task, aborted when dropped (also when connecting is given up midway).
struct Reader(JoinHandle<()>);

impl Drop for Reader {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Session {
    /// Connects and listens.
    async fn start(
        config: &tokio_postgres::Config,
        tls: &Connector,
        listen: &str,
    ) -> Result<Session, tokio_postgres::Error> {
        let (client, mut connection) = config.connect(tls.make()).await?;
        let (hear, heard) = mpsc::unbounded_channel();
        // The connection's messages must be read while the client talks: a task of its own,
        // which ends (dropping `hear`) when the connection does.
        let reader = Reader(tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(|cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notification(n) = message {
                    let _ = hear.send(n);
                }
            }
        }));
        client.batch_execute(listen).await?;
        Ok(Session {
            client,
            heard,
            reader,
        })
    }

    /// Hands each notification to the sink and sends the heartbeat, until the connection is
    /// lost (`Some`, why) or the store is gone (`None`). Under `read_write`
    /// (`target_session_attrs=read-write`) a server that turned read-only counts as lost: the
    /// releases are made, and notified, on the primary the pool follows, so the listener
    /// connects again, to the server that takes writes.
    async fn hear(self, sink: &NotificationSink, read_write: bool) -> Option<String> {
        let Session {
            client,
            mut heard,
            reader,
        } = self;
        let heartbeat = async {
            loop {
                tokio::time::sleep(HEARTBEAT).await;
                if sink.is_closed() {
                    return None;
                }
                let beat = client.simple_query(HEARTBEAT_QUERY);
                match tokio::time::timeout(ANSWER_WITHIN, beat).await {
                    Ok(Ok(answer)) if read_write && read_only(&answer) => {
                        return Some("the server no longer takes writes".to_owned());
                    }
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => return Some(format!("the heartbeat failed: {e}")),
                    Err(_) => {
                        return Some(format!("no heartbeat answered within {ANSWER_WITHIN:?}"));
                    }
                }
            }
        };
        let hearing = async {
            while let Some(n) = heard.recv().await {
                match Heard::parse(n.payload()) {
                    Some(heard) => heard.deliver(sink),
                    None => tracing::debug!(
                        payload = n.payload(),
                        "tower_lease listener: unknown payload"
                    ),
                }
            }
            Some("the connection closed".to_owned())
        };
        let lost = tokio::select! {
            lost = heartbeat => lost,
            lost = hearing => lost,
        };
        drop((client, reader));
        lost
    }
}

/// Whether the heartbeat's answer says the session is read-only (`on`).
fn read_only(answer: &[SimpleQueryMessage]) -> bool {
    answer.iter().any(|message| match message {
        SimpleQueryMessage::Row(row) => row.get(0) == Some("on"),
        _ => false,
    })
}
