//! The store side of idempotency keys, through `Backend` directly: one atomic first look that
//! answers reserved, in flight, completed or mismatch; a completion stored only by the
//! reservation's holder; a release that frees the key; reservations that end with their lease
//! and records with their retention; calls safe to send twice.

use std::time::Duration;

use tower_lease::backend::{Begin, Completion, LeaseRef, LockRef, Mode, Secret};

use tower_lease::store::KeyRole;

use tower_lease_harness::Backing;

const NS: &str = "payments";
const TTL: Duration = Duration::from_millis(300);
const FP: [u8; 16] = *b"fingerprint-0001";
const OTHER_FP: [u8; 16] = *b"fingerprint-0002";

tower_lease_harness::store_tests!(
    Core: [
        the_first_look_reserves_then_answers_in_flight_completed_or_mismatch,
        only_the_holder_completes_and_a_stale_holder_stores_nothing,
        a_release_frees_the_key_for_the_next_request,
        a_reservation_ends_with_its_lease_unless_extended,
        a_record_expires_with_its_retention,
        begin_and_complete_are_safe_to_send_twice,
        fenced_reservations_take_growing_fences,
        a_fenced_look_answers_in_flight_completed_or_mismatch,
        a_released_reservation_is_taken_by_the_next_look,
        a_completion_into_an_empty_key_is_stored,
        at_most_once_a_reservation_that_ran_out_is_outcome_unknown,
        at_most_once_a_freed_key_runs_again_and_a_completed_one_replays,
    ],
    redis: [keys_share_one_tag_and_expire, scripts_survive_a_flush]
);

fn lock(name: &[u8]) -> LockRef<'_> {
    LockRef::new(NS, name, TTL)
}

fn lease<'a>(lock: LockRef<'a>, secret: &'a Secret) -> LeaseRef<'a> {
    LeaseRef::new(lock, Mode::Reservation, secret)
}

async fn begin(env: &Backing, name: &[u8], secret: &Secret, fp: &[u8; 16]) -> Begin {
    let backend = env.store.backend();
    backend
        .idempotency_begin(lease(lock(name), secret), fp)
        .await
        .unwrap()
}

async fn complete(env: &Backing, name: &[u8], secret: &Secret, response: &[u8]) -> bool {
    let completion = Completion::new(&FP, response, Duration::from_secs(60));
    let backend = env.store.backend();
    let lease = lease(lock(name), secret);
    backend
        .idempotency_complete(lease, completion)
        .await
        .unwrap()
}

async fn the_first_look_reserves_then_answers_in_flight_completed_or_mismatch(env: Backing) {
    let (first, retry) = (Secret::random(), Secret::random());
    assert_eq!(
        begin(&env, b"k1", &first, &FP).await,
        Begin::Reserved { fence: None }
    );
    match begin(&env, b"k1", &retry, &FP).await {
        Begin::InFlight { retry_after } => assert!(retry_after <= TTL, "{retry_after:?}"),
        other => panic!("expected in flight, got {other:?}"),
    }
    assert!(complete(&env, b"k1", &first, b"receipt 1").await);
    match begin(&env, b"k1", &retry, &FP).await {
        Begin::Completed {
            response,
            expires_in,
        } => {
            assert_eq!(response, "receipt 1");
            let retention = Duration::from_secs(60);
            assert!(retention - Duration::from_secs(5) < expires_in && expires_in <= retention);
        }
        other => panic!("expected completed, got {other:?}"),
    }
    assert_eq!(begin(&env, b"k1", &retry, &OTHER_FP).await, Begin::Mismatch);
    // Another key is untouched.
    let fresh = begin(&env, b"k2", &retry, &FP).await;
    assert_eq!(fresh, Begin::Reserved { fence: None });
}

async fn only_the_holder_completes_and_a_stale_holder_stores_nothing(env: Backing) {
    let (first, second) = (Secret::random(), Secret::random());
    assert!(matches!(
        begin(&env, b"k", &first, &FP).await,
        Begin::Reserved { .. }
    ));
    assert!(!complete(&env, b"k", &second, b"not mine").await);
    // The first holder's lease runs out; a retry reserves; the stale holder completes late.
    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
    assert!(matches!(
        begin(&env, b"k", &second, &FP).await,
        Begin::Reserved { .. }
    ));
    assert!(!complete(&env, b"k", &first, b"stale").await);
    assert!(matches!(
        begin(&env, b"k", &first, &FP).await,
        Begin::InFlight { .. }
    ));
    assert!(complete(&env, b"k", &second, b"fresh").await);
    let stored = begin(&env, b"k", &first, &FP).await;
    assert!(matches!(stored, Begin::Completed { response, .. } if response == "fresh"));
}

