//! What a lock is taken on: [`LockName`] and the length rule every name meets; a held lease's
//! copy of its name ([`owned`]); the rules a name taken from a request meets ([`from_request`]).

use std::borrow::Cow;

pub(crate) mod from_request;
pub(crate) mod owned;

use crate::{Error, Result};

/// The longest lock name, in bytes.
pub const MAX_NAME_LEN: usize = 1024;

/// A type whose values name locks: it encodes itself as 1 to [`MAX_NAME_LEN`] bytes.
///
/// Names are binary-safe: any bytes are allowed, including `:`, braces, NUL and non-UTF-8.
/// Integers are encoded as their decimal digits, so `Lock<u64>` and `Lock<str>` with the same
/// namespace share the name `42`.
pub trait LockName {
    /// The bytes of this name.
    fn lock_name(&self) -> Cow<'_, [u8]>;
}

impl LockName for str {
    fn lock_name(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.as_bytes())
    }
}

impl LockName for [u8] {
    fn lock_name(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self)
    }
}

impl<const LEN: usize> LockName for [u8; LEN] {
    fn lock_name(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self)
    }
}

impl LockName for String {
    fn lock_name(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self.as_bytes())
    }
}

impl LockName for Vec<u8> {
    fn lock_name(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self)
    }
}

impl LockName for bytes::Bytes {
    fn lock_name(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(self)
    }
}

impl<T: LockName + ?Sized> LockName for &T {
    fn lock_name(&self) -> Cow<'_, [u8]> {
        (**self).lock_name()
    }
}

impl<T: LockName + ?Sized> LockName for Box<T> {
    fn lock_name(&self) -> Cow<'_, [u8]> {
        (**self).lock_name()
    }
}

impl<T: LockName + ?Sized> LockName for std::sync::Arc<T> {
    fn lock_name(&self) -> Cow<'_, [u8]> {
        (**self).lock_name()
    }
}

macro_rules! integer_names {
    ($($int:ty)*) => {$(
        impl LockName for $int {
            fn lock_name(&self) -> Cow<'_, [u8]> {
                Cow::Owned(self.to_string().into_bytes())
            }
        }
    )*};
}

integer_names!(u8 u16 u32 u64 u128 usize i8 i16 i32 i64 i128 isize);

/// Checks the length rule every name must satisfy.
pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(Error::InvalidName { len: name.len() });
    }
    Ok(())
}
