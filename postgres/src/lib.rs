//! A PostgreSQL store for [`tower-lease`](tower_lease): the leases of `Lock`, `RwLock` and
//! `Semaphore`, their fences and `IdempotencyLayer`'s records, in the database your data
//! already lives in.
//!
//! ```no_run
//! use std::time::Duration;
//! use tower_lease::{Lock, Store};
//! use tower_lease_postgres::PgStore;
//!
//! const INVOICES: Lock<u64> = Lock::new("invoice", Duration::from_secs(30)).fenced();
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tower_lease::Error> {
//! let store: Store = PgStore::connect("postgres://app@127.0.0.1/app").await?.into();
//! if let Some(token) = INVOICES.try_lock(&store, &42).await? {
//!     // token.fence(): larger than every fence of invoice 42 before, across restarts.
//!     token.release().await?;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # How it keeps leases
//!
//! Each call is one PL/pgSQL function of the store's schema (`tower_lease` unless the
//! [builder](PgStore::builder) names another; installed at connect, see
//! [`PgStore::from_pool`], or by your migrations with [`schema_sql`]), sent as one prepared
//! statement: one round trip, one transaction. A store refuses a schema that a newer version
//! installed, and one that does not install refuses any other version.
//! The calls on one name are ordered: a `Lock`'s by the lock of its one row (its acquisition
//! is one `INSERT … ON CONFLICT DO UPDATE … WHERE` the lease ended, as `SET NX` on Redis), the
//! other kinds' by a transaction-scoped advisory lock on the name, since they touch several
//! rows. Time is the server's clock (`clock_timestamp()`): the application servers' clocks
//! never count. A `Lock`, an `RwLock`, a `Semaphore` and an idempotency key of
//! the same namespace and name are four separate things, as in Redis.
//!
//! - Fences are `max(last + 1, server clock in µs)`, the last one kept in the lock's row for
//!   an hour after its last acquisition: they only grow, across restarts, restores and
//!   truncated tables, as long as the server's clock does not step back.
//! - Ended leases are deleted by the calls that next touch their name, and in batches by a
//!   sweep each store sends about once a second ([`sweep_every`](PgStoreBuilder::sweep_every))
//!   after one of its acquisitions, on a task of its own (no call waits for it), reading only
//!   the rows due through an index no call writes: there is no background job.
//! - A release, a withdrawn write intent and a completed idempotency key `NOTIFY` the channel
//!   named as the schema when a refused call marked the name as waited on (a notifying commit takes
//!   a database-wide lock, so an uncontended release skips it); each store listens on a
//!   connection of its own and wakes its waiters. The mark is written under the lock the
//!   release takes, and a waiter tries again once it listens, so no release it waits for goes
//!   unheard. The listening connection sends a heartbeat every second, so one cut off
//!   without a reset is found in about 3 s; while it is down and being replaced the waiters
//!   poll, and once the new one listens every waiter tries again.
//! - Every call is bounded by the store's [`timeout`](PgStore::timeout) (1 s by default). A
//!   connection found closed is dropped and the call sent again on another within it; the
//!   functions are safe to run twice (an acquisition that finds its own secret answers
//!   "acquired").
//!   A call that timed out keeps its connection for the release that gives back what it may
//!   still take, so that release runs after it; any other call's is closed, never pooled with
//!   its statement on it. The server bounds each call too (`statement_timeout`,
//!   `lock_timeout`), and `connect` turns on TCP keepalives and `tcp_user_timeout`.
//!
//! # TLS
//!
//! Under the default feature `tls` (rustls on the `ring` provider), the pool and the listener
//! speak TLS as the URL's `sslmode` says, and verify the server's certificate and name as
//! libpq does (under `verify-ca` and `verify-full`, or once CAs are given by `sslrootcert` in
//! the URL or [`root_certificates`](PgStoreBuilder::root_certificates)): see
//! [`PgStore::connect`]. Without it, every connection is plain text.
//!
//! # Seen by operators
//!
//! Every session of a store carries its `application_name` (`tower-lease`, the URL's, or the
//! [builder](PgStoreBuilder::application_name)'s), and the view `<schema>.leases` lists each
//! live lease: its kind, namespace and name, its holder (the `application_name` and address of
//! the session that took it), its expiry and its fence.
//!
//! # The pool
//!
//! [`deadpool-postgres`](deadpool_postgres): its connections keep a cache of prepared
//! statements each (every call here is one), it recycles a connection by checking that it is
//! still open rather than with a query per checkout, and it builds from a URL or a
//! `tokio_postgres::Config` with the TLS connector of your choice. `bb8-postgres` would need
//! the statement cache written here.
//!
//! Behind a transaction pooler (PgBouncer with `pool_mode = transaction`), build the store with
//! [`transaction_pooler(true)`](PgStoreBuilder::transaction_pooler) and listen on a direct URL
//! ([`PgStore::listen`]): each call is then the unnamed statement with its parameters' types,
//! in a transaction of its own that sets what the call needs with `SET LOCAL`.
//!
//! # Effects in your transaction
//!
//! With `IdempotencyLayer` on a `PgStore`, a handler can [`claim`] its idempotency key in the
//! transaction that makes its effect, so that a retry after a crash between that commit and
//! the response never runs the effect again: the layer runs the handler again, its claim
//! answers [`ClaimError::AlreadyClaimed`], and it answers from its own record. A store in a
//! schema of another name claims with [`claim_in`]. An application on sqlx claims in its sqlx
//! transaction with `sqlx::claim` (the `sqlx` feature); any other driver sends the claim's one
//! statement, which [`claim`] documents.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![forbid(unsafe_code)]

mod backend;
mod call;
mod check;
mod claim;
mod idempotency;
mod many;
mod naming;
mod network;
mod notify;
mod options;
mod schema;
mod session;
#[cfg(feature = "sqlx")]
pub mod sqlx;
mod statement;
mod store;
mod sweep;
mod tls;
mod version;

/// The README's examples, compiled as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

pub use self::check::PgWarning;
pub use self::claim::{ClaimError, claim, claim_in};
pub use self::options::PgStoreBuilder;
pub use self::schema::{contract_sql, schema_index_sql, schema_sql};

/// The version of the schema this crate installs and calls. Its functions and type carry it in
/// their names (`tower_lease.lock_acquire_v9`), so that two versions of the crate run side by
/// side on one database while a deploy or a rollback goes through; `schema_version` holds a
/// row for each version installed.
pub const SCHEMA_VERSION: i32 = version::VERSION;
pub use self::store::PgStore;

/// The pool a [`PgStore`] runs on, re-exported for [`PgStore::from_pool`].
pub use deadpool_postgres;
/// The client the pool and [`claim`] speak, re-exported.
pub use tokio_postgres;
