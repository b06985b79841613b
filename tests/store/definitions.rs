//! Lock definitions, checked without a store: bad namespaces and TTLs are clear errors (or a
//! clear panic outside `const`), and definitions are `const` and `Copy`.

use std::time::Duration;

use tower_lease::{Error, Lock, MAX_NAMESPACE_LEN, RwLock};

#[test]
fn try_new_rejects_bad_definitions_with_clear_errors() {
    let ttl = Duration::from_secs(1);
    for namespace in [
        "",
        "with:colon",
        "{tag}",
        "brace}",
        "with space",
        "tab\t",
        "é",
    ] {
        match Lock::<str>::try_new(namespace, ttl) {
            Err(Error::InvalidNamespace {
                namespace: reported,
                reason,
            }) => {
                assert_eq!(reported, namespace);
                assert!(!reason.is_empty());
            }
            other => panic!("{namespace:?} must be an invalid namespace, got {other:?}"),
        }
        assert!(RwLock::<str>::try_new(namespace, ttl).is_err());
    }
    // The limit the crate publishes is the one it enforces.
    let long: &'static str = Box::leak("n".repeat(MAX_NAMESPACE_LEN + 1).into_boxed_str());
    assert!(Lock::<str>::try_new(long, ttl).is_err());
    assert!(Lock::<str>::try_new(&long[..MAX_NAMESPACE_LEN], ttl).is_ok());
    assert!(RwLock::<str>::try_new(long, ttl).is_err());
    assert!(RwLock::<str>::try_new(&long[..MAX_NAMESPACE_LEN], ttl).is_ok());

    for ttl in [Duration::ZERO, Duration::from_micros(999)] {
        match Lock::<str>::try_new("jobs", ttl) {
            Err(error @ Error::InvalidTtl { .. }) => {
                assert!(
                    error.to_string().contains("at least 1 ms"),
                    "unclear: {error}"
                )
            }
            other => panic!("a {ttl:?} TTL must be invalid, got {other:?}"),
        }
        assert!(matches!(
            RwLock::<str>::try_new("jobs", ttl),
            Err(Error::InvalidTtl { .. })
        ));
    }
    let lock = Lock::<str>::try_new("jobs", Duration::from_micros(1500)).unwrap();
    assert_eq!(
        lock.ttl(),
        Duration::from_millis(1),
        "TTLs count whole milliseconds"
    );
}

#[test]
fn new_panics_clearly_outside_const() {
    let message = |f: fn()| {
        let payload = std::panic::catch_unwind(f).expect_err("must panic");
        payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .unwrap_or_default()
    };
    let zero = message(|| {
        let _ = Lock::<str>::new("jobs", std::hint::black_box(Duration::ZERO));
    });
    assert!(
        zero.contains("TTL must be at least 1 ms"),
        "unclear panic: {zero:?}"
    );
    let colon = message(|| {
        let _ = RwLock::<str>::new(std::hint::black_box("a:b"), Duration::MAX);
    });
    assert!(colon.contains("namespace"), "unclear panic: {colon:?}");
}

#[test]
fn definitions_are_const_and_copy() {
    const JOBS: Lock<u64> = Lock::new("jobs", Duration::from_secs(5)).fenced();
    const DOCS: RwLock<str> =
        RwLock::new("docs", Duration::from_secs(5)).fairness(tower_lease::Fairness::WritersFirst);
    // Each use of a `const` is a fresh value, so copies are taken from a binding: used again
    // after it was moved, it must be `Copy`.
    let jobs = JOBS;
    let copy = jobs;
    assert_eq!(copy, jobs);
    assert!(jobs.is_fenced());
    assert_eq!(jobs.namespace(), "jobs");
    assert_eq!(jobs.ttl(), Duration::from_secs(5));
    let docs = DOCS;
    let copy = docs;
    assert_eq!(copy, docs);
    assert_eq!(docs.fairness_policy(), tower_lease::Fairness::WritersFirst);
}
