//! What an `RwLock` name keeps: its writer, readers, write intent, waiting readers and read
//! phase ([`RwEntry`]).

use std::time::Duration;

use tokio::time::Instant;
use tower_lease::backend::{LeaseRef, Secret};

use super::{Phase, RwEntry};

impl RwEntry {
    pub(super) fn forget_expired(&mut self, now: Instant) {
        self.readers.retain(|_, ends| *ends > now);
        if self.writer.as_ref().is_some_and(|w| !w.live(now)) {
            self.writer = None;
        }
        if self
            .intent
            .as_ref()
            .is_some_and(|intent| intent.until <= now)
        {
            self.intent = None;
        }
        self.waiting.retain(|_, until| *until > now);
        if self
            .phase
            .as_ref()
            .is_some_and(|phase| phase.until <= now || phase.readers.is_empty())
        {
            self.phase = None;
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.writer.is_none()
            && self.readers.is_empty()
            && self.intent.is_none()
            && self.waiting.is_empty()
            && self.phase.is_none()
    }

    /// A phase-fair reader with `secret` that waits was refused, told `retry_after`: it is
    /// noted as waiting until that much, and two read phases, from now.
    pub(super) fn note_waiting(
        &mut self,
        lease: LeaseRef<'_>,
        now: Instant,
        retry_after: Duration,
    ) {
        if let Some(phase) = lease.lock.read_phase().filter(|_| lease.waiting) {
            let until = now + retry_after + 2 * phase;
            self.waiting.insert(lease.secret.clone(), until);
        }
    }

    /// A phase-fair write ended by its release: the readers waiting now are let in before the
    /// next writer, for at most `phase`.
    pub(super) fn begin_read_phase(&mut self, phase: Option<Duration>, now: Instant) {
        let Some(phase) = phase else { return };
        if self.waiting.is_empty() {
            return;
        }
        let readers = self.waiting.drain().map(|(secret, _)| secret).collect();
        self.phase = Some(Phase {
            until: now + phase,
            readers,
        });
    }

    /// Whether `secret` is a reader of the live read phase.
    pub(super) fn in_phase(&self, secret: &Secret) -> bool {
        self.phase
            .as_ref()
            .is_some_and(|phase| phase.readers.contains(secret))
    }

    /// A reader with `secret` entered: it waits no more, and has left its phase.
    pub(super) fn entered(&mut self, secret: &Secret) {
        self.waiting.remove(secret);
        if let Some(phase) = &mut self.phase {
            phase.readers.remove(secret);
            if phase.readers.is_empty() {
                self.phase = None;
            }
        }
    }
}
