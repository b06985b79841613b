//! Bad input is a clear error, never a panic; odd but valid names just work.

use std::time::Duration;

use tower_lease::backend::{Begin, FINGERPRINT_LEN, LeaseRef, LockRef, Mode, Secret};
use tower_lease::{Error, Lock, MAX_NAME_LEN, RwLock, Semaphore};

use crate::Env;

const JOBS: Lock<[u8]> = Lock::new("jobs", Duration::from_secs(10));
const SHARED: RwLock<[u8]> = RwLock::new("jobs", Duration::from_secs(10));
const SLOTS: Semaphore<[u8]> = Semaphore::new("jobs", 1, Duration::from_secs(10));

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

/// The kinds of lock are independent on one name: a `Lock`, an `RwLock` (its writer, then its
/// readers), a one-permit `Semaphore` and an idempotency key of the same namespace and name
/// each get in while the others are held, in one order and then the reverse, and each release
/// answers `true`. The idempotency key is left out on a backend without idempotency keys (its
/// `idempotency_begin` answers an error; the `idempotency` scenarios fail it).
pub async fn kinds_on_one_name_are_independent(env: Env) {
    let name = b"one-name";
    let backend = env.backend();
    let key = Secret::random();
    let lock_ref = LockRef::new("jobs", name, Duration::from_secs(10));
    let reservation = LeaseRef::new(lock_ref, Mode::Reservation, &key);
    let reserve = || async {
        match backend
            .idempotency_begin(reservation, &[7; FINGERPRINT_LEN])
            .await
        {
            Ok(begin) => {
                assert!(
                    matches!(begin, Begin::Reserved { .. }),
                    "the key is free: {begin:?}"
                );
                true
            }
            Err(_) => false,
        }
    };
    for writer_first in [true, false] {
        let order = match writer_first {
            true => "key, writer, permit, Lock",
            false => "Lock, reader, permit, key",
        };
        let (mut lock, mut reserved) = (None, false);
        match writer_first {
            true => reserved = reserve().await,
            false => lock = JOBS.try_lock(&env.store, name).await.unwrap(),
        }
        let (write, read) = match writer_first {
            true => (SHARED.try_write(&env.store, name).await.unwrap(), None),
            false => (None, SHARED.try_read(&env.store, name).await.unwrap()),
        };
        assert!(
            write.is_some() || read.is_some(),
            "{order}: the RwLock is refused by another kind"
        );
        let permit = SLOTS.try_acquire(&env.store, name).await.unwrap();
        let permit = permit.unwrap_or_else(|| panic!("{order}: a permit is refused"));
        match writer_first {
            true => lock = JOBS.try_lock(&env.store, name).await.unwrap(),
            false => reserved = reserve().await,
        }
        let lock = lock.unwrap_or_else(|| panic!("{order}: the Lock is refused"));
        let in_use = SLOTS.in_use(&env.store, name).await.unwrap();
        assert_eq!(in_use, 1, "{order}: one permit in use");
        assert!(lock.release().await.unwrap(), "{order}: the Lock released");
        if let Some(write) = write {
            assert!(
                write.release().await.unwrap(),
                "{order}: the writer released"
            );
        }
        if let Some(read) = read {
            assert!(
                read.release().await.unwrap(),
                "{order}: the reader released"
            );
        }
        assert!(
            permit.release().await.unwrap(),
            "{order}: the permit released"
        );
        if reserved {
            let freed = backend.idempotency_free(reservation).await.unwrap();
            assert!(freed, "{order}: the reservation freed");
        }
    }
}
