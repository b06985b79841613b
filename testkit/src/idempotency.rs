//! The idempotency calls of [`Backend`](tower_lease::backend::Backend): a key's first look (`idempotency_begin`), its
//! completion, the replay of the stored response, the reservation's lease, and at-most-once
//! markers (`idempotency_begin_once`, `idempotency_free`).

use std::time::Duration;

use tokio::time::sleep;
use tower_lease::backend::{Begin, Completion, Extended, LeaseRef, LockRef, Mode, Secret};

use crate::{Env, ROUNDING};

const NS: &str = "conformance-idem";
const TTL: Duration = Duration::from_millis(400);
const RETENTION: Duration = Duration::from_secs(10);
const FP: [u8; 16] = *b"fingerprint-0001";
const OTHER_FP: [u8; 16] = *b"fingerprint-0002";

fn lock(name: &[u8]) -> LockRef<'_> {
    LockRef::new(NS, name, TTL)
}

fn lease<'a>(name: &'a [u8], secret: &'a Secret) -> LeaseRef<'a> {
    LeaseRef::new(lock(name), Mode::Reservation, secret)
}

async fn begin(env: &Env, name: &[u8], secret: &Secret, fp: &[u8; 16]) -> Begin {
    let backend = env.backend();
    backend
        .idempotency_begin(lease(name, secret), fp)
        .await
        .expect("idempotency_begin")
}

async fn begin_once(env: &Env, name: &[u8], secret: &Secret) -> Begin {
    let backend = env.backend();
    backend
        .idempotency_begin_once(lease(name, secret), &FP, RETENTION)
        .await
        .expect("idempotency_begin_once")
}

async fn complete(env: &Env, name: &[u8], secret: &Secret, response: &[u8]) -> bool {
    let completion = Completion::new(&FP, response, RETENTION);
    let backend = env.backend();
    backend
        .idempotency_complete(lease(name, secret), completion)
        .await
        .expect("idempotency_complete")
}

fn assert_reserved(begin: Begin, what: &str) {
    assert!(
        matches!(begin, Begin::Reserved { .. }),
        "{what}: expected Reserved, got {begin:?}"
    );
}

fn assert_in_flight(begin: Begin, what: &str) {
    match begin {
        Begin::InFlight { retry_after } => assert!(
            retry_after <= TTL + ROUNDING && !retry_after.is_zero(),
            "{what}: in flight for {retry_after:?}, the reservation's TTL is {TTL:?}"
        ),
        other => panic!("{what}: expected InFlight, got {other:?}"),
    }
}

fn assert_completed(begin: Begin, response: &[u8], what: &str) {
    match begin {
        Begin::Completed {
            response: stored,
            expires_in,
        } => {
            assert_eq!(&stored[..], response, "{what}: the stored response");
            assert!(
                expires_in <= RETENTION && expires_in + Duration::from_secs(2) > RETENTION,
                "{what}: the record has {expires_in:?} left of {RETENTION:?}"
            );
        }
        other => panic!("{what}: expected Completed, got {other:?}"),
    }
}

/// The first look at a free key reserves it; a look with another secret then answers
/// `InFlight` with the reservation's remaining lease, and a look with the holder's own secret
/// (a retried call) answers `Reserved` again.
pub async fn begin_reserves_then_answers_in_flight(env: Env) {
    let (holder, retry) = (Secret::random(), Secret::random());
    assert_eq!(
        begin(&env, b"begin", &holder, &FP).await,
        Begin::Reserved { fence: None },
        "the first look at a free key"
    );
    assert_in_flight(begin(&env, b"begin", &retry, &FP).await, "a second request");
    assert_reserved(
        begin(&env, b"begin", &holder, &FP).await,
        "the holder's begin sent twice",
    );
    // Another key is untouched.
    assert_reserved(begin(&env, b"begin-2", &retry, &FP).await, "another key");
}

