//! The key layout, checked without a store: it is injective (no two distinct (prefix, role,
//! namespace, name) share a key, whatever bytes a name holds: braces, colons, NUL, invalid
//! UTF-8), and every key keeps its name's `{…}` hash tag, so all keys of one name live in one
//! cluster slot. Named examples first, then properties over generated inputs.

use proptest::prelude::*;
use tower_lease::MAX_NAME_LEN;
use tower_lease::store::{KeyLayout, KeyRole};

const ROLES: [KeyRole; 9] = [
    KeyRole::Lock,
    KeyRole::LockFence,
    KeyRole::Writer,
    KeyRole::Readers,
    KeyRole::WriteIntent,
    KeyRole::RwLockFence,
    KeyRole::RwLockWaited,
    KeyRole::Permits,
    KeyRole::PermitsWaited,
];

/// The parts a key was built from, read back from the key alone. That such a function exists
/// is the proof of injectivity; it relies only on what the definitions enforce (a prefix without
/// braces, a namespace without `:` and braces).
fn decode(key: &[u8]) -> Option<(String, KeyRole, String, Vec<u8>)> {
    let open = key.iter().position(|&b| b == b'{')?;
    let head = std::str::from_utf8(&key[..open]).ok()?.strip_suffix(':')?;
    let (prefix, family) = head.rsplit_once(':')?;
    let tail = &key[open + 1..];
    let colon = tail.iter().position(|&b| b == b':')?;
    let namespace = std::str::from_utf8(&tail[..colon]).ok()?;
    let rest = &tail[colon + 1..];
    let (role, name) = match family {
        "lock" => match rest {
            [name @ .., b'}'] => (KeyRole::Lock, name),
            _ => (KeyRole::LockFence, rest.strip_suffix(b"}:fence")?),
        },
        "rwlock" => {
            if let Some(name) = rest.strip_suffix(b"}:w") {
                (KeyRole::Writer, name)
            } else if let Some(name) = rest.strip_suffix(b"}:r") {
                (KeyRole::Readers, name)
            } else if let Some(name) = rest.strip_suffix(b"}:wi") {
                (KeyRole::WriteIntent, name)
            } else if let Some(name) = rest.strip_suffix(b"}:waited") {
                (KeyRole::RwLockWaited, name)
            } else {
                (KeyRole::RwLockFence, rest.strip_suffix(b"}:fence")?)
            }
        }
        "sem" => match rest {
            [name @ .., b'}'] => (KeyRole::Permits, name),
            _ => (KeyRole::PermitsWaited, rest.strip_suffix(b"}:waited")?),
        },
        _ => return None,
    };
    Some((prefix.to_owned(), role, namespace.to_owned(), name.to_vec()))
}

/// Redis Cluster's hash tag: the bytes between the first `{` and the next `}`, if not empty.
fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    match key[open + 1..].iter().position(|&b| b == b'}') {
        Some(0) | None => key,
        Some(len) => &key[open + 1..open + 1 + len],
    }
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
    crc16(hash_tag(key)) % 16384
}

#[test]
fn slot_function_matches_the_cluster_specification() {
    assert_eq!(slot(b"123456789"), 12739);
    assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
    assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
}

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

fn role() -> impl Strategy<Value = KeyRole> {
    prop::sample::select(ROLES.to_vec())
}

/// Namespaces as the definitions allow them: printable ASCII without `:`, `{`, `}`, space.
fn namespace() -> impl Strategy<Value = String> {
    "[!-9;-z|~]{1,12}"
}

/// Prefixes as `KeyLayout::new` allows them (colons included).
fn prefix() -> impl Strategy<Value = String> {
    prop_oneof!["tower-lease".prop_map(String::from), "[a-z:]{1,8}"]
}

/// Names of arbitrary bytes, weighted towards the bytes that matter to the layout.
fn name() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        4 => prop::sample::select(b"{}:wrfence".to_vec()),
        1 => any::<u8>(),
    ];
    prop_oneof![
        8 => prop::collection::vec(byte, 1..24),
        1 => prop::collection::vec(any::<u8>(), MAX_NAME_LEN..=MAX_NAME_LEN),
    ]
}

/// Small alphabets, so that distinct inputs often concatenate to look-alike strings.
fn tight() -> impl Strategy<Value = (KeyRole, String, Vec<u8>)> {
    (
        role(),
        "[ab!]{1,3}",
        prop::collection::vec(prop::sample::select(b"a}:{w".to_vec()), 1..8),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn every_key_decodes_to_what_built_it(
        prefix in prefix(), role in role(), namespace in namespace(), name in name()
    ) {
        let key = KeyLayout::new(prefix.clone()).key(role, &namespace, &name);
        prop_assert_eq!(decode(&key), Some((prefix, role, namespace, name)));
    }

    #[test]
    fn distinct_inputs_never_share_a_key(a in tight(), b in tight()) {
        let layout = KeyLayout::default();
        let key_a = layout.key(a.0, &a.1, &a.2);
        let key_b = layout.key(b.0, &b.1, &b.2);
        prop_assert_eq!(key_a == key_b, a == b, "{:?} and {:?}", a, b);
    }

    #[test]
    fn all_keys_of_a_name_share_one_hash_tag(namespace in namespace(), name in name()) {
        let layout = KeyLayout::default();
        let lock = layout.key(KeyRole::Lock, &namespace, &name);
        let tag = hash_tag(&lock).to_vec();
        prop_assert!(tag.starts_with(namespace.as_bytes()), "the tag holds the namespace");
        for role in ROLES {
            let key = layout.key(role, &namespace, &name);
            prop_assert_eq!(hash_tag(&key), &tag[..], "{:?}", role);
        }
    }
}
