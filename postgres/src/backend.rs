//! [`Backend`] for [`PgStore`]: which function of the schema each call runs (the `.sql` files
//! in `sql/`), and how its answer reads.

use std::time::Duration;

use tokio_postgres::types::ToSql;
use tower_lease::backend::{
    Acquisition, Backend, Begin, BoxFuture, Completion, Extended, FINGERPRINT_LEN, LeaseRef,
    LockRef, Mode, NotificationSink,
};
use tower_lease::{Error, Result};

use crate::PgStore;
use crate::call::Acts;

const LOCK_ACQUIRE: &str = "SELECT tower_lease.lock_acquire($1, $2, $3, $4, $5)";
const READ_ACQUIRE: &str = "SELECT tower_lease.read_acquire($1, $2, $3, $4, $5, $6, $7)";
const WRITE_ACQUIRE: &str = "SELECT tower_lease.write_acquire($1, $2, $3, $4, $5, $6, $7)";
const PERMIT_ACQUIRE: &str = "SELECT tower_lease.permit_acquire($1, $2, $3, $4, $5)";
const LOCK_EXTEND: &str = "SELECT tower_lease.lock_extend($1, $2, $3, $4)::integer";
const RW_EXTEND: &str = "SELECT tower_lease.rw_extend($1, $2, $3, $4, $5)";
const PERMIT_EXTEND: &str = "SELECT tower_lease.permit_extend($1, $2, $3, $4)::integer";
const LOCK_RELEASE: &str = "SELECT tower_lease.lock_release($1, $2, $3)";
const RW_RELEASE: &str = "SELECT tower_lease.rw_release($1, $2, $3, $4, $5)";
const PERMIT_RELEASE: &str = "SELECT tower_lease.permit_release($1, $2, $3)";
const WITHDRAW_INTENT: &str = "SELECT tower_lease.withdraw_intent($1, $2, $3)";
const IN_USE: &str = "SELECT tower_lease.permits_in_use($1, $2)";
pub(crate) const IDEM_UPDATE: &str = "SELECT tower_lease.idem_update($1, $2, $3, $4, $5, $6)";
const EXTEND_MANY: &str = "SELECT tower_lease.extend_many($1, $2, $3, $4, $5)";

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

/// An acquire function's answer: a fence (0 or more), or -1 - the µs the blocker has left.
fn acquisition(answer: i64, fence: bool) -> Acquisition {
    match answer {
        fence_or_zero @ 0.. => Acquisition::Acquired {
            fence: fence.then_some(fence_or_zero as u64),
        },
        refused => Acquisition::Busy {
            retry_after: Duration::from_micros((-1 - refused) as u64),
        },
    }
}

