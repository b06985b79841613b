//! [`Config`]: what an [`IdempotencyLayer`](super::IdempotencyLayer) does, shared by every
//! service and request it makes.

use std::sync::Arc;
use std::time::Duration;

use http::Response;

use super::Idempotency;
use super::body::IdempotentBody;
use super::key::fingerprint::Fingerprint;
use super::record::background::Background;
use super::record::cache::Replays;
use crate::Store;
use crate::coarse_timer::CoarseTimer;
use crate::rejection::{Problem, Reason, Renderer};
use crate::store::heartbeat::HeartbeatTiming;

/// The most request body bytes read for the fingerprint by default.
pub(super) const DEFAULT_MAX_BODY: usize = 1024 * 1024;

/// The largest response stored for replay by default.
pub(super) const DEFAULT_MAX_RESPONSE: usize = 1024 * 1024;

/// How long the request body may take to arrive by default.
pub(super) const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a response may wait for its record to be stored by default.
pub(super) const DEFAULT_COMPLETE_WITHIN: Duration = Duration::from_secs(10);

/// What a layer does, shared by every service and request it makes.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) store: Store,
    pub(crate) idempotency: Idempotency,
    pub(crate) require_key: bool,
    /// How a request body counts in its fingerprint.
    pub(crate) fingerprint: Fingerprint,
    /// How long a retry waits for the first request to finish (zero: answer `409` at once).
    pub(crate) max_wait: Duration,
    pub(crate) max_body: usize,
    pub(crate) body_timeout: Duration,
    pub(crate) max_response: usize,
    /// How long the first request's response waits for its record to be stored.
    pub(crate) complete_within: Duration,
    /// The completions still tried after their request was answered.
    pub(crate) background: Background,
    pub(crate) renderer: Renderer,
    pub(crate) timing: HeartbeatTiming,
    /// The coarse timer of a reservation's first beat.
    pub(crate) first_beat_timer: Arc<CoarseTimer>,
    /// Completed records seen lately, replayed without a store round trip.
    pub(crate) replays: Arc<Replays>,
}

impl Config {
    /// The layer's answer to `problem`, rendered by its hook if it has one.
    pub(crate) fn refuse<B>(&self, reason: Reason) -> Response<IdempotentBody<B>> {
        let problem = Problem::from(reason);
        // No taken lock here: every reason's status is the refusal table's.
        let status = problem.status(None);
        let namespace = self.idempotency.definition.namespace;
        let response = self.renderer.respond_boxed(problem, status, namespace);
        response.map(IdempotentBody::rendered)
    }
}
