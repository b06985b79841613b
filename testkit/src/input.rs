//! Bad input is a clear error, never a panic; odd but valid names just work.

use std::time::Duration;

use tower_lease::{Error, Lock, MAX_NAME_LEN, RwLock};

use crate::Env;

const JOBS: Lock<[u8]> = Lock::new("jobs", Duration::from_secs(10));
const SHARED: RwLock<[u8]> = RwLock::new("jobs", Duration::from_secs(10));

fn assert_invalid_name<T: std::fmt::Debug>(result: Result<T, Error>, len: usize) {
    match result {
        Err(error @ Error::InvalidName { len: reported }) => {
            assert_eq!(reported, len);
            assert!(
                error.to_string().contains("1 to 1024 bytes"),
                "unclear message: {error}"
            );
        }
        other => panic!("a {len}-byte name must be Error::InvalidName, got {other:?}"),
    }
}

/// An empty name and one over [`MAX_NAME_LEN`] bytes are `Error::InvalidName` (with a clear
/// message) for locks, readers and writers; 1 and `MAX_NAME_LEN` bytes are valid.
pub async fn names_out_of_range_are_errors(env: Env) {
    let too_long = vec![b'x'; MAX_NAME_LEN + 1];
    for name in [&b""[..], &too_long[..]] {
        assert_invalid_name(JOBS.try_lock(&env.store, name).await, name.len());
        assert_invalid_name(SHARED.try_read(&env.store, name).await, name.len());
        assert_invalid_name(SHARED.try_write(&env.store, name).await, name.len());
    }
    let longest = vec![b'x'; MAX_NAME_LEN];
    let token = JOBS.try_lock(&env.store, &longest).await.unwrap();
    assert!(
        token
            .expect("a 1024-byte name is valid")
            .release()
            .await
            .unwrap()
    );
    let one = JOBS.try_lock(&env.store, b"x").await.unwrap();
    assert!(
        one.expect("a 1-byte name is valid")
            .release()
            .await
            .unwrap()
    );
}

/// Names that look like key syntax, NUL and non-UTF-8 are ordinary names: each locks on its own.
pub async fn binary_names_lock_independently(env: Env) {
    let names: [&[u8]; 10] = [
        b"a",
        b"a:b",
        b"a}:w",
        b"a}",
        b"{a}",
        b"}{",
        b"a\0b",
        b"a\0",
        b"\xff\xfe",
        b"invoice:{42}:fence",
    ];
    let (mut locks, mut writers) = (Vec::new(), Vec::new());
    for name in names {
        let token = JOBS.try_lock(&env.store, name).await.unwrap();
        locks.push(token.unwrap_or_else(|| panic!("{name:?} collided with another name")));
        let writer = SHARED.try_write(&env.store, name).await.unwrap();
        writers
            .push(writer.unwrap_or_else(|| panic!("rwlock {name:?} collided with another name")));
    }
    for name in names {
        assert!(
            JOBS.try_lock(&env.store, name).await.unwrap().is_none(),
            "{name:?} was lost"
        );
    }
    for token in locks {
        assert!(token.release().await.unwrap());
    }
    for token in writers {
        assert!(token.release().await.unwrap());
    }
}
