//! The idempotency calls of [`PgStore`] (`sql/idempotency.sql`): one row per key, holding the
//! reservation while the first request runs and the record once it completed.

use std::time::Duration;

use bytes::Bytes;
use tokio_postgres::types::ToSql;
use tower_lease::backend::{Begin, Completion, FINGERPRINT_LEN, LeaseRef};
use tower_lease::{Error, Result};

use crate::PgStore;
use crate::backend::{IDEM_UPDATE, backend, millis};
use crate::call::Acts;

const IDEM_BEGIN: &str = "SELECT kind, fence, left_us, response \
     FROM tower_lease.idem_begin($1, $2, $3, $4, $5, $6, $7)";
const IDEM_COMPLETE: &str = "SELECT tower_lease.idem_complete($1, $2, $3, $4, $5, $6)";

impl PgStore {
    /// The first look at a key; `once` is an at-most-once key's retention.
    pub(crate) async fn idem_begin(
        &self,
        lease: LeaseRef<'_>,
        fingerprint: &[u8; FINGERPRINT_LEN],
        once: Option<Duration>,
    ) -> Result<Begin> {
        let LeaseRef { lock, secret, .. } = lease;
        let (ns, nm, s) = (lock.namespace, lock.name, &secret.as_bytes()[..]);
        let ttl = millis(lock.ttl);
        let fp = &fingerprint[..];
        // At least 1 ms, as Redis counts a retention.
        let once = once.map(|retention| millis(retention).max(1));
        let params: [&(dyn ToSql + Sync); 7] = [&ns, &nm, &s, &ttl, &lock.fenced, &fp, &once];
        let row = self
            .row(
                IDEM_BEGIN,
                &params,
                Acts::Takes(secret, lock.ttl, IDEM_UPDATE),
            )
            .await?;
        self.sweeper.now_and_then(&self.pool, self.timeout);
        let kind: i32 = row.try_get(0).map_err(backend)?;
        let left = || -> Result<Duration> {
            let left: Option<i64> = row.try_get(2).map_err(backend)?;
            Ok(Duration::from_micros(left.unwrap_or(0).max(0) as u64))
        };
        Ok(match kind {
            0 => {
                let fence: Option<i64> = row.try_get(1).map_err(backend)?;
                Begin::Reserved {
                    fence: lock.fenced.then(|| fence.unwrap_or(0).max(0) as u64),
                }
            }
            1 => Begin::InFlight {
                retry_after: left()?,
            },
            2 => {
                let response: Vec<u8> = row.try_get(3).map_err(backend)?;
                Begin::Completed {
                    response: Bytes::from(response),
                    expires_in: left()?,
                }
            }
            3 => Begin::Mismatch,
            4 => Begin::OutcomeUnknown {
                expires_in: left()?,
            },
            other => {
                return Err(Error::UnexpectedReply(format!(
                    "idem_begin answered kind {other}"
                )));
            }
        })
    }

    pub(crate) async fn idem_complete(
        &self,
        lease: LeaseRef<'_>,
        completion: Completion<'_>,
    ) -> Result<bool> {
        let LeaseRef { lock, secret, .. } = lease;
        let (ns, nm, s) = (lock.namespace, lock.name, &secret.as_bytes()[..]);
        let fp = &completion.fingerprint[..];
        let retention = millis(completion.retention).max(1);
        let params: [&(dyn ToSql + Sync); 6] =
            [&ns, &nm, &s, &fp, &completion.response, &retention];
        let row = self.row(IDEM_COMPLETE, &params, Acts::Plainly).await?;
        row.try_get(0).map_err(backend)
    }

    /// Frees the reservation with its at-most-once marker.
    pub(crate) async fn idem_free(&self, lease: LeaseRef<'_>) -> Result<bool> {
        let LeaseRef { lock, secret, .. } = lease;
        let (ns, nm, s) = (lock.namespace, lock.name, &secret.as_bytes()[..]);
        let ttl = millis(lock.ttl);
        let params: [&(dyn ToSql + Sync); 6] = [&ns, &nm, &s, &ttl, &false, &true];
        let row = self
            .row(IDEM_UPDATE, &params, Acts::GivesBack(secret))
            .await?;
        row.try_get(0).map_err(backend)
    }
}
