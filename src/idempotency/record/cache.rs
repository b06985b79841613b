//! [`Replays`]: the completed records a layer has seen lately, kept in the process so that a
//! retry on this replica is answered without a store round trip.
//!
//! A completed record never changes while it lives (no request can reserve its key, and only
//! the reservation's holder writes it), so a copy is exact until the record expires; each copy
//! expires no later than the store's (counted from before the command that stored or read it).
//! A record the store lost (a restart without persistence) is still replayed from here, which
//! is what its retries want. The cache is bounded in entries and bytes.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::backend::FINGERPRINT_LEN;

const MAX_ENTRIES: usize = 4096;
const MAX_BYTES: usize = 16 * 1024 * 1024;

/// What a key's cached record answers a request.
pub(crate) enum Cached {
    /// The stored response, for a request with the record's fingerprint.
    Replay(Bytes),
    /// The key belongs to a request with another fingerprint.
    Mismatch,
}

#[derive(Debug, Default)]
pub(crate) struct Replays {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    records: HashMap<Box<[u8]>, Entry>,
    bytes: usize,
}

#[derive(Debug)]
struct Entry {
    fingerprint: [u8; FINGERPRINT_LEN],
    record: Bytes,
    until: Instant,
}

impl Replays {
    /// The cached answer for `name` and `fingerprint`, if a live record of `name` is here.
    pub(crate) fn get(&self, name: &[u8], fingerprint: &[u8; FINGERPRINT_LEN]) -> Option<Cached> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let entry = state.records.get(name)?;
        if entry.until <= Instant::now() {
            return None;
        }
        Some(match entry.fingerprint == *fingerprint {
            true => Cached::Replay(entry.record.clone()),
            false => Cached::Mismatch,
        })
    }

    /// Keeps `record` of `name` until `since + left`, where `since` is before the store
    /// command that stored or read the record, and `left` its life then.
    pub(crate) fn put(
        &self,
        name: &[u8],
        fingerprint: [u8; FINGERPRINT_LEN],
        record: Bytes,
        since: Instant,
        left: Duration,
    ) {
        let len = name.len() + record.len();
        if len > MAX_BYTES / 16 {
            return;
        }
        let until = since + left;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.records.len() >= MAX_ENTRIES || state.bytes + len > MAX_BYTES {
            let now = Instant::now();
            state.records.retain(|_, entry| entry.until > now);
            state.bytes = state
                .records
                .iter()
                .map(|(n, e)| n.len() + e.record.len())
                .sum();
            if state.records.len() >= MAX_ENTRIES || state.bytes + len > MAX_BYTES {
                // Full of live records: start over rather than track recency on every hit.
                state.records.clear();
                state.bytes = 0;
            }
        }
        let entry = Entry {
            fingerprint,
            record,
            until,
        };
        if let Some(old) = state.records.insert(name.into(), entry) {
            state.bytes -= name.len() + old.record.len();
        }
        state.bytes += len;
    }
}
