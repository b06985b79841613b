//! The rules a lock name taken from a request must meet, checked in one place: by the service,
//! before the store is asked.

use crate::name::check_name;

/// What is wrong with a name taken from a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NameDefect {
    /// Empty, or longer than [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes.
    Length(usize),
    NotUtf8,
    Control,
    Brace,
}

impl NameDefect {
    /// The defect of `name`, if any. Every name must fit the store; unless `binary` is set, it
    /// must also be text (see [`binary_names`](crate::LockLayer::binary_names)).
    pub(crate) fn of(name: &[u8], binary: bool) -> Option<NameDefect> {
        if check_name(name).is_err() {
            return Some(NameDefect::Length(name.len()));
        }
        if binary {
            return None;
        }
        let Ok(text) = std::str::from_utf8(name) else {
            return Some(NameDefect::NotUtf8);
        };
        if text.chars().any(char::is_control) {
            return Some(NameDefect::Control);
        }
        if text.contains(['{', '}']) {
            return Some(NameDefect::Brace);
        }
        None
    }

    pub(crate) fn what(self) -> &'static str {
        match self {
            NameDefect::Length(_) => "has the wrong length",
            NameDefect::NotUtf8 => "is not valid UTF-8",
            NameDefect::Control => "holds a control character",
            NameDefect::Brace => "holds a brace",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_names_refuse_what_only_binary_names_accept() {
        let long = vec![b'a'; crate::MAX_NAME_LEN + 1];
        for binary in [false, true] {
            assert_eq!(NameDefect::of(b"", binary), Some(NameDefect::Length(0)));
            assert_eq!(
                NameDefect::of(&long, binary),
                Some(NameDefect::Length(1025))
            );
            assert_eq!(NameDefect::of("café-42:x/y".as_bytes(), binary), None);
        }
        for (name, defect) in [
            (&b"\xff"[..], NameDefect::NotUtf8),
            (b"a\0b", NameDefect::Control),
            (b"a\nb", NameDefect::Control),
            ("a\u{85}".as_bytes(), NameDefect::Control),
            (b"{a}", NameDefect::Brace),
            (b"a}", NameDefect::Brace),
        ] {
            assert_eq!(NameDefect::of(name, false), Some(defect), "{name:?}");
            assert_eq!(NameDefect::of(name, true), None, "{name:?}");
        }
    }
}
