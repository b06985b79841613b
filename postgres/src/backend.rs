//! [`Backend`] for [`PgStore`]: which function of the schema (the `.sql` files in `sql/`) each
//! call runs, and how its answer reads: by column name.

use std::time::Duration;

use tokio_postgres::Row;
use tokio_postgres::types::ToSql;
use tower_lease::backend::{
    Acquisition, Backend, Begin, BoxFuture, Completion, Extended, FINGERPRINT_LEN, LeaseRef,
    LockRef, Mode, NotificationSink,
};
use tower_lease::{Error, Result};

use crate::PgStore;
use crate::call::Acts;

const LOCK_ACQUIRE: &str = "SELECT acquired, fence, retry_after_us \
     FROM tower_lease.lock_acquire($1, $2, $3, $4, $5)";
const READ_ACQUIRE: &str = "SELECT acquired, fence, retry_after_us \
     FROM tower_lease.read_acquire($1, $2, $3, $4, $5, $6, $7)";
const WRITE_ACQUIRE: &str = "SELECT acquired, fence, retry_after_us \
     FROM tower_lease.write_acquire($1, $2, $3, $4, $5, $6, $7)";
const PERMIT_ACQUIRE: &str = "SELECT acquired, fence, retry_after_us \
     FROM tower_lease.permit_acquire($1, $2, $3, $4, $5)";
const LOCK_EXTEND: &str =
    "SELECT tower_lease.lock_extend($1, $2, $3, $4) AS held, false AS writer_waiting";
const RWLOCK_EXTEND: &str =
    "SELECT held, writer_waiting FROM tower_lease.rwlock_extend($1, $2, $3, $4, $5)";
const PERMIT_EXTEND: &str =
    "SELECT tower_lease.permit_extend($1, $2, $3, $4) AS held, false AS writer_waiting";
const IDEMPOTENCY_EXTEND: &str =
    "SELECT tower_lease.idempotency_extend($1, $2, $3, $4) AS held, false AS writer_waiting";
const LOCK_RELEASE: &str = "SELECT tower_lease.lock_release($1, $2, $3) AS released";
const RWLOCK_RELEASE: &str = "SELECT tower_lease.rwlock_release($1, $2, $3, $4, $5) AS released";
const PERMIT_RELEASE: &str = "SELECT tower_lease.permit_release($1, $2, $3) AS released";
/// A reservation's release; with `$4` true, its at-most-once marker's too.
pub(crate) const IDEMPOTENCY_RELEASE: &str =
    "SELECT tower_lease.idempotency_release($1, $2, $3, $4) AS released";
const WITHDRAW_INTENT: &str = "SELECT tower_lease.withdraw_intent($1, $2, $3) AS withdrawn";
const PERMITS_IN_USE: &str = "SELECT tower_lease.permits_in_use($1, $2) AS in_use";

/// A TTL in whole milliseconds, as the functions take it.
pub(crate) fn millis(ttl: Duration) -> i64 {
    ttl.as_millis().min(i64::MAX as u128) as i64
}

/// The letter of a mode in `extend_many` and in notifications.
pub(crate) fn letter(mode: Mode) -> &'static str {
    match mode {
        Mode::Exclusive => "e",
        Mode::Read => "r",
        Mode::Write => "w",
        Mode::Permit => "p",
        Mode::Reservation => "v",
        _ => "?",
    }
}

/// An acquire function's answer (`tower_lease.acquisition`); `fenced`: whether the caller
/// asked for a fence.
fn acquisition(row: &Row, fenced: bool) -> Result<Acquisition> {
    if !row.try_get::<_, bool>("acquired").map_err(backend)? {
        let retry_after: i64 = row.try_get("retry_after_us").map_err(backend)?;
        return Ok(Acquisition::Busy {
            retry_after: Duration::from_micros(retry_after.max(0) as u64),
        });
    }
    let fence: Option<i64> = row.try_get("fence").map_err(backend)?;
    Ok(Acquisition::Acquired {
        fence: fenced.then(|| fence.unwrap_or(0).max(0) as u64),
    })
}

/// An extend's answer.
pub(crate) fn extended(held: bool, writer_waiting: bool) -> Extended {
    match (held, writer_waiting) {
        (false, _) => Extended::Gone,
        (true, true) => Extended::HeldWriterWaiting,
        (true, false) => Extended::Held,
    }
}

fn unknown_mode(mode: Mode) -> Error {
    Error::UnexpectedReply(format!("no lease of mode {mode:?} in this store"))
}