/// An extend function's answer.
fn extended(answer: i32) -> Extended {
    match answer {
        0 => Extended::Gone,
        2 => Extended::HeldWriterWaiting,
        _ => Extended::Held,
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
        let (ns, nm, s) = (lock.namespace, lock.name, &secret.as_bytes()[..]);
        let ttl = millis(lock.ttl);
        let row = match mode {
            Mode::Exclusive => {
                let params: [&(dyn ToSql + Sync); 5] = [&ns, &nm, &s, &ttl, &lock.fenced];
                let acts = Acts::Takes(secret, lock.ttl, LOCK_RELEASE);
                self.row(LOCK_ACQUIRE, &params, acts).await?
            }
            Mode::Read => {
                let acts = Acts::Takes(secret, lock.ttl, RW_RELEASE);
                let phase = lock.read_phase().map_or(0, millis);
                let params: [&(dyn ToSql + Sync); 7] =
                    [&ns, &nm, &s, &ttl, &lock.fenced, &phase, &lease.waiting];
                self.row(READ_ACQUIRE, &params, acts).await?
            }
            Mode::Write => {
                let intent = lock.write_intent().map_or(0, millis);
                let phase: i32 = match (lock.read_phase(), lease.waiting) {
                    (None, _) => 0,
                    (Some(_), false) => 1,
                    (Some(_), true) => 2,
                };
                let params: [&(dyn ToSql + Sync); 7] =
                    [&ns, &nm, &s, &ttl, &lock.fenced, &intent, &phase];
                let acts = Acts::Takes(secret, lock.ttl, RW_RELEASE);
                self.row(WRITE_ACQUIRE, &params, acts).await?
            }
            Mode::Permit => {
                let most = lock.permits.min(i32::MAX as u32) as i32;
                let acts = Acts::Takes(secret, lock.ttl, PERMIT_RELEASE);
                self.row(PERMIT_ACQUIRE, &[&ns, &nm, &s, &ttl, &most], acts)
                    .await?
            }
            other => return Err(unknown_mode(other)),
        };
        self.sweeper.now_and_then(&self.pool, self.timeout);
        // A permit's fence is not in the contract: none, as the memory store answers.
        let fenced = lock.fenced && mode != Mode::Permit;
        Ok(acquisition(row.try_get(0).map_err(backend)?, fenced))
    }

    async fn extend_now(&self, lease: LeaseRef<'_>) -> Result<Extended> {
        let LeaseRef {
            lock, mode, secret, ..
        } = lease;
        let (ns, nm, s) = (lock.namespace, lock.name, &secret.as_bytes()[..]);
        let ttl = millis(lock.ttl);
        let acts = Acts::Plainly;
        let row = match mode {
            Mode::Exclusive => self.row(LOCK_EXTEND, &[&ns, &nm, &s, &ttl], acts).await?,
            Mode::Read | Mode::Write => {
                let reader = mode == Mode::Read;
                self.row(RW_EXTEND, &[&ns, &nm, &s, &ttl, &reader], acts)
                    .await?
            }
            Mode::Permit => self.row(PERMIT_EXTEND, &[&ns, &nm, &s, &ttl], acts).await?,
            Mode::Reservation => {
                let params: [&(dyn ToSql + Sync); 6] = [&ns, &nm, &s, &ttl, &true, &false];
                let row = self.row(IDEM_UPDATE, &params, acts).await?;
                let held: bool = row.try_get(0).map_err(backend)?;
                return Ok(if held { Extended::Held } else { Extended::Gone });
            }
            other => return Err(unknown_mode(other)),
        };
        Ok(extended(row.try_get(0).map_err(backend)?))
    }

    async fn release_now(&self, lease: LeaseRef<'_>) -> Result<bool> {
        let LeaseRef {
            lock, mode, secret, ..
        } = lease;
        let (ns, nm, s) = (lock.namespace, lock.name, &secret.as_bytes()[..]);
        let acts = Acts::GivesBack(secret);
        let row = match mode {
            Mode::Exclusive => self.row(LOCK_RELEASE, &[&ns, &nm, &s], acts).await?,
            Mode::Read | Mode::Write => {
                let reader = mode == Mode::Read;
                let phase = lock.read_phase().map_or(0, millis);
                self.row(RW_RELEASE, &[&ns, &nm, &s, &reader, &phase], acts)
                    .await?
            }
            Mode::Permit => self.row(PERMIT_RELEASE, &[&ns, &nm, &s], acts).await?,
            Mode::Reservation => {
                let ttl = millis(lock.ttl);
                let params: [&(dyn ToSql + Sync); 6] = [&ns, &nm, &s, &ttl, &false, &false];
                self.row(IDEM_UPDATE, &params, acts).await?
            }
            other => return Err(unknown_mode(other)),
        };
        row.try_get(0).map_err(backend)
    }

    async fn extend_many_now(&self, leases: &[LeaseRef<'_>]) -> Result<Vec<Extended>> {
        let kinds: Vec<&str> = leases.iter().map(|l| letter(l.mode)).collect();
        let nss: Vec<&str> = leases.iter().map(|l| l.lock.namespace).collect();
        let nms: Vec<&[u8]> = leases.iter().map(|l| l.lock.name).collect();
        let ss: Vec<&[u8]> = leases.iter().map(|l| &l.secret.as_bytes()[..]).collect();
        let ttls: Vec<i64> = leases.iter().map(|l| millis(l.lock.ttl)).collect();
        let row = self
            .row(
                EXTEND_MANY,
                &[&kinds, &nss, &nms, &ss, &ttls],
                Acts::Plainly,
            )
            .await?;
        let answers: Vec<i32> = row.try_get(0).map_err(backend)?;
        if answers.len() != leases.len() {
            return Err(Error::UnexpectedReply(format!(
                "extend_many answered {} of {} leases",
                answers.len(),
                leases.len()
            )));
        }
        Ok(answers.into_iter().map(extended).collect())
    }
}

pub(crate) fn backend(e: tokio_postgres::Error) -> Error {
    Error::Backend(Box::new(e))
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
            let (ns, nm, s) = (lock.namespace, lock.name, &secret.as_bytes()[..]);
            let row = self
                .row(WITHDRAW_INTENT, &[&ns, &nm, &s], Acts::GivesBack(secret))
                .await?;
            row.try_get(0).map_err(backend)
        })
    }

    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, Result<u32>> {
        Box::pin(async move {
            let (ns, nm) = (lock.namespace, lock.name);
            let row = self.row(IN_USE, &[&ns, &nm], Acts::Plainly).await?;
            let live: i32 = row.try_get(0).map_err(backend)?;
            Ok(live.max(0) as u32)
        })
    }

    fn extend_many<'a>(
        &'a self,
        leases: &'a [LeaseRef<'a>],
    ) -> BoxFuture<'a, Vec<Result<Extended>>> {
        Box::pin(async move {
            match self.extend_many_now(leases).await {
                Ok(answers) => answers.into_iter().map(Ok).collect(),
                // One round trip failed for all: each lease hears why, as its own extend would.
                Err(e) => {
                    let e = e.to_string();
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
        Box::pin(self.idem_begin(lease, fingerprint, None))
    }

    fn idempotency_begin_once<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        fingerprint: &'a [u8; FINGERPRINT_LEN],
        retention: Duration,
    ) -> BoxFuture<'a, Result<Begin>> {
        Box::pin(self.idem_begin(lease, fingerprint, Some(retention)))
    }

    fn idempotency_complete<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        completion: Completion<'a>,
    ) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.idem_complete(lease, completion))
    }

    fn idempotency_free<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        Box::pin(self.idem_free(lease))
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn notify_to(&self, sink: NotificationSink) -> bool {
        self.listening
            .as_ref()
            .is_some_and(|listening| listening.start(sink))
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
