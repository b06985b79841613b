//! The contract of a lease store: the [`Backend`] trait, the types its calls take and answer,
//! and the crate's [`Error`](crate::Error), which every call, of a store or of a lock, fails
//! with.
//!
//! Everything above it (the [`Store`](crate::Store) handle, the locks, the layers) talks to a
//! store through these alone; the built-in stores implement them, and so can a store of yours
//! (`tower-lease-testkit` runs the scenarios every backend must pass).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::Result;

pub(crate) mod error;
mod fairness;
mod idempotency;
mod notify;
mod warning;

pub use self::fairness::Fairness;
pub(crate) use self::idempotency::unsupported;
pub use self::idempotency::{Begin, Completion, FINGERPRINT_LEN};
pub use self::notify::NotificationSink;
pub(crate) use self::notify::{Hub, IntentListener, Intents};
#[cfg(feature = "redis")]
pub(crate) use self::warning::MIN_VERSION;
pub use self::warning::Warning;

/// How long a backend call may take by default ([`Backend::timeout`]).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest a write intent lasts after the attempt that left it. A waiting writer renews it
/// twice per window, so it may be late by half a window (a slow round trip, a busy executor)
/// before a reader slips in; and an intent whose writer left without withdrawing it (a crash, a
/// lost connection) keeps readers out for no longer than this.
pub(crate) const WRITE_INTENT_WINDOW: Duration = Duration::from_millis(500);

/// The shortest wait a `Retry-After` header can say: it counts whole seconds, and the layer
/// never says 0.
pub(crate) const SHORTEST_RETRY_AFTER: Duration = Duration::from_secs(1);

/// How long the write intent of a refused attempt that does not wait lasts: its writer comes
/// back, if at all, after the answer's `Retry-After`, at least a whole second and at most that
/// for a write the layer refused, and must find its intent still there, or the reads that came
/// meanwhile refuse it again, and again at every retry. The window on top covers the round
/// trips and the client's own delay; it is also how long a writer that never comes back holds
/// readers off, whatever the TTL, since a shorter intent would starve every writer that obeys.
pub(crate) const RETRY_INTENT_WINDOW: Duration = Duration::from_millis(1500);

/// The longest a read phase of a [phase-fair](Fairness::PhaseFair) lock lasts after the write
/// that began it ended: the readers it lets in come within a round trip of the release's
/// notification; one that never comes (it gave up, or crashed) holds writers off no longer.
pub(crate) const READ_PHASE: Duration = Duration::from_millis(500);

/// A boxed, `Send` future, as [`Backend`] methods return.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Which lease a [`Backend`] call is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// The one lease of a [`Lock`](crate::Lock).
    Exclusive,
    /// A reader's lease of an [`RwLock`](crate::RwLock).
    Read,
    /// The writer's lease of an [`RwLock`](crate::RwLock).
    Write,
    /// One of the permits of a [`Semaphore`](crate::Semaphore).
    Permit,
    /// The in-flight reservation of an idempotency key under
    /// [`IdempotencyLayer`](crate::IdempotencyLayer): taken by
    /// [`Backend::idempotency_begin`], extended and released like an exclusive lease.
    Reservation,
}

impl Mode {
    /// `"exclusive"`, `"read"`, `"write"`, `"permit"` or `"reservation"`: the mode as metrics and traces label
    /// it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Read => "read",
            Mode::Write => "write",
            Mode::Permit => "permit",
            Mode::Reservation => "reservation",
        }
    }
}

/// The lock a [`Backend`] call is about: namespace and name (already validated), TTL, whether
/// acquisitions are fenced, an `RwLock`'s [`Fairness`], and for a
/// [`Semaphore`](crate::Semaphore) how many permits it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockRef<'a> {
    /// The lock's namespace: printable ASCII without `:`, `{`, `}`.
    pub namespace: &'a str,
    /// The lock's name: 1 to [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) arbitrary bytes.
    pub name: &'a [u8],
    /// How long a lease lasts from acquisition or extension, in whole milliseconds.
    pub ttl: Duration,
    /// Whether exclusive and write acquisitions take a fencing token.
    pub fenced: bool,
    /// For an [`RwLock`](crate::RwLock): who goes first when readers and writers contend
    /// ([`RwLock::fairness`](crate::RwLock::fairness)); see [`write_intent`](Self::write_intent)
    /// and [`read_phase`](Self::read_phase) for what a backend keeps for it.
    pub fairness: Fairness,
    /// For [`Mode::Permit`]: the most permits live at once (at least 1); 0 for other locks.
    pub permits: u32,
}