/// The holder's completion stores the response: a look with the same fingerprint replays it
/// (`Completed`, with the record's remaining retention), one with another fingerprint answers
/// `Mismatch`, and the completion sent twice answers `true` both times.
pub async fn complete_then_replay_or_mismatch(env: Env) {
    let (holder, retry) = (Secret::random(), Secret::random());
    assert_reserved(begin(&env, b"replay", &holder, &FP).await, "the first look");
    assert!(
        complete(&env, b"replay", &holder, b"receipt 1").await,
        "the holder's completion"
    );
    assert_completed(
        begin(&env, b"replay", &retry, &FP).await,
        b"receipt 1",
        "a retry",
    );
    assert_eq!(
        begin(&env, b"replay", &retry, &OTHER_FP).await,
        Begin::Mismatch,
        "a request with another fingerprint"
    );
    assert!(
        complete(&env, b"replay", &holder, b"receipt 1").await,
        "a completion retried after it went through finds its own record"
    );
    assert!(
        !complete(&env, b"replay", &retry, b"receipt 2").await,
        "a stranger completed a completed key"
    );
    assert_completed(
        begin(&env, b"replay", &retry, &FP).await,
        b"receipt 1",
        "after a stranger's completion",
    );
    // The completion ended the reservation: its lease is gone.
    let backend = env.backend();
    assert_eq!(
        backend.extend(lease(b"replay", &holder)).await.unwrap(),
        Extended::Gone,
        "a completed reservation was extended"
    );
}

/// A stranger (another secret) can neither overwrite a live reservation (its look answers
/// `InFlight`), nor complete, extend, release or free it; the holder still can.
pub async fn a_stranger_cannot_touch_a_live_reservation(env: Env) {
    let (holder, stranger) = (Secret::random(), Secret::random());
    let backend = env.backend();
    assert_reserved(begin(&env, b"live", &holder, &FP).await, "the first look");
    assert_in_flight(
        begin(&env, b"live", &stranger, &FP).await,
        "a stranger's look at a live reservation",
    );
    assert_in_flight(
        begin(&env, b"live", &stranger, &OTHER_FP).await,
        "a stranger's look with another fingerprint",
    );
    let once = backend
        .idempotency_begin_once(lease(b"live", &stranger), &FP, RETENTION)
        .await
        .unwrap();
    assert_in_flight(once, "a stranger's at-most-once look");
    assert!(
        !complete(&env, b"live", &stranger, b"not mine").await,
        "a stranger completed a live reservation"
    );
    assert_eq!(
        backend.extend(lease(b"live", &stranger)).await.unwrap(),
        Extended::Gone,
        "a stranger extended a live reservation"
    );
    assert!(
        !backend.release(lease(b"live", &stranger)).await.unwrap(),
        "a stranger released a live reservation"
    );
    assert!(
        !backend
            .idempotency_free(lease(b"live", &stranger))
            .await
            .unwrap(),
        "a stranger freed a live reservation"
    );
    // The holder's reservation is untouched.
    assert_in_flight(
        begin(&env, b"live", &stranger, &FP).await,
        "after the stranger's calls",
    );
    assert!(
        backend
            .extend(lease(b"live", &holder))
            .await
            .unwrap()
            .is_held(),
        "the holder's extension"
    );
    assert!(
        complete(&env, b"live", &holder, b"mine").await,
        "the holder's completion"
    );
    assert_completed(
        begin(&env, b"live", &stranger, &FP).await,
        b"mine",
        "after the holder's completion",
    );
}

/// A released or freed reservation frees the key: the next look (any fingerprint) reserves
/// it; a second release answers `false`.
pub async fn a_released_or_freed_reservation_frees_the_key(env: Env) {
    let (first, second) = (Secret::random(), Secret::random());
    let backend = env.backend();
    assert_reserved(begin(&env, b"freed", &first, &FP).await, "the first look");
    assert!(backend.release(lease(b"freed", &first)).await.unwrap());
    assert!(
        !backend.release(lease(b"freed", &first)).await.unwrap(),
        "a second release answered true"
    );
    assert_reserved(
        begin(&env, b"freed", &second, &OTHER_FP).await,
        "a look after the release",
    );
    assert!(
        backend
            .idempotency_free(lease(b"freed", &second))
            .await
            .unwrap()
    );
    assert!(
        !backend
            .idempotency_free(lease(b"freed", &second))
            .await
            .unwrap(),
        "a second free answered true"
    );
    assert_reserved(
        begin(&env, b"freed", &first, &FP).await,
        "a look after the free",
    );
}

