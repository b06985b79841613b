//! [`Config`]: what a layer does, shared by every service and future it makes.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use http::{Response, StatusCode};

use crate::Store;
use crate::definition::Definition;
use crate::layer::body::LeaseBody;
use crate::layer::hold::hold_times::HoldTimes;
use crate::layer::hold::lease_lost::LeaseLost;
use crate::layer::options::timing::{Beat, Limit};
use crate::layer::shared_read::{Linger, SharedReads};
use crate::rejection::{Problem, Rejection, Renderer};
use crate::store::heartbeat::Heartbeat;
use crate::telemetry::AcquireOutcome;

/// How long a response waits for its release by default: a healthy store answers in a round
/// trip, far sooner; a failing one must not hold a finished response for its whole timeout.
const DEFAULT_RELEASE_WAIT: Duration = Duration::from_millis(250);

/// How long an `RwLockLayer`'s requests wait for their lease by default. Without a wait, a read
/// meeting a waiting writer (and a writer meeting reads) is refused, and comes back only after
/// a `Retry-After` of whole seconds; with one, each waits its turn, which phase-fair bounds to
/// one write (a read) or the reads in flight and one read phase (a write), far below this on a
/// lock whose holds are short. Long enough for a few such turns on a loaded host; short enough
/// that a request behind a stuck holder is answered while its client still waits.
pub(crate) const DEFAULT_READ_WRITE_WAIT: Duration = Duration::from_secs(2);

/// How many requests of a layer may wait for a lock at once by default.
const DEFAULT_MAX_WAITERS: usize = 1024;

/// How long a request body may take to arrive by default, under the lock or (for a
/// buffered layer) before it.
const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// What the layer does, shared by every service and future it makes.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) store: Store,
    pub(crate) definition: Definition,
    /// The status for a taken lock (busy, or for a semaphore full), when the user chose one; the
    /// [reasons' table](crate::rejection::Reason)'s otherwise.
    pub(crate) taken_status: Option<StatusCode>,
    /// How long this layer's leases were held lately, for the `Retry-After` of a busy answer.
    pub(crate) hold_times: Arc<HoldTimes>,
    pub(crate) fail_open: bool,
    /// How the layer's leases are extended, and the timer of their first beat.
    pub(crate) beat: Beat,
    /// The heartbeat of this layer's leases: the store's, shared with every other layer and
    /// [`Held`](crate::Held) on it.
    pub(crate) heartbeat: Heartbeat,
    pub(crate) on_lease_lost: LeaseLost,
    pub(crate) hold_through_body: bool,
    pub(crate) binary_names: bool,
    pub(crate) require_name: bool,
    /// How long a request waits for a busy lock (zero: answer at once).
    pub(crate) max_wait: Duration,
    /// The most requests of this layer waiting at once.
    pub(crate) max_waiters: usize,
    /// Requests of this layer waiting now.
    pub(crate) waiting: Arc<AtomicUsize>,
    /// The most request body bytes buffered layers read before locking.
    pub(crate) body_limit: usize,
    /// How long the request body may take to arrive: before the lock for buffered layers,
    /// under it otherwise (see [`TimeoutBody`]).
    ///
    /// [`TimeoutBody`]: crate::layer::request_body::timeout_body::TimeoutBody
    pub(crate) body_timeout: Limit,
    /// Renders the layer's refusals.
    pub(crate) renderer: Renderer,
    /// How long the response waits for the release before it goes out anyway (see
    /// [`Overdue`]).
    ///
    /// [`Overdue`]: crate::coarse_timer::Overdue
    pub(crate) max_release_wait: Limit,
    /// The layer's shared read leases, when it coalesces reads (an `RwLockLayer` by default).
    /// Set through [`share_reads`](Self::share_reads), and read as a [`ReadSharing`].
    pub(crate) shared_reads: Option<Arc<SharedReads>>,
}

/// How an `RwLockLayer`'s reads take their leases: one setting, so that the options that
/// change it (`coalesce_reads`, `linger_reads`) change one thing and cannot undo each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReadSharing {
    /// Each read has a reader lease of its own.
    Separate,
    /// Overlapping reads of a name share one reader lease, which outlives its last read as
    /// `linger` says.
    Coalesced { linger: Linger },
}

impl Config {
    pub(crate) fn new(store: Store, definition: Definition) -> Self {
        let heartbeat = store.heartbeat().clone();
        Self {
            store,
            definition,
            taken_status: None,
            hold_times: Arc::default(),
            fail_open: false,
            beat: Beat::for_ttl(definition.ttl),
            heartbeat,
            on_lease_lost: LeaseLost::Abort,
            hold_through_body: false,
            binary_names: false,
            require_name: false,
            max_wait: Duration::ZERO,
            max_waiters: DEFAULT_MAX_WAITERS,
            waiting: Arc::default(),
            body_limit: 0,
            body_timeout: Limit::new(DEFAULT_BODY_TIMEOUT),
            renderer: Renderer::default(),
            max_release_wait: Limit::new(DEFAULT_RELEASE_WAIT),
            shared_reads: None,
        }
    }
}

impl Config {
    /// What a store failure of an acquisition counts as in the metrics: the request runs
    /// unlocked under `fail_open`, and is refused otherwise.
    pub(crate) fn on_store_error(&self) -> AcquireOutcome {
        match self.fail_open {
            true => AcquireOutcome::Unlocked,
            false => AcquireOutcome::StoreError,
        }
    }

    /// How the layer's reads take their leases now.
    pub(crate) fn read_sharing(&self) -> ReadSharing {
        match &self.shared_reads {
            None => ReadSharing::Separate,
            Some(reads) => ReadSharing::Coalesced {
                linger: reads.linger(),
            },
        }
    }

    /// Makes the layer's reads take their leases as `sharing` says, with a fresh registry of
    /// shares.
    pub(crate) fn share_reads(&mut self, sharing: ReadSharing) {
        self.shared_reads = match sharing {
            ReadSharing::Separate => None,
            ReadSharing::Coalesced { linger } => Some(Arc::new(SharedReads::lingering(linger))),
        };
    }

    /// The layer's answer to `problem`, with the status the [reasons' table](crate::rejection::Reason)
    /// gives it or the layer's own for a taken lock, rendered by the layer's hook if it has one.
    pub(crate) fn refuse<B: http_body::Body>(&self, problem: Problem) -> Response<LeaseBody<B>> {
        let status = problem.status(self.taken_status);
        let rejection = Rejection::new(problem, status, self.definition.namespace);
        match self.renderer.render(&rejection) {
            Some(response) => response.map(LeaseBody::rendered),
            None => rejection.problem_response().map(LeaseBody::problem),
        }
    }
}

/// `status`, if a layer may answer a busy name (or a full semaphore) with it: a 4xx, or `503`.
/// Anything else would tell clients the request failed on the server, or succeeded.
pub(in crate::layer) fn taken_status(option: &str, status: StatusCode) -> Option<StatusCode> {
    assert!(
        status.is_client_error() || status == StatusCode::SERVICE_UNAVAILABLE,
        "tower-lease: {option} must be a 4xx status or 503, got {status}"
    );
    Some(status)
}