impl<'a> LockRef<'a> {
    /// Names a lock for a direct [`Backend`] call, as the lock definitions do.
    ///
    /// The caller is responsible for what the definitions check: a valid namespace, a name of 1
    /// to [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes and a TTL of at least 1 ms.
    /// It is unfenced, [readers-first](Fairness::ReadersFirst) (unlike
    /// [`RwLock::new`](crate::RwLock::new), whose default is [`Fairness::PhaseFair`]: a direct
    /// call names its policy with [`fairness`](Self::fairness)) and no semaphore until the
    /// builders below say otherwise.
    pub fn new(namespace: &'a str, name: &'a [u8], ttl: Duration) -> Self {
        Self {
            namespace,
            name,
            ttl,
            fenced: false,
            fairness: Fairness::ReadersFirst,
            permits: 0,
        }
    }

    /// The same lock, [fenced](crate::Lock::fenced): exclusive and write acquisitions issue a
    /// fence.
    pub fn fenced(self) -> Self {
        Self {
            fenced: true,
            ..self
        }
    }

    /// The same lock, as a semaphore of `permits` permits, for [`Mode::Permit`] calls.
    pub fn permits(self, permits: u32) -> Self {
        Self { permits, ..self }
    }

    /// How long the write intent of a refused attempt of a *waiting* writer lasts: 500 ms or
    /// the TTL if that is shorter, renewed by each attempt; `None` for a lock whose writers
    /// leave none ([`Fairness::ReadersFirst`]). A backend keeps each intent as long as
    /// [`LeaseRef::write_intent`] says, which is this for a waiting attempt and longer for one
    /// that does not wait.
    pub fn write_intent(&self) -> Option<Duration> {
        self.fairness
            .leaves_write_intent()
            .then(|| self.ttl.min(WRITE_INTENT_WINDOW))
    }

    /// How long a read phase of a [phase-fair](Fairness::PhaseFair) lock lasts at most: 500 ms
    /// or the TTL if that is shorter; `None` under the other policies, which have none. A
    /// waiting reader's note lasts twice as long past the `retry_after` it was answered.
    pub fn read_phase(&self) -> Option<Duration> {
        self.fairness
            .has_read_phases()
            .then(|| self.ttl.min(READ_PHASE))
    }

    /// The same lock under `fairness`.
    pub fn fairness(self, fairness: Fairness) -> Self {
        Self { fairness, ..self }
    }
}

/// What an acquisition found: the lease is the caller's now, or someone else's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquisition {
    /// The lease is now held with the caller's token.
    Acquired {
        /// For a fenced lock: the fence of this acquisition, `max(last + 1, store time in µs)`
        /// (for a reader, the last writer's, 0 before any). `None` for an unfenced lock.
        fence: Option<u64>,
    },
    /// Someone else holds it.
    Busy {
        /// How long the blocking lease has left.
        retry_after: Duration,
    },
}

/// What an extension found: the lease runs on for one TTL, or it is gone.
///
/// A reader's extension also says whether a writer waits for the readers to leave (a write
/// intent of a [phase-fair](Fairness::PhaseFair) or [writers-first](Fairness::WritersFirst)
/// lock):
/// the layer then stops sharing that reader lease with new requests, so the writer gets in
/// once the current reads end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Extended {
    /// The lease was not held with its secret any more, and was not extended.
    Gone,
    /// The lease runs for one more TTL from now.
    Held,
    /// A reader lease runs for one more TTL from now, and a write intent is live: new readers
    /// are refused until it ends.
    HeldWriterWaiting,
}

impl Extended {
    /// Whether the lease was extended.
    pub fn is_held(self) -> bool {
        !matches!(self, Extended::Gone)
    }
}

/// The random secret that identifies one lease: whoever has it can extend or release the lease.
/// Its `Debug` output does not show it.
///
/// The [tokens](crate::LockToken) that applications hold keep it private; only a [`Backend`]
/// sees it.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Secret([u8; 16]);

impl Secret {
    /// A fresh secret of 16 random bytes.
    pub fn random() -> Self {
        Secret(rand::random())
    }

