//! The isolation every call runs at: read committed, whatever the sessions' default.
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

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use deadpool_postgres::{ClientWrapper, Hook, HookError};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Error, Row, Statement};

/// The sessions' default the calls need, set on each connection of a pool the store makes.
const SET_READ_COMMITTED: &str = "SET SESSION default_transaction_isolation = 'read committed'";
/// A transaction at read committed, around one call on a session of unknown default.
const BEGIN_READ_COMMITTED: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";
const COMMIT: &str = "COMMIT";

/// What the sessions of a store's pool default to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sessions {
    /// Read committed: the store made the pool, and set it on each connection.
    ReadCommitted,
    /// Whatever the application's pool gives: each call in a transaction of its own.
    AnyDefault,
}

/// The hook that sets the default on each new connection of a pool the store makes.
pub(crate) fn read_committed_hook() -> Hook {
    Hook::async_fn(|client: &mut ClientWrapper, _| {
        Box::pin(async move {
            client
                .batch_execute(SET_READ_COMMITTED)
                .await
                .map_err(HookError::Backend)
        })
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
/// round trip), each its own transaction at read committed; the answers in order.
pub(crate) async fn query_each(
    client: &Client,
    sessions: Sessions,
    statement: &Statement,
    params: &[&[&(dyn ToSql + Sync)]],
) -> Answers {
    let mut sent: Vec<Sent<'_>> = Vec::with_capacity(params.len() * 3);
    let wrap = sessions == Sessions::AnyDefault;
    for params in params {
        if wrap {
            sent.push(Box::pin(async move {
                client
                    .batch_execute(BEGIN_READ_COMMITTED)
                    .await
                    .map(|()| None)
            }));
        }
        sent.push(Box::pin(async move {
            client.query_one(statement, params).await.map(Some)
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
