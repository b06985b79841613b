//! Release notifications from Redis, for bounded waits: every release that frees a name
//! publishes on the name's channel (the lock's key without its role suffix), and one subscriber
//! connection per store, started on first use, hands what it hears to the store's
//! [`NotificationSink`], which wakes this process's waiter of that name.
//!
//! # Lifecycle
//!
//! - **Starts** with the first [`watch`](Notifier::watch): it connects a `PubSub` connection
//!   and spawns the task that reads its messages.
//! - **Owns** the subscriptions of the names that have a waiter in this process (one each: the
//!   store's handle asks for the first waiter of a name only), until [`unwatch`](Notifier::unwatch).
//! - **Restarts by itself** when the connection ends (a Redis restart, a network cut): it wakes
//!   every watcher (a restart may have freed their locks without a message), reconnects with a
//!   backoff of 10 to 100 ms, and subscribes again to the names still watched.
//! - **Stops** when the store is dropped: the task holds only a weak handle on the notifier.
//!
//! - **Follows the primary** on a Sentinel store: when the primary moves, the connection to
//!   the old one is dropped as if it ended, and the new one is subscribed to.
//!
//! Without it (a store built from a bare connection, or a failed subscription) waiters poll.
//!
//! # On a cluster
//!
//! With sharded notifications (`cluster/sharded.rs`: Redis 7.0 on every master) the subscriber is one
//! cluster connection, which subscribes with `SSUBSCRIBE` on the master that owns each name and
//! reconnects to its nodes by itself; it never ends, so the lifecycle above reads differently:
//!
//! - a lost node (a `Disconnection` push) wakes every watcher, and redis-rs subscribes to that
//!   node's channels again once it is back; each confirmation wakes its watcher once more, since
//!   a release may have gone unheard in between;
//! - a slot that moved to another master ends its subscriptions there (an `sunsubscribe` the
//!   server sends): the watcher is woken and the channel subscribed again, on the new owner.

pub(in crate::store::redis) mod subscriber;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;

#[cfg(feature = "cluster")]
use super::cluster::sharded::Push;
use super::keys::{Key, ON_STACK};
pub(crate) use super::notify::subscriber::Subscriber;
use super::notify::subscriber::{Reader, Sink, Source};
use super::{KeyLayout, KeyRole};
use crate::backend::{Mode, NotificationSink};
use redis::aio::PubSubStream;

/// The payload of the message a refused writer of a phase-fair or writers-first lock publishes on the
/// lock's channel (`write_acquire.lua`); a lease's release publishes its holder's secret (16
/// bytes), and others (an intent withdrawn, an idempotency key's end) an empty one.
const INTENT: &[u8] = b"w";
/// How long a release's own message is looked for: one that did not publish (nobody marked
/// it) leaves its secret behind, which nothing else will carry.
const ECHO_WITHIN: Duration = Duration::from_secs(5);
const FIRST_RECONNECT: Duration = Duration::from_millis(10);
const MAX_RECONNECT: Duration = Duration::from_millis(100);
/// How long resubscribing after a lost connection may take: a store's default timeout.
const RESUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(1);

/// A store's subscriber connection, and the names this process watches.
pub(crate) struct Notifier {
    subscriber: Subscriber,
    /// Where what it hears goes: the store's handle's hub, set when the handle is made.
    delivery: OnceLock<NotificationSink>,
    state: Mutex<State>,
    /// Serialises connecting, subscribing and unsubscribing, so a name's unsubscribe never
    /// overtakes a new subscription to it.
    commands: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct State {
    /// The live connection's sink; `None` before the first watch and while reconnecting.
    sink: Option<Sink>,
    /// The watched channels, and the lock each is for.
    channels: HashMap<Vec<u8>, Watched>,
    /// Sharded channels whose subscription a lost node or a moved slot ended, until it is
    /// confirmed again.
    #[cfg(feature = "cluster")]
    stale: std::collections::HashSet<Vec<u8>>,
    /// The secrets this store released on a watched channel lately, with when: a message
    /// that carries one is this store's own release coming back (see
    /// [`expect_echo`](Notifier::expect_echo)).
    echoes: Vec<(Box<[u8]>, Instant)>,
}

/// The lock a channel is watched for, as the sink names it.
pub(crate) struct Watched {
    pub(crate) mode: Mode,
    pub(crate) namespace: Box<str>,
    pub(crate) name: Box<[u8]>,
}

impl fmt::Debug for Notifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        f.debug_struct("Notifier")
            .field("connected", &state.sink.is_some())
            .field("channels", &state.channels.len())
            .finish()
    }
}

/// The channel releases of `name` publish on: the lock's key without its role suffix.
pub(crate) fn channel(layout: &KeyLayout, mode: Mode, namespace: &str, name: &[u8]) -> Vec<u8> {
    channel_arg(layout, mode, namespace, name).0.concat()
}