async fn a_release_frees_the_key_for_the_next_request(env: Backing) {
    let (first, second) = (Secret::random(), Secret::random());
    assert!(matches!(
        begin(&env, b"k", &first, &FP).await,
        Begin::Reserved { .. }
    ));
    let backend = env.store.backend();
    assert!(!backend.release(lease(lock(b"k"), &second)).await.unwrap());
    assert!(backend.release(lease(lock(b"k"), &first)).await.unwrap());
    assert!(!backend.release(lease(lock(b"k"), &first)).await.unwrap());
    // Nothing was stored: the next request runs, with any fingerprint.
    assert!(matches!(
        begin(&env, b"k", &second, &OTHER_FP).await,
        Begin::Reserved { .. }
    ));
}

async fn a_reservation_ends_with_its_lease_unless_extended(env: Backing) {
    let (holder, retry) = (Secret::random(), Secret::random());
    let backend = env.store.backend();
    assert!(matches!(
        begin(&env, b"kept", &holder, &FP).await,
        Begin::Reserved { .. }
    ));
    assert!(matches!(
        begin(&env, b"left", &holder, &FP).await,
        Begin::Reserved { .. }
    ));
    for _ in 0..4 {
        tokio::time::sleep(TTL / 3).await;
        let extended = backend.extend(lease(lock(b"kept"), &holder)).await.unwrap();
        assert!(extended.is_held());
    }
    assert!(matches!(
        begin(&env, b"kept", &retry, &FP).await,
        Begin::InFlight { .. }
    ));
    // The one nobody extended ran out: a retry is never told "in flight" for good.
    assert!(matches!(
        begin(&env, b"left", &retry, &FP).await,
        Begin::Reserved { .. }
    ));
    let gone = backend.extend(lease(lock(b"left"), &holder)).await.unwrap();
    assert!(!gone.is_held());
}

async fn a_record_expires_with_its_retention(env: Backing) {
    let secret = Secret::random();
    assert!(matches!(
        begin(&env, b"k", &secret, &FP).await,
        Begin::Reserved { .. }
    ));
    let completion = Completion::new(&FP, b"short-lived", Duration::from_millis(200));
    let backend = env.store.backend();
    let done = backend.idempotency_complete(lease(lock(b"k"), &secret), completion);
    assert!(done.await.unwrap());
    assert!(matches!(
        begin(&env, b"k", &secret, &OTHER_FP).await,
        Begin::Mismatch
    ));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let after = Secret::random();
    assert!(matches!(
        begin(&env, b"k", &after, &OTHER_FP).await,
        Begin::Reserved { .. }
    ));
}

async fn begin_and_complete_are_safe_to_send_twice(env: Backing) {
    let secret = Secret::random();
    assert!(matches!(
        begin(&env, b"k", &secret, &FP).await,
        Begin::Reserved { .. }
    ));
    // A begin whose reply was lost is sent again with the same secret.
    assert!(matches!(
        begin(&env, b"k", &secret, &FP).await,
        Begin::Reserved { .. }
    ));
    assert!(complete(&env, b"k", &secret, b"once").await);
    assert!(complete(&env, b"k", &secret, b"once").await);
    assert!(!complete(&env, b"k", &Secret::random(), b"other").await);
}

async fn fenced_reservations_take_growing_fences(env: Backing) {
    let backend = env.store.backend();
    let mut last = 0;
    for _ in 0..3 {
        let secret = Secret::random();
        let lease = LeaseRef::new(lock(b"f").fenced(), Mode::Reservation, &secret);
        let Begin::Reserved { fence: Some(fence) } =
            backend.idempotency_begin(lease, &FP).await.unwrap()
        else {
            panic!("a fenced reservation without a fence");
        };
        assert!(fence > last, "{fence} after {last}");
        last = fence;
        assert!(backend.release(lease).await.unwrap());
    }
}

