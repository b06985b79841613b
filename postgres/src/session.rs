//! What every call's session is set to: read committed, whatever the sessions' default, and
//! the store's timeout as the server's bound on each statement.
//!
//! The functions take the name's lock, then read its rows. At read committed each statement of
//! a function reads what committed before it began, so after the lock's wait it reads what the
//! call before it wrote. At repeatable read or serializable (`ALTER ROLE/DATABASE … SET
//! default_transaction_isolation`, a pool's own settings) the snapshot is the first
//! statement's, taken before the wait: a reader would enter beside the writer that just
//! committed, a semaphore over-admit, and upserts fail with serialization errors.
//!
//! So the sessions of a pool the store makes default to read committed, set once when each
//! connection opens (the `post_create` hook of [`connect`](crate::PgStoreBuilder::connect);
//! a `SET`, not the startup parameter `options`, which PgBouncer refuses): no call pays for
//! it. The sessions of a pool of the application may default to anything, so each call there
//! runs in a transaction of its own, `BEGIN ISOLATION LEVEL READ COMMITTED`, the call and
//! `COMMIT` sent together in one round trip.
//!
//! A call cut off (the deadline, a caller that gave up) never leaves its connection inside
//! that transaction: the three are written to the connection together, in the first poll of
//! the call, before it can be cut off, and the server runs them in order; a connection that
//! answered the `BEGIN` or the `COMMIT` with an error is discarded, not pooled.
//!
//! The server bounds each call too: `statement_timeout` and `lock_timeout` are the store's
//! timeout, set with the default on each connection of a pool the store makes (a connection
//! opened before [`PgStore::timeout`](crate::PgStore::timeout) changed it is closed at its
//! next checkout, not used), and with `SET LOCAL` in the per-call transaction on a pool of the
//! application. Equal to the client's deadline, not below it nor above: the server's clock for
//! a statement starts after the call's (which began before the checkout and the send), so it
//! never cancels a statement whose caller still waits, and it ends one the caller gave up on
//! within about a round trip of the deadline instead of letting it wait on a lock and act
//! later. A server-side cancel answers [`Error::Timeout`](tower_lease::Error::Timeout).

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::{Duration, Instant};

use deadpool_postgres::{ClientWrapper, Hook, HookError};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Error, Row};

use crate::statement::Prepared;

/// The sessions' default the calls need, set on each connection of a pool the store makes.
const SET_READ_COMMITTED: &str = "SET SESSION default_transaction_isolation = 'read committed'";
const COMMIT: &str = "COMMIT";

/// What the sessions of a store's pool default to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sessions {
    /// Read committed: the store made the pool, and set it on each connection.
    ReadCommitted,
    /// Whatever the application's pool gives: each call in a transaction of its own.
    AnyDefault,
}

/// The server's bound on each statement of a pool the store makes, shared with its hooks:
/// the store's timeout, and when it last changed.
#[derive(Debug)]
pub(crate) struct ServerBound {
    millis: AtomicU64,
    changed: Mutex<Option<Instant>>,
}

impl ServerBound {
    pub(crate) fn new(timeout: Duration) -> Self {
        ServerBound {
            millis: AtomicU64::new(millis(timeout)),
            changed: Mutex::new(None),
        }
    }

    /// Bounds the statements of connections opened from now on by `timeout`; those opened
    /// before are closed at their next checkout, unless it did not change.
    pub(crate) fn set(&self, timeout: Duration) {
        let mut changed = self.changed.lock().unwrap_or_else(|e| e.into_inner());
        if self.millis.swap(millis(timeout), Ordering::SeqCst) != millis(timeout) {
            *changed = Some(Instant::now());
        }
    }

    fn millis(&self) -> u64 {
        self.millis.load(Ordering::SeqCst)
    }

    /// Whether a connection opened at `created` may have the bound before the last change.
    fn stale(&self, created: Instant) -> bool {
        let changed = self.changed.lock().unwrap_or_else(|e| e.into_inner());
        changed.is_some_and(|changed| created <= changed)
    }
}

/// `timeout` in whole milliseconds, rounded up, as `statement_timeout` takes it (at least 1:
/// 0 would turn the bound off; at most what the setting holds).
pub(crate) fn millis(timeout: Duration) -> u64 {
    let ms = timeout.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms)
        .unwrap_or(u64::MAX)
        .clamp(1, i32::MAX as u64)
}