/// [`channel`] as a command argument, written into the command without a `Vec` of its own.
pub(super) fn channel_arg<'a>(
    layout: &'a KeyLayout,
    mode: Mode,
    namespace: &'a str,
    name: &'a [u8],
) -> Key<'a> {
    let role = match mode {
        Mode::Exclusive => KeyRole::Lock,
        Mode::Permit => KeyRole::Permits,
        Mode::Reservation => KeyRole::Idempotency,
        Mode::Read | Mode::Write => KeyRole::Writer,
    };
    let mut parts = layout.parts(role, namespace, name);
    if matches!(mode, Mode::Read | Mode::Write) {
        // Both modes' channel: the lock's, without the writer key's `:w`.
        parts[6] = b"";
    }
    Key(parts)
}

impl Notifier {
    pub(crate) fn new(subscriber: Subscriber) -> Arc<Self> {
        Arc::new(Notifier {
            subscriber,
            delivery: OnceLock::new(),
            state: Mutex::default(),
            commands: tokio::sync::Mutex::new(()),
        })
    }

    /// Delivers what it hears to `sink` from now on; `false` if it already delivers to
    /// another (a store's notifier serves one handle).
    pub(crate) fn deliver_to(&self, sink: NotificationSink) -> bool {
        self.delivery.set(sink).is_ok()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Subscribes to `channel`, the channel of `watched`; `false` when the subscription could
    /// not be made (the waiter then polls). Answers once the subscription is confirmed, so a
    /// release published after it is never missed.
    pub(crate) async fn watch(self: &Arc<Self>, channel: Vec<u8>, watched: Watched) -> bool {
        self.state().channels.insert(channel.clone(), watched);
        let _commands = self.commands.lock().await;
        let subscribed = match self.sink().await {
            Some(mut sink) => match sink.subscribe(std::slice::from_ref(&channel)).await {
                Ok(()) => true,
                Err(error) => {
                    tracing::debug!(%error, "subscribing to release notifications failed; polling");
                    false
                }
            },
            None => false,
        };
        if !subscribed {
            self.state().channels.remove(&channel);
        }
        subscribed
    }

    /// Nobody in this process watches `channel` any more: it is unsubscribed, in the
    /// background (unless it is watched again by then).
    pub(crate) fn unwatch(self: &Arc<Self>, channel: Vec<u8>) {
        {
            let mut state = self.state();
            state.channels.remove(&channel);
            #[cfg(feature = "cluster")]
            state.stale.remove(&channel);
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let notifier = self.clone();
        runtime.spawn(async move {
            let _commands = notifier.commands.lock().await;
            // Watched again meanwhile: that watch's subscription stands.
            let sink = {
                let state = notifier.state();
                if state.channels.contains_key(&channel) {
                    return;
                }
                state.sink.clone()
            };
            if let Some(mut sink) = sink {
                let _ = sink.unsubscribe(&channel).await;
            }
        });
    }

    /// The live connection's sink, connecting first if there is none. Called under
    /// `commands`.
    async fn sink(self: &Arc<Self>) -> Option<Sink> {
        if let Some(sink) = self.state().sink.clone() {
            return Some(sink);
        }
        match self.subscriber.connect().await {
            Ok((sink, reader)) => {
                self.state().sink = Some(sink.clone());
                match reader {
                    Reader::Plain(plain) => {
                        let (source, stream) = *plain;
                        tokio::spawn(read(Arc::downgrade(self), source, stream));
                    }
                    #[cfg(feature = "cluster")]
                    Reader::Sharded(pushes) => {
                        tokio::spawn(read_sharded(Arc::downgrade(self), pushes));
                    }
                    #[cfg(feature = "cluster")]
                    Reader::Running => {}
                }
                Some(sink)
            }
            Err(error) => {
                tracing::debug!(%error, "no release notifications: the subscriber could not connect");
                None
            }
        }
    }

    /// This store releases the lease held with `secret`, whose release publishes (when a
    /// waiter marked it) on `channel`, with the secret as its payload. Its waiters in this
    /// process wake on the release itself, so that message, when it comes back, wakes none of
    /// them a second time. Noted only while the channel is watched: a message on another one
    /// reaches nobody anyway.
    pub(in crate::store::redis) fn expect_echo(&self, channel: Key<'_>, secret: &[u8]) {
        // Joined on the stack: this runs on every release of a store with notifications.
        let mut buf = [0; ON_STACK];
        let channel = channel.join_in(&mut buf);
        let mut state = self.state();
        if !state.channels.contains_key(&*channel) {
            return;
        }
        let now = Instant::now();
        state
            .echoes
            .retain(|(_, at)| now.saturating_duration_since(*at) < ECHO_WITHIN);
        state.echoes.push((secret.into(), now));
    }

    /// A message on `channel`: a write intent for the shares, a release for the watcher
    /// (unless it is this store's own, come back).
    fn heard(&self, channel: &[u8], payload: &[u8]) {
        let Some(delivery) = self.delivery.get() else {
            return;
        };
        let mut state = self.state();
        if payload != INTENT
            && let Some(own) = state
                .echoes
                .iter()
                .position(|(secret, _)| **secret == *payload)
        {
            state.echoes.swap_remove(own);
            return;
        }
        let Some(watched) = state.channels.get(channel) else {
            return;
        };
        // A write intent, not a release: it frees nothing a waiter could take.
        if payload == INTENT {
            delivery.write_intent(&watched.namespace, &watched.name);
        } else {
            delivery.released(watched.mode, &watched.namespace, &watched.name);
        }
    }

    /// Wakes the watcher of `channel`, as a release would.
    #[cfg(feature = "cluster")]
    fn wake(&self, state: &State, channel: &[u8]) {
        if let (Some(delivery), Some(watched)) = (self.delivery.get(), state.channels.get(channel))
        {
            delivery.released(watched.mode, &watched.namespace, &watched.name);
        }
    }

    /// The connection ended: wake every watcher and forget the sink.
    fn disconnected(&self) -> Vec<Vec<u8>> {
        let mut state = self.state();
        state.sink = None;
        if let Some(delivery) = self.delivery.get() {
            delivery.missed();
        }
        state.channels.keys().cloned().collect()
    }
}

/// The subscriber task: hands each message to its watcher; when the connection ends (or the
/// primary moved away from it), wakes them all and reconnects while any name is watched (see
/// the module docs).
async fn read(notifier: Weak<Notifier>, mut source: Source, mut stream: PubSubStream) {
    loop {
        loop {
            let message = tokio::select! {
                message = stream.next() => message,
                () = source.moved() => None,
            };
            let Some(message) = message else {
                break;
            };
            let Some(notifier) = notifier.upgrade() else {
                return;
            };
            let Ok(channel) = message.get_channel::<Vec<u8>>() else {
                continue;
            };
            notifier.heard(&channel, message.get_payload_bytes());
        }
        let mut backoff = FIRST_RECONNECT;
        stream = loop {
            let Some(notifier) = notifier.upgrade() else {
                return;
            };
            let watched = notifier.disconnected();
            if watched.is_empty() {
                // Nobody waits: the next watch connects again.
                return;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_RECONNECT);
            let _commands = notifier.commands.lock().await;
            // Bounded, since redis-rs bounds neither: a connection or a `SUBSCRIBE` that hangs
            // (a network cut) would hold `commands`, and so every new watch, for good.
            let subscribed = tokio::time::timeout(RESUBSCRIBE_TIMEOUT, async {
                let (mut sink, stream) = source.pubsub().await?.split();
                sink.subscribe(&watched).await?;
                Ok::<_, redis::RedisError>((sink, stream))
            });
            let Ok(Ok((sink, stream))) = subscribed.await else {
                continue;
            };
            notifier.state().sink = Some(Sink::Plain(sink));
            tracing::debug!(channels = watched.len(), "release notifications resumed");
            break stream;
        };
    }
}

/// The sharded subscriber's task: hands each message to its watcher, and wakes and subscribes
/// again the watchers whose subscription a lost node or a moved slot ended (see the module docs).
/// The pushes end with the notifier, whose connection holds their sender.
#[cfg(feature = "cluster")]
async fn read_sharded(
    notifier: Weak<Notifier>,
    mut pushes: tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
) {
    while let Some(push) = pushes.recv().await {
        let Some(notifier) = notifier.upgrade() else {
            return;
        };
        match Push::from(push) {
            Push::Message { channel, payload } => notifier.heard(&channel, &payload),
            Push::Subscribed(channel) => {
                let mut state = notifier.state();
                if state.stale.remove(&channel) {
                    notifier.wake(&state, &channel);
                }
            }
            // Ours (a watch dropped) when nobody watches the channel any more.
            Push::Unsubscribed(channel) => {
                let mut state = notifier.state();
                if !state.channels.contains_key(&channel) {
                    continue;
                }
                notifier.wake(&state, &channel);
                state.stale.insert(channel.clone());
                drop(state);
                tokio::spawn(resubscribe(notifier.clone(), channel));
            }
            Push::Disconnected => {
                let mut state = notifier.state();
                if let Some(delivery) = notifier.delivery.get() {
                    delivery.missed();
                }
                let State {
                    channels, stale, ..
                } = &mut *state;
                stale.extend(channels.keys().cloned());
            }
            Push::Other => {}
        }
    }
}

/// Subscribes to `channel` again after the server ended its subscription (its slot moved), with
/// a backoff while that fails, for as long as it is watched.
#[cfg(feature = "cluster")]
async fn resubscribe(notifier: Arc<Notifier>, channel: Vec<u8>) {
    let mut backoff = FIRST_RECONNECT;
    loop {
        {
            let _commands = notifier.commands.lock().await;
            let sink = {
                let state = notifier.state();
                if !state.channels.contains_key(&channel) {
                    return;
                }
                state.sink.clone()
            };
            let Some(mut sink) = sink else {
                return;
            };
            let channels = std::slice::from_ref(&channel);
            // Bounded as the plain subscriber's resubscription is, for the same reason.
            let subscribed = tokio::time::timeout(RESUBSCRIBE_TIMEOUT, sink.subscribe(channels));
            if let Ok(Ok(())) = subscribed.await {
                tracing::debug!("a moved channel's release notifications resumed");
                return;
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_RECONNECT);
    }
}