impl PgStore {
    async fn acquire_now(&self, lease: LeaseRef<'_>) -> Result<Acquisition> {
        let LeaseRef {
            lock, mode, secret, ..
        } = lease;
        let (namespace, name, holder) = (lock.namespace, lock.name, &secret.as_bytes()[..]);
        let ttl = millis(lock.ttl);
        let row = match mode {
            Mode::Exclusive => {
                let params: [&(dyn ToSql + Sync); 5] =
                    [&namespace, &name, &holder, &ttl, &lock.fenced];
                let acts = Acts::Takes(secret, lock.ttl, LOCK_RELEASE);
                self.row(LOCK_ACQUIRE, &params, acts).await?
            }
            Mode::Read => {
                let acts = Acts::Takes(secret, lock.ttl, RWLOCK_RELEASE);
                let read_phase = lock.read_phase().map_or(0, millis);
                let params: [&(dyn ToSql + Sync); 7] = [
                    &namespace,
                    &name,
                    &holder,
                    &ttl,
                    &lock.fenced,
                    &read_phase,
                    &lease.waiting,
                ];
                self.row(READ_ACQUIRE, &params, acts).await?
            }
            Mode::Write => {
                let intent = lease.write_intent().map_or(0, millis);
                // A phase-fair writer in a bounded wait keeps its turn among the writers.
                let waiting_in_turn = lock.read_phase().is_some() && lease.waiting;
                let params: [&(dyn ToSql + Sync); 7] = [
                    &namespace,
                    &name,
                    &holder,
                    &ttl,
                    &lock.fenced,
                    &intent,
                    &waiting_in_turn,
                ];
                let acts = Acts::Takes(secret, lock.ttl, RWLOCK_RELEASE);
                self.row(WRITE_ACQUIRE, &params, acts).await?
            }
            Mode::Permit => {
                let most = lock.permits.min(i32::MAX as u32) as i32;
                let acts = Acts::Takes(secret, lock.ttl, PERMIT_RELEASE);
                self.row(
                    PERMIT_ACQUIRE,
                    &[&namespace, &name, &holder, &ttl, &most],
                    acts,
                )
                .await?
            }
            other => return Err(unknown_mode(other)),
        };
        self.sweeper
            .now_and_then(&self.pool, self.sessions, &self.statements, self.timeout);
        // A permit's fence is not in the contract: none, as the memory store answers.
        acquisition(&row, lock.fenced && mode != Mode::Permit)
    }

    async fn extend_now(&self, lease: LeaseRef<'_>) -> Result<Extended> {
        let LeaseRef {
            lock, mode, secret, ..
        } = lease;
        let (namespace, name, holder) = (lock.namespace, lock.name, &secret.as_bytes()[..]);
        let ttl = millis(lock.ttl);
        let acts = Acts::Plainly;
        let params: [&(dyn ToSql + Sync); 4] = [&namespace, &name, &holder, &ttl];
        let row = match mode {
            Mode::Exclusive => self.row(LOCK_EXTEND, &params, acts).await?,
            Mode::Read | Mode::Write => {
                let as_reader = mode == Mode::Read;
                self.row(
                    RWLOCK_EXTEND,
                    &[&namespace, &name, &holder, &ttl, &as_reader],
                    acts,
                )
                .await?
            }
            Mode::Permit => self.row(PERMIT_EXTEND, &params, acts).await?,
            Mode::Reservation => self.row(IDEMPOTENCY_EXTEND, &params, acts).await?,
            other => return Err(unknown_mode(other)),
        };
        let held = row.try_get("held").map_err(backend)?;
        Ok(extended(
            held,
            row.try_get("writer_waiting").map_err(backend)?,
        ))
    }

    async fn release_now(&self, lease: LeaseRef<'_>) -> Result<bool> {
        let LeaseRef {
            lock, mode, secret, ..
        } = lease;
        let (namespace, name, holder) = (lock.namespace, lock.name, &secret.as_bytes()[..]);
        let acts = Acts::GivesBack(secret);
        let row = match mode {
            Mode::Exclusive => {
                self.row(LOCK_RELEASE, &[&namespace, &name, &holder], acts)
                    .await?
            }
            Mode::Read | Mode::Write => {
                let as_reader = mode == Mode::Read;
                let read_phase = lock.read_phase().map_or(0, millis);
                self.row(
                    RWLOCK_RELEASE,
                    &[&namespace, &name, &holder, &as_reader, &read_phase],
                    acts,
                )
                .await?
            }
            Mode::Permit => {
                self.row(PERMIT_RELEASE, &[&namespace, &name, &holder], acts)
                    .await?
            }
            Mode::Reservation => {
                let forget_at_most_once = false;
                let params: [&(dyn ToSql + Sync); 4] =
                    [&namespace, &name, &holder, &forget_at_most_once];
                self.row(IDEMPOTENCY_RELEASE, &params, acts).await?
            }
            other => return Err(unknown_mode(other)),
        };
        row.try_get("released").map_err(backend)
    }
}