    /// A fresh secret for a waiter, which orders after the waiters' secrets made before it:
    /// its first six bytes are the milliseconds since the Unix epoch (big-endian), the other
    /// ten random. Compared byte by byte, the first six bytes of a wait that began earlier are
    /// less, in any process whose clock is in step; phase-fair writers that wait go in that
    /// order (see [`Backend`], *Write intents*).
    pub fn queued() -> Self {
        let millis = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as u64);
        let mut bytes: [u8; 16] = rand::random();
        bytes[..6].copy_from_slice(&millis.to_be_bytes()[2..]);
        Secret(bytes)
    }

    /// The secret's bytes, as stored.
    pub fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// The lease a [`Backend`] call acts on: which lock, in which mode, held with which secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseRef<'a> {
    /// The lock.
    pub lock: LockRef<'a>,
    /// Which of the lock's leases.
    pub mode: Mode,
    /// The secret the lease is (or is to be) held with.
    pub secret: &'a Secret,
    /// For an `acquire`: the attempt is one of a bounded wait, which tries again with the same
    /// secret until it gets in or gives up. A [phase-fair](Fairness::PhaseFair) reader refused
    /// by a writer or a write intent is then noted as waiting, and let in before the next
    /// writer once the write ends; a phase-fair writer refused by a writer leaves its write
    /// intent (as one refused by readers always does). `false` for a single attempt (`try_read`), and for every
    /// other call.
    pub waiting: bool,
}

impl<'a> LeaseRef<'a> {
    /// Names a lease for a direct [`Backend`] call.
    pub fn new(lock: LockRef<'a>, mode: Mode, secret: &'a Secret) -> Self {
        Self {
            lock,
            mode,
            secret,
            waiting: false,
        }
    }

    /// The same lease, acquired by an attempt of a bounded wait (see
    /// [`waiting`](Self::waiting)).
    pub fn waiting(self) -> Self {
        Self {
            waiting: true,
            ..self
        }
    }

    /// How long the write intent this write attempt leaves when it is refused lasts, from the
    /// refusal; every backend keeps it this long. `None` for a lock whose writers leave none
    /// ([`Fairness::ReadersFirst`]), and for a lease that is not a writer's.
    ///
    /// A [`waiting`](Self::waiting) attempt's is [`LockRef::write_intent`] (500 ms, at most the
    /// TTL): its writer attempts again within half of it, and withdraws it when it gives up.
    /// One that does not wait (`try_write`, a layer without a wait) leaves its intent for
    /// 1.5 s, whatever the TTL: its writer, told to come back after a `Retry-After` of whole
    /// seconds, at least one, must find it still there, or the reads that came meanwhile
    /// refuse it again at every retry.
    pub fn write_intent(&self) -> Option<Duration> {
        let window = self
            .lock
            .write_intent()
            .filter(|_| self.mode == Mode::Write)?;
        Some(match self.waiting {
            true => window,
            false => RETRY_INTENT_WINDOW,
        })
    }
}