/// A reservation nobody extends ends with its lease: the next look reserves the key, and the
/// old holder can then neither extend it nor complete it.
pub async fn a_reservation_ends_with_its_lease(env: Env) {
    let (stale, next) = (Secret::random(), Secret::random());
    let backend = env.backend();
    assert_reserved(begin(&env, b"ends", &stale, &FP).await, "the first look");
    sleep(TTL + Duration::from_millis(100)).await;
    assert_eq!(
        backend.extend(lease(b"ends", &stale)).await.unwrap(),
        Extended::Gone,
        "an ended reservation was extended"
    );
    assert_reserved(
        begin(&env, b"ends", &next, &FP).await,
        "a look after the reservation ended",
    );
    assert!(
        !complete(&env, b"ends", &stale, b"stale").await,
        "a stale holder completed over the next holder's reservation"
    );
    assert!(complete(&env, b"ends", &next, b"fresh").await);
    assert_completed(
        begin(&env, b"ends", &stale, &FP).await,
        b"fresh",
        "after the next holder's completion",
    );
}

/// At most once: a reservation taken by `idempotency_begin_once` leaves a marker, so a key
/// whose holder died (its lease ran out) answers `OutcomeUnknown` instead of running again; a
/// freed key runs again, and a completed one replays.
pub async fn at_most_once_marks_the_key(env: Env) {
    let (dead, retry) = (Secret::random(), Secret::random());
    let backend = env.backend();
    assert_reserved(begin_once(&env, b"once", &dead).await, "the first look");
    assert_in_flight(begin_once(&env, b"once", &retry).await, "while it runs");
    sleep(TTL + Duration::from_millis(100)).await;
    match begin_once(&env, b"once", &retry).await {
        Begin::OutcomeUnknown { expires_in } => assert!(
            expires_in <= RETENTION && expires_in + Duration::from_secs(2) > RETENTION,
            "the marker has {expires_in:?} left of {RETENTION:?}"
        ),
        other => panic!("a key whose holder died: expected OutcomeUnknown, got {other:?}"),
    }

    // Freed: the marker goes with the reservation.
    assert_reserved(begin_once(&env, b"once-freed", &dead).await, "first look");
    assert!(
        backend
            .idempotency_free(lease(b"once-freed", &dead))
            .await
            .unwrap()
    );
    assert_reserved(
        begin_once(&env, b"once-freed", &retry).await,
        "a look after the free",
    );

    // Completed: replays.
    assert_reserved(begin_once(&env, b"once-done", &dead).await, "first look");
    assert!(complete(&env, b"once-done", &dead, b"done").await);
    assert_completed(
        begin_once(&env, b"once-done", &retry).await,
        b"done",
        "an at-most-once retry",
    );
}

/// A fenced reservation takes a fence larger than every one before for its key, and the
/// holder's begin sent twice answers the fence it took.
pub async fn fenced_reservations_take_growing_fences(env: Env) {
    let backend = env.backend();
    let mut last = 0;
    for round in 0..4 {
        let secret = Secret::random();
        let lease = LeaseRef::new(lock(b"fenced").fenced(), Mode::Reservation, &secret);
        let Begin::Reserved { fence: Some(fence) } =
            backend.idempotency_begin(lease, &FP).await.unwrap()
        else {
            panic!("round {round}: a fenced look at a free key must reserve it with a fence");
        };
        assert!(fence > last, "fence {fence} after {last}");
        let again = backend.idempotency_begin(lease, &FP).await.unwrap();
        assert_eq!(
            again,
            Begin::Reserved { fence: Some(fence) },
            "the holder's begin sent twice"
        );
        assert!(backend.release(lease).await.unwrap());
        last = fence;
    }
}