pub(crate) fn backend(e: tokio_postgres::Error) -> Error {
    Error::Backend(Box::new(e))
}

/// An error and its sources, in words: the server's message is the source of a driver's error.
pub(crate) fn error_words(e: &Error) -> String {
    let mut words = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        words.push_str(": ");
        words.push_str(&cause.to_string());
        source = cause.source();
    }
    words
}

impl Backend for PgStore {
    fn acquire<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Acquisition>> {
        Box::pin(self.acquire_now(lease))
    }

    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Extended>> {
        Box::pin(self.extend_now(lease))
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.release_now(lease))
    }

    fn withdraw_intent<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        Box::pin(async move {
            if lease.mode != Mode::Write {
                return Ok(false);
            }
            let LeaseRef { lock, secret, .. } = lease;
            let (namespace, name, holder) = (lock.namespace, lock.name, &secret.as_bytes()[..]);
            let row = self
                .row(
                    WITHDRAW_INTENT,
                    &[&namespace, &name, &holder],
                    Acts::GivesBack(secret),
                )
                .await?;
            row.try_get("withdrawn").map_err(backend)
        })
    }

    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, Result<u32>> {
        Box::pin(async move {
            let (namespace, name) = (lock.namespace, lock.name);
            let row = self
                .row(PERMITS_IN_USE, &[&namespace, &name], Acts::Plainly)
                .await?;
            let live: i32 = row.try_get("in_use").map_err(backend)?;
            Ok(live.max(0) as u32)
        })
    }

    fn extend_many<'a>(
        &'a self,
        leases: &'a [LeaseRef<'a>],
    ) -> BoxFuture<'a, Vec<Result<Extended>>> {
        Box::pin(async move {
            match self.extend_many_now(leases).await {
                Ok(answers) => answers,
                // One round trip failed for all: each lease hears why, as its own extend would.
                Err(e) => {
                    let e = error_words(&e);
                    leases
                        .iter()
                        .map(|_| Err(Error::Backend(e.clone().into())))
                        .collect()
                }
            }
        })
    }

    fn idempotency_begin<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        fingerprint: &'a [u8; FINGERPRINT_LEN],
    ) -> BoxFuture<'a, Result<Begin>> {
        Box::pin(self.begin_key(lease, fingerprint, None))
    }

    fn idempotency_begin_once<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        fingerprint: &'a [u8; FINGERPRINT_LEN],
        retention: Duration,
    ) -> BoxFuture<'a, Result<Begin>> {
        Box::pin(self.begin_key(lease, fingerprint, Some(retention)))
    }

    fn idempotency_complete<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        completion: Completion<'a>,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.complete_key(lease, completion))
    }

    fn idempotency_free<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.free_key(lease))
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn notify_to(&self, sink: NotificationSink) -> bool {
        self.listening
            .as_ref()
            .is_some_and(|listening| listening.start(sink))
    }

    /// A release notifies only a name a refused call marked (see `notify_waited` in
    /// schema.sql): a notifying commit takes a database-wide lock, which a release nobody
    /// waits for need not pay.
    fn announces_every_release(&self) -> bool {
        false
    }

    /// The listener hears every lock: watching one waits until it listens.
    fn watch<'a>(
        &'a self,
        mode: Mode,
        namespace: &'a str,
        name: &'a [u8],
    ) -> BoxFuture<'a, Result<()>> {
        let _ = (mode, namespace, name);
        Box::pin(async move {
            match &self.listening {
                Some(listening) => listening.listening().await,
                None => Err(Error::Backend("the store does not listen".into())),
            }
        })
    }

    fn check(&self) -> BoxFuture<'_, Result<Vec<tower_lease::backend::Warning>>> {
        Box::pin(async move {
            let found = PgStore::check(self).await?;
            let words = found.iter().map(|warning| warning.to_string());
            Ok(words.map(tower_lease::backend::Warning::Backend).collect())
        })
    }
}