async fn a_fenced_look_answers_in_flight_completed_or_mismatch(env: Backing) {
    let backend = env.store.backend();
    let (first, retry) = (Secret::random(), Secret::random());
    let fenced = lock(b"fk").fenced();
    let begin = |secret, fp| backend.idempotency_begin(lease(fenced, secret), fp);
    let Begin::Reserved { fence: Some(fence) } = begin(&first, &FP).await.unwrap() else {
        panic!("a fenced reservation without a fence");
    };
    // Our own reservation again (a reply lost): the same fence, not a new one.
    assert_eq!(
        begin(&first, &FP).await.unwrap(),
        Begin::Reserved { fence: Some(fence) }
    );
    match begin(&retry, &FP).await.unwrap() {
        Begin::InFlight { retry_after } => assert!(retry_after <= TTL, "{retry_after:?}"),
        other => panic!("expected in flight, got {other:?}"),
    }
    let completion = Completion::new(&FP, b"fenced receipt", Duration::from_secs(60));
    let completed = backend.idempotency_complete(lease(fenced, &first), completion);
    assert!(completed.await.unwrap());
    match begin(&retry, &FP).await.unwrap() {
        Begin::Completed { response, .. } => assert_eq!(response, "fenced receipt"),
        other => panic!("expected completed, got {other:?}"),
    }
    assert_eq!(begin(&retry, &OTHER_FP).await.unwrap(), Begin::Mismatch);
}

async fn a_released_reservation_is_taken_by_the_next_look(env: Backing) {
    // Released while others look, the key is taken again by exactly one of them.
    for round in 0..20 {
        let name = format!("raced-{round}");
        let holder = Secret::random();
        assert!(matches!(
            begin(&env, name.as_bytes(), &holder, &FP).await,
            Begin::Reserved { .. }
        ));
        let backend = env.store.backend();
        let secrets: Vec<Secret> = (0..8).map(|_| Secret::random()).collect();
        let looks = secrets
            .iter()
            .map(|secret| begin(&env, name.as_bytes(), secret, &FP));
        let release = backend.release(lease(lock(name.as_bytes()), &holder));
        let (released, begun) = tokio::join!(release, futures_util::future::join_all(looks));
        assert!(released.unwrap());
        let reserved = begun
            .iter()
            .filter(|b| matches!(b, Begin::Reserved { .. }))
            .count();
        assert!(
            reserved <= 1,
            "{reserved} reservations of one key: {begun:?}"
        );
        for b in &begun {
            assert!(
                matches!(b, Begin::Reserved { .. } | Begin::InFlight { .. }),
                "{b:?}"
            );
        }
    }
}

async fn keys_share_one_tag_and_expire(env: Backing) {
    let secret = Secret::random();
    let name = b"scope:key";
    assert!(matches!(
        begin(&env, name, &secret, &FP).await,
        Begin::Reserved { .. }
    ));
    let raw = env.raw();
    let key = raw.key(KeyRole::Idempotency, NS, name);
    assert_eq!(key, b"tower-lease:idem:{payments:scope:key}");
    let pttl = raw.pttl(&key).await;
    assert!(0 < pttl && pttl <= TTL.as_millis() as i64, "{pttl}");
    assert!(complete(&env, name, &secret, b"r").await);
    // The record replaced the reservation in the same key, with the retention.
    let pttl = raw.pttl(&key).await;
    assert!(55_000 < pttl && pttl <= 60_000, "{pttl}");
    let keys: Vec<Vec<u8>> = raw
        .query(redis::cmd("KEYS").arg("tower-lease:idem:*"))
        .await;
    assert_eq!(keys, vec![key]);
}

async fn scripts_survive_a_flush(env: Backing) {
    for i in 0..5 {
        env.raw()
            .query::<()>(redis::cmd("SCRIPT").arg("FLUSH"))
            .await;
        let secret = Secret::random();
        let name = format!("flushed-{i}");
        let begun = begin(&env, name.as_bytes(), &secret, &FP).await;
        assert!(matches!(begun, Begin::Reserved { .. }));
        env.raw()
            .query::<()>(redis::cmd("SCRIPT").arg("FLUSH"))
            .await;
        assert!(complete(&env, name.as_bytes(), &secret, b"r").await);
    }
}

async fn begin_once(env: &Backing, name: &[u8], secret: &Secret) -> Begin {
    let backend = env.store.backend();
    let lease = lease(lock(name), secret);
    let retention = Duration::from_secs(60);
    backend
        .idempotency_begin_once(lease, &FP, retention)
        .await
        .unwrap()
}

