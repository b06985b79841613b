//! The idempotency calls of [`PgStore`] (`sql/idempotency.sql`): one row per key, holding the
//! reservation while the first request runs and the record once it completed.

use std::time::Duration;

use bytes::Bytes;
use tokio_postgres::types::ToSql;
use tower_lease::backend::{Begin, Completion, FINGERPRINT_LEN, LeaseRef};
use tower_lease::{Error, Result};

use crate::PgStore;
use crate::backend::{IDEMPOTENCY_RELEASE, backend, millis};
use crate::call::Acts;

const IDEMPOTENCY_BEGIN: &str = "SELECT outcome, fence, remaining_us, response \
     FROM tower_lease.idempotency_begin($1, $2, $3, $4, $5, $6, $7)";
const IDEMPOTENCY_COMPLETE: &str =
    "SELECT tower_lease.idempotency_complete($1, $2, $3, $4, $5, $6) AS completed";

impl PgStore {
    /// The first look at a key; `once` is an at-most-once key's retention.
    pub(crate) async fn begin_key(
        &self,
        lease: LeaseRef<'_>,
        fingerprint: &[u8; FINGERPRINT_LEN],
        once: Option<Duration>,
    ) -> Result<Begin> {
        let LeaseRef { lock, secret, .. } = lease;
        let (namespace, name, holder) = (lock.namespace, lock.name, &secret.as_bytes()[..]);
        let ttl = millis(lock.ttl);
        let fingerprint = &fingerprint[..];
        // At least 1 ms, as Redis counts a retention.
        let once = once.map(|retention| millis(retention).max(1));
        let params: [&(dyn ToSql + Sync); 7] = [
            &namespace,
            &name,
            &holder,
            &ttl,
            &lock.fenced,
            &fingerprint,
            &once,
        ];
        let acts = Acts::Takes(secret, lock.ttl, IDEMPOTENCY_RELEASE);
        let row = self.row(IDEMPOTENCY_BEGIN, &params, acts).await?;
        self.sweeper
            .now_and_then(&self.pool, self.sessions, &self.statements, self.timeout);
        let outcome: &str = row.try_get("outcome").map_err(backend)?;
        let remaining = || -> Result<Duration> {
            let remaining: Option<i64> = row.try_get("remaining_us").map_err(backend)?;
            Ok(Duration::from_micros(remaining.unwrap_or(0).max(0) as u64))
        };
        Ok(match outcome {
            "reserved" => {
                let fence: Option<i64> = row.try_get("fence").map_err(backend)?;
                Begin::Reserved {
                    fence: lock.fenced.then(|| fence.unwrap_or(0).max(0) as u64),
                }
            }
            "in_flight" => Begin::InFlight {
                retry_after: remaining()?,
            },
            "completed" => {
                let response: Vec<u8> = row.try_get("response").map_err(backend)?;
                Begin::Completed {
                    response: Bytes::from(response),
                    expires_in: remaining()?,
                }
            }
            "mismatch" => Begin::Mismatch,
            "outcome_unknown" => Begin::OutcomeUnknown {
                expires_in: remaining()?,
            },
            other => {
                return Err(Error::UnexpectedReply(format!(
                    "idempotency_begin answered the outcome {other:?}"
                )));
            }
        })
    }

    pub(crate) async fn complete_key(
        &self,
        lease: LeaseRef<'_>,
        completion: Completion<'_>,
    ) -> Result<bool> {
        let LeaseRef { lock, secret, .. } = lease;
        let (namespace, name, holder) = (lock.namespace, lock.name, &secret.as_bytes()[..]);
        let fingerprint = &completion.fingerprint[..];
        let retention = millis(completion.retention).max(1);
        let params: [&(dyn ToSql + Sync); 6] = [
            &namespace,
            &name,
            &holder,
            &fingerprint,
            &completion.response,
            &retention,
        ];
        let row = self
            .row(IDEMPOTENCY_COMPLETE, &params, Acts::Plainly)
            .await?;
        row.try_get("completed").map_err(backend)
    }

    /// Frees the reservation with its at-most-once marker.
    pub(crate) async fn free_key(&self, lease: LeaseRef<'_>) -> Result<bool> {
        let LeaseRef { lock, secret, .. } = lease;
        let (namespace, name, holder) = (lock.namespace, lock.name, &secret.as_bytes()[..]);
        let forget_at_most_once = true;
        let params: [&(dyn ToSql + Sync); 4] = [&namespace, &name, &holder, &forget_at_most_once];
        let row = self
            .row(IDEMPOTENCY_RELEASE, &params, Acts::GivesBack(secret))
            .await?;
        row.try_get("released").map_err(backend)
    }
}