/// The operations a lease store provides. Object-safe, so a [`Store`](crate::Store) can hold
/// any of them.
///
/// Implement it to keep leases somewhere else: [`Store::memory`](crate::Store::memory)'s
/// `MemoryStore` is a short example, and `tower-lease-testkit` runs the scenarios every backend
/// must pass (and compares random call sequences with the memory store's answers). The rules,
/// all of them:
///
/// - **Locks.** A lock is its kind ([`Mode::Exclusive`]; [`Mode::Read`] and [`Mode::Write`],
///   the two sides of one `RwLock`; [`Mode::Permit`]; [`Mode::Reservation`]), namespace and
///   name: locks of different kinds never share state, even under the same namespace and
///   name. Time is the store's own clock (one clock for every process), in whole milliseconds.
/// - **`acquire` never waits**: it takes the lease for one TTL or answers
///   [`Acquisition::Busy`] with how long the blocking lease has left. An exclusive lease or a
///   writer is refused while a lease of the lock is live (a writer: while a writer or any
///   reader is live; `retry_after` is then the writer's remaining time, or the *latest*
///   reader's, when only readers block); a reader is refused while a writer is live
///   (its remaining time) or a write intent lives (the intent's remaining time). A permit is
///   refused while `permits` permits of the name are live; `retry_after` is the *earliest*
///   live permit's remaining time. Readers and permits each have a lease of their own, ended
///   one by one.
/// - **A secret that already holds.** The callers never send an `acquire` whose secret holds
///   the lease already, but a retried call whose first reply was lost can arrive as one: a
///   backend may answer either `Busy` (with the lease's own remaining time) or `Acquired`
///   (taking it again for a TTL); both are safe, since the secret is the caller's own. A
///   write's, though, answers `Acquired` (with the fence it was given) before the order of
///   waits below is looked at: a waiting writer told `Busy` by its own lease would wait it out,
///   and every other caller with it.
/// - **`extend` and `release` act only on the lease held with *this* secret** and answer
///   `false` (for `extend`, [`Extended::Gone`]) otherwise; a lease that ran out is gone, and
///   `extend` never takes it again. A reader's `extend` answers
///   [`Extended::HeldWriterWaiting`] when it extended the lease while a write intent lives.
///   Releasing what is not held is harmless and may be repeated.
/// - **Write intents.** A write `acquire` of a lock whose [`LockRef::write_intent`] is `Some`
///   ([`Fairness::PhaseFair`], [`Fairness::WritersFirst`]) refused by live readers, or by a
///   read phase (under `PhaseFair`, a [`waiting`](LeaseRef::waiting) attempt refused by a
///   writer too), leaves a write intent holding the attempt's secret, for
///   [`LeaseRef::write_intent`] (renewed by each refused attempt, for as long as that one
///   says); a successful write acquisition removes it.
///   [`withdraw_intent`](Self::withdraw_intent) removes it only while it still holds the
///   caller's secret. Under `PhaseFair`, writers that wait go in the order their waits began
///   ([`Secret::queued`]): a [`waiting`](LeaseRef::waiting) writer is refused while the intent
///   of another writer lives whose secret's first six bytes are not greater than its own
///   (`retry_after`: the intent's time left), and leaves none of its own then; the intent of
///   one whose first six bytes are greater it takes over, as if there were none.
/// - **Read phases** ([`Fairness::PhaseFair`], [`LockRef::read_phase`]). A reader's
///   [`waiting`](LeaseRef::waiting) `acquire` refused by a live writer or a write intent notes
///   its secret as a *waiting reader* until `retry_after` plus twice the read phase from now
///   (each refused attempt renews it). A writer's `release` that ends its lease turns the waiting
///   readers noted then into the lock's *read phase*, which lasts [`LockRef::read_phase`]: its
///   readers are let in despite a write intent (each leaving the phase as it enters), and
///   while one of them has not entered, a writer is refused (`retry_after`: the phase's
///   remaining time) and leaves its intent. A reader that enters otherwise also leaves the
///   waiting readers and the phase. Under the other policies nothing is noted.
/// - **Fences.** Fenced exclusive and write acquisitions take a per-lock fence larger than
///   every fence issued before, `max(last + 1, the store's clock in µs)`, so that it keeps
///   growing when the counter is lost (a restart without persistence, a failover); a reader
///   of a fenced `RwLock` gets the last writer's fence (0 before any). Unfenced acquisitions
///   answer `None`.
/// - **Timeouts.** The [`Store`](crate::Store) handle ends a call that takes longer than
///   [`timeout`](Self::timeout); an acquisition or a reservation it ended is finished in the
///   background and given back if it took the lease. An `acquire` or `idempotency_begin` that
///   fails with an error that leaves open whether it acted (a timeout, an
///   [`Error::Backend`](crate::Error::Backend), a reply not understood) is followed by
///   `release` calls with the same secret, in the background, until one answers.
/// - **Notifications** (optional): a backend that can hear other processes' releases and
///   write intents delivers them to the [`NotificationSink`] it is handed by
///   [`notify_to`](Self::notify_to); without them, waiters poll.
/// - **Idempotency keys** (optional): the four `idempotency_*` methods, whose defaults answer
///   an error, so that [`IdempotencyLayer`](crate::IdempotencyLayer) answers `503` on a
///   backend without them.
pub trait Backend: Send + Sync + 'static {
    /// Takes `lease` if it is free.
    fn acquire<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Acquisition>>;

    /// Restarts `lease` for one TTL; [`Extended::Gone`] if it is not held with its secret any
    /// more.
    fn extend<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<Extended>>;

    /// Ends `lease`; `false` if it was not held with its secret any more.
    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>>;

    /// Ends `lease`, whose holder has confirmed it live until after now: its last acquire or
    /// extend was sent less than the TTL, less the drift allowance, ago.
    ///
    /// A store may then skip asking its own clock whether the lease ran out, and count a
    /// lease it still finds as held. That differs from [`release`](Self::release) only for a
    /// lease that ran out while the call was on its way, and only when nothing took its place:
    /// a writer takes its lock only once no reader is live and drops the ended ones, and a
    /// permit's slot is taken back only by dropping the ended permit. The Redis store does it
    /// for readers and permits, whose leases are members of a set and do not expire by
    /// themselves. The default is [`release`](Self::release).
    fn release_live<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        self.release(lease)
    }

    /// Removes the write intent that the refused write attempts of `lease` (a [`Mode::Write`]
    /// lease of a lock whose writers leave intents, with the secret those attempts carried) left, when a
    /// waiting writer gives up; `true` if it removed one. An intent that holds another secret
    /// (another writer's, still waiting) stays. Like a release, a removal wakes the lock's
    /// waiters elsewhere where the store notifies them.
    ///
    /// The default removes nothing and answers `false`, which is right for a backend that keeps
    /// no intents; one that keeps them must override it, or a writer that gave up holds readers
    /// off for the rest of its intent's window.
    fn withdraw_intent<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        let _ = lease;
        Box::pin(async { Ok(false) })
    }

    /// How many permits of the semaphore `lock` names are live now.
    fn in_use<'a>(&'a self, lock: LockRef<'a>) -> BoxFuture<'a, Result<u32>>;

    /// Extends many leases at once, answering in the order of `leases` what
    /// [`extend`](Self::extend) would have answered for each.
    ///
    /// The store's heartbeat sends the extensions that fall due together through this. The
    /// default runs the single `extend`s concurrently; `RedisStore` sends them in one
    /// pipeline, which costs the client and the server far less per lease.
    fn extend_many<'a>(
        &'a self,
        leases: &'a [LeaseRef<'a>],
    ) -> BoxFuture<'a, Vec<Result<Extended>>> {
        let calls = leases.iter().map(|&lease| self.extend(lease));
        Box::pin(futures_util::future::join_all(calls))
    }

    /// Looks at an idempotency key for [`IdempotencyLayer`](crate::IdempotencyLayer), in one
    /// atomic step: a completed record answers [`Begin::Completed`] when its fingerprint is
    /// `fingerprint` and [`Begin::Mismatch`] otherwise; else a live reservation answers
    /// [`Begin::InFlight`]; else `lease` (a [`Mode::Reservation`] lease, whose name is the
    /// encoded scope and key) is taken, [`Begin::Reserved`]. A reservation found held with
    /// `lease`'s own secret (a retried call whose reply was lost) answers `Reserved` too.
    ///
    /// [`extend`](Self::extend) and [`release`](Self::release) act on the reservation as on
    /// an exclusive lease; a release frees the key for the next request.
    ///
    /// The default answers an error saying the backend does not support idempotency keys.
    fn idempotency_begin<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        fingerprint: &'a [u8; FINGERPRINT_LEN],
    ) -> BoxFuture<'a, Result<Begin>> {
        let _ = (lease, fingerprint);
        Box::pin(async { Err(unsupported()) })
    }

    /// Stores `completion` under the key of the reservation `lease`, for
    /// `completion.retention`, and ends the reservation, only while the reservation is still
    /// held with `lease`'s secret, or the key is empty (the reservation ran out and nobody
    /// took it, or the store lost it in a restart: the work the record records ran, and no
    /// other request runs); `false` (and nothing stored) when another request holds the key
    /// or completed it. A call retried after it went through finds its own record and answers
    /// `true`, so the layer retries a completion that failed until it learns the answer.
    ///
    /// The default answers an error saying the backend does not support idempotency keys.
    fn idempotency_complete<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        completion: Completion<'a>,
    ) -> BoxFuture<'a, Result<bool>> {
        let _ = (lease, completion);
        Box::pin(async { Err(unsupported()) })
    }

    /// [`idempotency_begin`](Self::idempotency_begin) for an
    /// [at-most-once](crate::Idempotency::at_most_once) key: reserving the key also leaves a
    /// marker that lives for `retention`, and a key found free while its marker lives (its
    /// holder died without completing or freeing it) answers [`Begin::OutcomeUnknown`].
    /// A completion ends the marker with the reservation;
    /// [`idempotency_free`](Self::idempotency_free) removes both.
    ///
    /// The default answers an error saying the backend does not support idempotency keys.
    fn idempotency_begin_once<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        fingerprint: &'a [u8; FINGERPRINT_LEN],
        retention: Duration,
    ) -> BoxFuture<'a, Result<Begin>> {
        let _ = (lease, fingerprint, retention);
        Box::pin(async { Err(unsupported()) })
    }

    /// Frees the key of the reservation `lease` for the next request, with the marker an
    /// at-most-once reservation left, only while the reservation is held with `lease`'s
    /// secret; `false` otherwise. The layer calls it when a response is not stored (a `5xx`).
    ///
    /// The default is [`release`](Self::release), enough for a backend without
    /// [`idempotency_begin_once`](Self::idempotency_begin_once).
    fn idempotency_free<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool>> {
        self.release(lease)
    }

    /// The longest one call may take: the [`Store`](crate::Store) handle ends a call that has
    /// not answered by then (and a sixteenth of it more, at most 50 ms: one coarse timer keeps
    /// every call's deadline) with [`Error::Timeout`](crate::Error::Timeout), so a stalled
    /// backend costs a request a `503` within it, never a hang. An acquisition (or an
    /// idempotency reservation) it ends is not dropped but finished in the background: if it
    /// takes the lease after all, the lease is released at once. The default is
    /// [`DEFAULT_TIMEOUT`], 1 s.
    ///
    /// A backend need not bound its calls itself; if it does (a server-side statement timeout),
    /// a call it ends must not act later.
    fn timeout(&self) -> Duration {
        DEFAULT_TIMEOUT
    }

    /// Hands the backend the sink for what it hears of other processes: answer `true` if it
    /// will deliver there every release and write intent of the locks it is asked to
    /// [`watch`](Self::watch) (from every process, this one included; or only the releases a
    /// refused call waited for, if [`announces_every_release`](Self::announces_every_release)
    /// says so), and `false` if it
    /// delivers nothing (the default). Called once, by
    /// [`Store::from_backend`](crate::Store::from_backend), within the tokio runtime when the
    /// store is made in one; a listening task may be spawned here or when the first lock is
    /// watched.
    ///
    /// Without notifications, waiters poll (from 5 ms, backing off to 100 ms) and a shared
    /// read lease hears of a waiting writer in another process only when its heartbeat's
    /// extension answers [`Extended::HeldWriterWaiting`]; with them, both act at once.
    fn notify_to(&self, sink: NotificationSink) -> bool {
        let _ = sink;
        false
    }

    /// Whether the releases delivered to the sink (see [`notify_to`](Self::notify_to)) include
    /// those that no refused call waited for. A backend that announces only the releases of
    /// names a refused attempt marked, since the last such release (sparing a notification
    /// nobody would hear), answers `false`: this process's waiters then also wake on this
    /// process's own releases, since a waiter queued behind another here sends no attempt
    /// while the lock is this process's, and so marks nothing. The default is `true`.
    fn announces_every_release(&self) -> bool {
        true
    }

    /// Whether the releases delivered to the sink include those made through this backend.
    /// A backend that knows its own releases when it hears them (a Redis release publishes
    /// its holder's secret, which the store that released it recognises) and delivers only
    /// the others answers `false`: every waiter in this process then wakes on this process's
    /// releases directly, once, rather than again when the notification comes back. The
    /// default is `true`.
    fn delivers_own_releases(&self) -> bool {
        true
    }

    /// A waiter in this process starts watching the lock of `mode` on `name` in `namespace`
    /// (the first one of that lock: the handle counts the others): resolves once every
    /// release and write intent of it from now on will reach the sink. An error, or no answer
    /// within [`timeout`](Self::timeout), leaves that waiter polling.
    ///
    /// The default does nothing, right for a backend that delivers everything it hears.
    fn watch<'a>(
        &'a self,
        mode: Mode,
        namespace: &'a str,
        name: &'a [u8],
    ) -> BoxFuture<'a, Result<()>> {
        let _ = (mode, namespace, name);
        Box::pin(async { Ok(()) })
    }

    /// Nobody in this process watches the lock of `mode` on `name` in `namespace` any more
    /// (after a [`watch`](Self::watch) of it, answered or not). The default does nothing.
    fn unwatch(&self, mode: Mode, namespace: &str, name: &[u8]) {
        let _ = (mode, namespace, name);
    }

    /// Looks for setup problems that can break the guarantees, for [`Store::check`](crate::Store::check). The
    /// default finds none.
    fn check(&self) -> BoxFuture<'_, Result<Vec<Warning>>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}
