//! [`Calls`]: the backend as the scenarios call it directly, each call bounded by
//! [`CALL_DEADLINE`], and [`SuiteRun`]: what one run of the suite has seen hang.
//!
//! A call made through the [`Store`](tower_lease::Store) handle is bounded by the backend's
//! timeout, but many scenarios call the [`Backend`] directly, where nothing bounds it: a
//! backend whose call never answers (an acquisition lost on its way, a pool that ran out of
//! connections) would hold its scenario to the kit's [`DEADLINE`](crate::DEADLINE), and every
//! scenario after it too. So a direct call that has not answered within [`CALL_DEADLINE`] fails
//! its scenario, naming the call and its lease, and every scenario of the same
//! [`conformance!`](crate::conformance) run that starts after it fails at once with the same
//! name: a hanging backend fails the whole suite within seconds.

use std::fmt;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use tower_lease::Result;
use tower_lease::backend::{
    Acquisition, Backend, Begin, Completion, Extended, FINGERPRINT_LEN, LeaseRef, LockRef,
};

/// The longest a scenario's direct [`Backend`] call may take (or twice the backend's
/// [`timeout`](Backend::timeout), if longer): a store across the network answers within its
/// timeout, so one that has not answered by then never will.
pub const CALL_DEADLINE: Duration = Duration::from_secs(10);

/// What one run of the suite (one [`conformance!`](crate::conformance) invocation, or a
/// runner of [`scenarios`](crate::scenarios) of your own) has seen hang: once a call never
/// answered, each scenario that starts afterwards fails at once, naming that call.
#[derive(Debug, Default)]
pub struct SuiteRun {
    hung: OnceLock<String>,
}

impl SuiteRun {
    /// A run that has seen nothing hang yet.
    pub const fn new() -> Self {
        SuiteRun {
            hung: OnceLock::new(),
        }
    }

    /// The first call that never answered in this run, if one did.
    pub fn hung(&self) -> Option<&str> {
        self.hung.get().map(String::as_str)
    }
}

tokio::task_local! {
    /// The run of the scenario this task is running.
    static RUN: &'static SuiteRun;
}

/// Runs `scenario` as part of `run`: fails it at once if an earlier scenario of `run` found a
/// call that never answers, and records the call of this one that never answers.
pub(crate) async fn as_part_of<T>(run: &'static SuiteRun, scenario: impl Future<Output = T>) -> T {
    if let Some(call) = run.hung() {
        panic!("not run: an earlier scenario of this run found that {call}");
    }
    RUN.scope(run, scenario).await
}

/// The backend of a store, as a scenario calls it directly: each call bounded by
/// [`CALL_DEADLINE`]: one that never answers fails the scenario, naming the call, and marks
/// its [`SuiteRun`].
#[derive(Clone, Copy)]
pub struct Calls<'a> {
    backend: &'a dyn Backend,
    deadline: Duration,
}

impl fmt::Debug for Calls<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Calls")
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

impl<'a> Calls<'a> {
    /// `backend`'s calls, each bounded.
    pub fn new(backend: &'a dyn Backend) -> Self {
        Calls {
            backend,
            deadline: CALL_DEADLINE.max(backend.timeout() * 2),
        }
    }

    /// Waits for `call`, or fails the scenario (and marks the run) when it has not answered
    /// within the deadline.
    async fn answered<T>(&self, what: impl FnOnce() -> String, call: impl Future<Output = T>) -> T {
        match tokio::time::timeout(self.deadline, call).await {
            Ok(answer) => answer,
            Err(_) => {
                let call = format!(
                    "{} did not answer within {:?}: the backend hangs (a call that never \
                     answers, a pool whose connections ran out)",
                    what(),
                    self.deadline
                );
                let _ = RUN.try_with(|run| run.hung.set(call.clone()));
                panic!("{call}");
            }
        }
    }

    /// [`Backend::acquire`], bounded.
    pub async fn acquire(&self, lease: LeaseRef<'_>) -> Result<Acquisition> {
        let what = || format!("Backend::acquire of {}", Lease(lease));
        self.answered(what, self.backend.acquire(lease)).await
    }

    /// [`Backend::extend`], bounded.
    pub async fn extend(&self, lease: LeaseRef<'_>) -> Result<Extended> {
        let what = || format!("Backend::extend of {}", Lease(lease));
        self.answered(what, self.backend.extend(lease)).await
    }

    /// [`Backend::extend_many`], bounded.
    pub async fn extend_many(&self, leases: &[LeaseRef<'_>]) -> Vec<Result<Extended>> {
        let what = || format!("Backend::extend_many of {} leases", leases.len());
        self.answered(what, self.backend.extend_many(leases)).await
    }

    /// [`Backend::release`], bounded.
    pub async fn release(&self, lease: LeaseRef<'_>) -> Result<bool> {
        let what = || format!("Backend::release of {}", Lease(lease));
        self.answered(what, self.backend.release(lease)).await
    }

    /// [`Backend::withdraw_intent`], bounded.
    pub async fn withdraw_intent(&self, lease: LeaseRef<'_>) -> Result<bool> {
        let what = || format!("Backend::withdraw_intent of {}", Lease(lease));
        self.answered(what, self.backend.withdraw_intent(lease))
            .await
    }

    /// [`Backend::in_use`], bounded.
    pub async fn in_use(&self, lock: LockRef<'_>) -> Result<u32> {
        let what = || {
            format!(
                "Backend::in_use of `{}`/{:?}",
                lock.namespace,
                String::from_utf8_lossy(lock.name)
            )
        };
        self.answered(what, self.backend.in_use(lock)).await
    }

    /// [`Backend::idempotency_begin`], bounded.
    pub async fn idempotency_begin(
        &self,
        lease: LeaseRef<'_>,
        fingerprint: &[u8; FINGERPRINT_LEN],
    ) -> Result<Begin> {
        let what = || format!("Backend::idempotency_begin of {}", Lease(lease));
        let call = self.backend.idempotency_begin(lease, fingerprint);
        self.answered(what, call).await
    }

    /// [`Backend::idempotency_begin_once`], bounded.
    pub async fn idempotency_begin_once(
        &self,
        lease: LeaseRef<'_>,
        fingerprint: &[u8; FINGERPRINT_LEN],
        retention: Duration,
    ) -> Result<Begin> {
        let what = || format!("Backend::idempotency_begin_once of {}", Lease(lease));
        let call = self
            .backend
            .idempotency_begin_once(lease, fingerprint, retention);
        self.answered(what, call).await
    }

    /// [`Backend::idempotency_complete`], bounded.
    pub async fn idempotency_complete(
        &self,
        lease: LeaseRef<'_>,
        completion: Completion<'_>,
    ) -> Result<bool> {
        let what = || format!("Backend::idempotency_complete of {}", Lease(lease));
        let call = self.backend.idempotency_complete(lease, completion);
        self.answered(what, call).await
    }

    /// [`Backend::idempotency_free`], bounded.
    pub async fn idempotency_free(&self, lease: LeaseRef<'_>) -> Result<bool> {
        let what = || format!("Backend::idempotency_free of {}", Lease(lease));
        self.answered(what, self.backend.idempotency_free(lease))
            .await
    }
}

/// A lease as a failure names it: its mode, namespace and name.
struct Lease<'a>(LeaseRef<'a>);

impl fmt::Display for Lease<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lock = self.0.lock;
        write!(
            f,
            "the {:?} lease of `{}`/{:?}",
            self.0.mode,
            lock.namespace,
            String::from_utf8_lossy(lock.name)
        )
    }
}
