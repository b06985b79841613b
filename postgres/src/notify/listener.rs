//! The listening task: a connection of its own that `LISTEN`s on the schema's channel and hands
//! each notification to the sink; reconnects with backoff when the connection is lost (and then
//! tells the sink notifications may have been missed), and stops once every `Store` on the
//! backend is gone.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio_postgres::{AsyncMessage, NoTls};
use tower_lease::backend::NotificationSink;

use super::payload::Heard;

/// The first pause before connecting again; it doubles up to [`LAST_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const LAST_PAUSE: Duration = Duration::from_secs(2);
/// How often a quiet listener looks whether its store is gone.
const LOOK: Duration = Duration::from_secs(1);

pub(super) async fn listen(
    config: tokio_postgres::Config,
    listen: String,
    sink: NotificationSink,
    listening: watch::Sender<bool>,
) {
    let mut pause = FIRST_PAUSE;
    let mut first = true;
    while !sink.is_closed() {
        match session(&config, &listen, &sink, &listening).await {
            Ok(()) => pause = FIRST_PAUSE,
            Err(e) => tracing::debug!(error = %e, "tower_lease listener: connection failed"),
        }
        listening.send_replace(false);
        // A release made while nobody listened went unheard.
        if !first {
            sink.missed();
        }
        first = false;
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LAST_PAUSE);
    }
}

/// One connection's life: `Ok` once it was listening and then ended.
async fn session(
    config: &tokio_postgres::Config,
    listen: &str,
    sink: &NotificationSink,
    listening: &watch::Sender<bool>,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.connect(NoTls).await?;
    let (heard, mut hear) = mpsc::unbounded_channel();
    // The connection's messages must be read while the client talks: a task of its own.
    let reader = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(|cx| connection.poll_message(cx));
        while let Some(Ok(message)) = messages.next().await {
            if let AsyncMessage::Notification(n) = message {
                let _ = heard.send(n);
            }
        }
    });
    let listened = client.batch_execute(listen).await;
    if let Err(e) = listened {
        reader.abort();
        return Err(e);
    }
    listening.send_replace(true);
    loop {
        tokio::select! {
            n = hear.recv() => match n {
                Some(n) => match Heard::parse(n.payload()) {
                    Some(heard) => heard.deliver(sink),
                    None => tracing::debug!(payload = n.payload(), "tower_lease listener: unknown payload"),
                },
                None => break,
            },
            () = tokio::time::sleep(LOOK) => {
                if sink.is_closed() {
                    break;
                }
            }
        }
    }
    drop(client);
    reader.abort();
    Ok(())
}
