//! [`OwnedName`]: a lock name as a held lease keeps it.

use std::borrow::Cow;
use std::fmt;

/// The longest name kept in place: with its length, as large as the boxed form plus 8 bytes.
const INLINE: usize = 22;

/// A lock name as a held lease keeps it: in place when it is short, as most names are (ids,
/// slugs, numbers), so that neither taking the lease nor holding it costs an allocation for
/// the name; boxed when it is longer.
#[derive(Clone)]
pub(crate) enum OwnedName {
    Inline { len: u8, bytes: [u8; INLINE] },
    Boxed(Box<[u8]>),
}

impl OwnedName {
    /// A copy of `name`.
    pub(crate) fn new(name: &[u8]) -> Self {
        match name.len() {
            len @ 0..=INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..len].copy_from_slice(name);
                OwnedName::Inline {
                    len: len as u8,
                    bytes,
                }
            }
            _ => OwnedName::Boxed(name.into()),
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            OwnedName::Inline { len, bytes } => &bytes[..usize::from(*len)],
            OwnedName::Boxed(name) => name,
        }
    }

    /// The name, boxed.
    pub(crate) fn into_boxed(self) -> Box<[u8]> {
        match self {
            OwnedName::Inline { .. } => self.as_bytes().into(),
            OwnedName::Boxed(name) => name,
        }
    }
}

impl AsRef<[u8]> for OwnedName {
    fn as_ref(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl From<Cow<'_, [u8]>> for OwnedName {
    /// A long name already owned is kept without a copy.
    fn from(name: Cow<'_, [u8]>) -> Self {
        match name {
            Cow::Owned(name) if name.len() > INLINE => OwnedName::Boxed(name.into_boxed_slice()),
            name => OwnedName::new(&name),
        }
    }
}

impl fmt::Debug for OwnedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&String::from_utf8_lossy(self.as_bytes()), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_stay_in_place_and_long_ones_are_boxed_unchanged() {
        for len in [1, 2, INLINE - 1, INLINE, INLINE + 1, 1024] {
            let name: Vec<u8> = (0..len).map(|i| (i * 7 % 256) as u8).collect();
            let owned = OwnedName::new(&name);
            assert_eq!(owned.as_bytes(), &name[..]);
            assert_eq!(matches!(owned, OwnedName::Inline { .. }), len <= INLINE);
            assert_eq!(&*owned.clone().into_boxed(), &name[..]);
            let from_vec = OwnedName::from(Cow::Owned(name.clone()));
            assert_eq!(from_vec.as_bytes(), &name[..]);
            assert_eq!(
                OwnedName::from(Cow::Borrowed(&name[..])).as_bytes(),
                &name[..]
            );
        }
        assert_eq!(size_of::<OwnedName>(), size_of::<Box<[u8]>>() + 8);
    }
}