/// The hook that sets the default isolation and the server's bound on each new connection of
/// a pool the store makes, in one round trip.
pub(crate) fn session_hook(bound: std::sync::Arc<ServerBound>) -> Hook {
    Hook::async_fn(move |client: &mut ClientWrapper, _| {
        let ms = bound.millis();
        Box::pin(async move {
            client
                .batch_execute(&format!(
                    "{SET_READ_COMMITTED}; SET SESSION statement_timeout = {ms}; \
                     SET SESSION lock_timeout = {ms}"
                ))
                .await
                .map_err(HookError::Backend)
        })
    })
}

/// The hook that closes, at its checkout, a connection opened before the bound last changed.
pub(crate) fn stale_hook(bound: std::sync::Arc<ServerBound>) -> Hook {
    Hook::sync_fn(move |_, metrics| {
        if bound.stale(metrics.created) {
            return Err(HookError::Message(
                "opened before the store's timeout changed".into(),
            ));
        }
        Ok(())
    })
}

/// A statement's answer, and whether the connection must not go back to the pool.
pub(crate) struct Answers {
    pub(crate) rows: Vec<Result<Row, Error>>,
    /// A `BEGIN` or `COMMIT` failed: the session's transaction state is not known.
    pub(crate) discard: bool,
}

type Sent<'a> = Pin<Box<dyn Future<Output = Result<Option<Row>, Error>> + Send + 'a>>;

/// Runs `statement` once per set of `params` on `client`, all written at once (pipelined, one
/// round trip), each its own transaction at read committed, bounded on the server by
/// `timeout`; the answers in order.
pub(crate) async fn query_each(
    client: &Client,
    sessions: Sessions,
    timeout: Duration,
    statement: &Prepared,
    params: &[&[&(dyn ToSql + Sync)]],
) -> Answers {
    // A transaction at read committed around one call on a session of unknown defaults, and
    // the server's bound on it.
    let ms = millis(timeout);
    let begin = format!(
        "BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = {ms}; \
         SET LOCAL lock_timeout = {ms}"
    );
    let begin = &begin;
    let mut sent: Vec<Sent<'_>> = Vec::with_capacity(params.len() * 3);
    let wrap = sessions == Sessions::AnyDefault;
    for params in params {
        if wrap {
            sent.push(Box::pin(async move {
                client.batch_execute(begin).await.map(|()| None)
            }));
        }
        sent.push(Box::pin(async move {
            statement.query_one(client, params).await.map(Some)
        }));
        if wrap {
            sent.push(Box::pin(async move {
                client.batch_execute(COMMIT).await.map(|()| None)
            }));
        }
    }
    let mut answers = in_order(sent).await.into_iter();
    let mut rows = Vec::with_capacity(params.len());
    let mut discard = false;
    while let Some(first) = answers.next() {
        if !wrap {
            rows.push(first.map(|row| row.expect("a call answers a row")));
            continue;
        }
        let (call, commit) = (answers.next(), answers.next());
        let (Some(call), Some(commit)) = (call, commit) else {
            unreachable!("three requests a call");
        };
        // A failed `BEGIN` or `COMMIT` leaves the session's transaction unknown; a failed call
        // only aborts it, and its `COMMIT` ends it (answering `ROLLBACK`).
        discard |= first.is_err() || commit.is_err();
        rows.push(match (first, call, commit) {
            (_, Err(e), _) | (Err(e), _, _) | (_, _, Err(e)) => Err(e),
            (Ok(_), Ok(row), Ok(_)) => Ok(row.expect("a call answers a row")),
        });
    }
    Answers { rows, discard }
}

/// Polls every future, the first time in order (each writes its request to the connection in
/// its first poll, so they reach the server in this order), until all answered.
async fn in_order<T>(mut sent: Vec<Pin<Box<dyn Future<Output = T> + Send + '_>>>) -> Vec<T> {
    let mut answers: Vec<Option<T>> = sent.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (future, answer) in sent.iter_mut().zip(answers.iter_mut()) {
            if answer.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(done) => *answer = Some(done),
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    answers
        .into_iter()
        .map(|a| a.expect("every future answered"))
        .collect()
}
