//! Lock definitions and key layout, checked without a store.

use std::time::Duration;

use tower_lease::store::{KeyLayout, KeyRole};
use tower_lease::{Error, Lock, RwLock};

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
    let long: &'static str = Box::leak("n".repeat(129).into_boxed_str());
    assert!(Lock::<str>::try_new(long, ttl).is_err());
    assert!(Lock::<str>::try_new(&long[..128], ttl).is_ok());

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
    let copy = JOBS;
    assert_eq!(copy, JOBS);
    assert!(JOBS.is_fenced());
    assert_eq!(JOBS.namespace(), "jobs");
    assert_eq!(JOBS.ttl(), Duration::from_secs(5));
}

/// CRC16/XMODEM, the hash Redis Cluster uses for key slots.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= (byte as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of `key`, hash tags included, as the cluster specification defines it.
fn slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % 16384
}

#[test]
fn slot_function_matches_the_cluster_specification() {
    assert_eq!(slot(b"123456789"), 12739);
    assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
    assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
}

const ROLES: [KeyRole; 5] = [
    KeyRole::Lock,
    KeyRole::LockFence,
    KeyRole::Writer,
    KeyRole::Readers,
    KeyRole::RwLockFence,
];

fn tricky_names() -> Vec<Vec<u8>> {
    let mut names: Vec<Vec<u8>> = [
        &b"a"[..],
        b"a:b",
        b"a}",
        b"a}:w",
        b"a}:r",
        b"a}:fence",
        b"}",
        b"{",
        b"{a}",
        b"}{",
        b"a\0b",
        b"\0",
        b"\xff\xfe",
        b"x:fence",
        b":w",
        b"ns:a",
    ]
    .map(<[u8]>::to_vec)
    .to_vec();
    names.push(vec![b'}'; 1024]);
    names
}

#[test]
fn every_key_of_a_name_shares_one_slot() {
    for prefix in ["tower-lease", "app:locks"] {
        let layout = KeyLayout::new(prefix);
        for name in tricky_names() {
            let slots: Vec<u16> = ROLES
                .iter()
                .map(|role| slot(&layout.key(*role, "ns", &name)))
                .collect();
            assert!(
                slots.windows(2).all(|w| w[0] == w[1]),
                "{name:?} spans slots {slots:?}"
            );
        }
    }
}

#[test]
fn distinct_namespace_name_pairs_never_share_a_key() {
    let layout = KeyLayout::default();
    let mut seen = std::collections::HashMap::new();
    for namespace in ["ns", "ns2", "a", "n"] {
        for name in tricky_names() {
            for role in ROLES {
                let key = layout.key(role, namespace, &name);
                let owner = (namespace, name.clone(), role);
                if let Some(previous) = seen.insert(key.clone(), owner.clone()) {
                    panic!("{previous:?} and {owner:?} share the key {key:?}");
                }
            }
        }
    }
}

#[test]
#[should_panic(expected = "key prefix")]
fn a_prefix_with_braces_is_refused() {
    let _ = KeyLayout::new("locks{1}");
}
