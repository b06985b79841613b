//! The heartbeat's batch (`sql/many.sql`): a batch of extends in chunks, each one statement
//! and transaction, sent together on one connection; the answers in the leases' order.

use tokio_postgres::Row;
use tokio_postgres::types::ToSql;
use tower_lease::backend::{Extended, LeaseRef};
use tower_lease::{Error, Result};

use crate::PgStore;
use crate::backend::{backend, error_words, extended, letter, millis};
use crate::call::Acts;

const EXTEND_MANY: &str =
    "SELECT held, writer_waiting FROM tower_lease.extend_many($1, $2, $3, $4, $5)";

impl PgStore {
    /// The batch in chunks of at most [`MOST_NAMES_A_TRANSACTION`] leases, each one
    /// `extend_many` statement and transaction, all sent together on one connection: the
    /// server runs them one after the other, in one round trip. Each transaction holds the
    /// advisory lock of each of its names to its commit, so a batch of 512 in one would take
    /// 512 entries of the server's shared lock table (`max_locks_per_transaction`, 64 by
    /// default, times the connections); several replicas' heartbeats at once would exhaust it,
    /// and every session's next lock would fail with "out of shared memory".
    pub(crate) async fn extend_many_now(
        &self,
        leases: &[LeaseRef<'_>],
    ) -> Result<Vec<Result<Extended>>> {
        let chunks: Vec<Chunk<'_>> = leases
            .chunks(MOST_NAMES_A_TRANSACTION)
            .map(Chunk::new)
            .collect();
        let params: Vec<[&(dyn ToSql + Sync); 5]> = chunks.iter().map(Chunk::params).collect();
        let params: Vec<&[&(dyn ToSql + Sync)]> = params.iter().map(|p| &p[..]).collect();
        let rows = self.rows(EXTEND_MANY, &params, Acts::Plainly).await?;
        let mut answers = Vec::with_capacity(leases.len());
        for (chunk, row) in leases.chunks(MOST_NAMES_A_TRANSACTION).zip(rows) {
            match row
                .map_err(|e| self.call_error(e))
                .and_then(|row| chunk_answers(&row, chunk.len()))
            {
                Ok(extended) => answers.extend(extended.into_iter().map(Ok)),
                // The server ended it at its bound.
                Err(Error::Timeout(timeout)) => {
                    answers.extend(chunk.iter().map(|_| Err(Error::Timeout(timeout))));
                }
                // The chunk failed as a whole: each of its leases hears why.
                Err(e) => {
                    let words = error_words(&e);
                    answers.extend(
                        chunk
                            .iter()
                            .map(|_| Err(Error::Backend(words.clone().into()))),
                    );
                }
            }
        }
        Ok(answers)
    }
}

/// The most leases one `extend_many` transaction extends, so holds advisory locks of.
const MOST_NAMES_A_TRANSACTION: usize = 32;

/// One chunk of a batch, as `extend_many` takes it.
struct Chunk<'a> {
    modes: Vec<&'static str>,
    namespaces: Vec<&'a str>,
    names: Vec<&'a [u8]>,
    secrets: Vec<&'a [u8]>,
    ttls: Vec<i64>,
}

impl<'a> Chunk<'a> {
    fn new(leases: &[LeaseRef<'a>]) -> Self {
        Chunk {
            modes: leases.iter().map(|l| letter(l.mode)).collect(),
            namespaces: leases.iter().map(|l| l.lock.namespace).collect(),
            names: leases.iter().map(|l| l.lock.name).collect(),
            secrets: leases.iter().map(|l| &l.secret.as_bytes()[..]).collect(),
            ttls: leases.iter().map(|l| millis(l.lock.ttl)).collect(),
        }
    }

    fn params(&self) -> [&(dyn ToSql + Sync); 5] {
        [
            &self.modes,
            &self.namespaces,
            &self.names,
            &self.secrets,
            &self.ttls,
        ]
    }
}

/// A chunk's answers, one per lease, in order.
fn chunk_answers(row: &Row, leases: usize) -> Result<Vec<Extended>> {
    let held: Vec<bool> = row.try_get("held").map_err(backend)?;
    let writer_waiting: Vec<bool> = row.try_get("writer_waiting").map_err(backend)?;
    if held.len() != leases || writer_waiting.len() != leases {
        return Err(Error::UnexpectedReply(format!(
            "extend_many answered {} of {leases} leases",
            held.len(),
        )));
    }
    Ok(held
        .into_iter()
        .zip(writer_waiting)
        .map(|(h, w)| extended(h, w))
        .collect())
}