async fn a_completion_into_an_empty_key_is_stored(env: Backing) {
    let (first, other) = (Secret::random(), Secret::random());
    assert!(matches!(
        begin(&env, b"k", &first, &FP).await,
        Begin::Reserved { .. }
    ));
    // The reservation ran out (or a restart lost it) and nobody took the key since: the work
    // ran once, and its record is what the retries must get.
    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
    assert!(complete(&env, b"k", &first, b"late").await);
    assert!(complete(&env, b"k", &first, b"late").await, "sent twice");
    let stored = begin(&env, b"k", &other, &FP).await;
    assert!(matches!(stored, Begin::Completed { response, .. } if response == "late"));
    assert!(!complete(&env, b"k", &other, b"other").await);
}

async fn at_most_once_a_reservation_that_ran_out_is_outcome_unknown(env: Backing) {
    let (dead, retry) = (Secret::random(), Secret::random());
    assert!(matches!(
        begin_once(&env, b"k", &dead).await,
        Begin::Reserved { .. }
    ));
    assert!(matches!(
        begin_once(&env, b"k", &retry).await,
        Begin::InFlight { .. }
    ));
    // Its holder died: nobody extends, completes or frees the reservation.
    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
    for _ in 0..2 {
        let begun = begin_once(&env, b"k", &retry).await;
        assert!(
            matches!(begun, Begin::OutcomeUnknown { expires_in } if expires_in > Duration::from_secs(50)),
            "{begun:?}"
        );
    }
    assert!(
        !env.store
            .backend()
            .idempotency_free(lease(lock(b"k"), &retry))
            .await
            .unwrap()
    );
}

async fn at_most_once_a_freed_key_runs_again_and_a_completed_one_replays(env: Backing) {
    let (first, second, third) = (Secret::random(), Secret::random(), Secret::random());
    let backend = env.store.backend();
    assert!(matches!(
        begin_once(&env, b"k", &first).await,
        Begin::Reserved { .. }
    ));
    assert!(
        !backend
            .idempotency_free(lease(lock(b"k"), &second))
            .await
            .unwrap()
    );
    assert!(
        backend
            .idempotency_free(lease(lock(b"k"), &first))
            .await
            .unwrap()
    );
    // Freed with its marker (a 5xx): the next request runs.
    assert!(matches!(
        begin_once(&env, b"k", &second).await,
        Begin::Reserved { .. }
    ));
    assert!(complete(&env, b"k", &second, b"done").await);
    tokio::time::sleep(TTL + Duration::from_millis(100)).await;
    let stored = begin_once(&env, b"k", &third).await;
    assert!(matches!(stored, Begin::Completed { response, .. } if response == "done"));
}

/// A backend written before idempotency keys: only the required methods.
struct Older(tower_lease::store::MemoryStore);

impl tower_lease::backend::Backend for Older {
    fn acquire<'a>(
        &'a self,
        lease: LeaseRef<'a>,
    ) -> tower_lease::backend::BoxFuture<'a, tower_lease::Result<tower_lease::backend::Acquisition>>
    {
        self.0.acquire(lease)
    }

    fn extend<'a>(
        &'a self,
        lease: LeaseRef<'a>,
    ) -> tower_lease::backend::BoxFuture<'a, tower_lease::Result<tower_lease::backend::Extended>>
    {
        self.0.extend(lease)
    }

    fn release<'a>(
        &'a self,
        lease: LeaseRef<'a>,
    ) -> tower_lease::backend::BoxFuture<'a, tower_lease::Result<bool>> {
        self.0.release(lease)
    }

    fn in_use<'a>(
        &'a self,
        lock: LockRef<'a>,
    ) -> tower_lease::backend::BoxFuture<'a, tower_lease::Result<u32>> {
        self.0.in_use(lock)
    }
}

#[tokio::test]
async fn a_backend_without_idempotency_answers_a_clear_error() {
    use tower_lease::backend::Backend;
    let older = Older(tower_lease::store::MemoryStore::new());
    let secret = Secret::random();
    let error = older
        .idempotency_begin(lease(lock(b"k"), &secret), &FP)
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("does not support idempotency"),
        "{error}"
    );
    let completion = Completion::new(&FP, b"r", Duration::from_secs(1));
    let error = older
        .idempotency_complete(lease(lock(b"k"), &secret), completion)
        .await;
    assert!(error.is_err());
}
