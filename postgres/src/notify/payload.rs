//! The payload of a notification on the channel `tower_lease`, as `tower_lease.notify` (in
//! `sql/schema.sql`) writes it: the kind, the namespace and the name in hex, split by `:`
//! (a namespace holds no `:`), or the kind and `*` when that would not fit NOTIFY's 8000
//! bytes.

use tower_lease::backend::{Mode, NotificationSink};

/// What one notification says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    /// A lease of the lock of this mode ended, or a write intent was withdrawn.
    Released(Mode, String, Vec<u8>),
    /// A writer of a writer-preferred `RwLock` waits.
    WriteIntent(String, Vec<u8>),
    /// A notification whose name did not fit: every waiter tries again.
    Unnamed,
}

impl Heard {
    /// Reads a payload; `None` for one this version does not know.
    pub(crate) fn parse(payload: &str) -> Option<Heard> {
        let mut parts = payload.splitn(3, ':');
        let kind = parts.next()?;
        let namespace = parts.next()?;
        if namespace == "*" {
            return Some(Heard::Unnamed);
        }
        let name = hex(parts.next()?)?;
        let mode = match kind {
            "e" => Mode::Exclusive,
            "r" => Mode::Read,
            "w" => Mode::Write,
            "p" => Mode::Permit,
            "v" => Mode::Reservation,
            "i" => return Some(Heard::WriteIntent(namespace.to_owned(), name)),
            _ => return None,
        };
        Some(Heard::Released(mode, namespace.to_owned(), name))
    }

    /// Hands it to the store's waiters.
    pub(crate) fn deliver(self, sink: &NotificationSink) {
        match self {
            Heard::Released(mode, namespace, name) => sink.released(mode, &namespace, &name),
            Heard::WriteIntent(namespace, name) => sink.write_intent(&namespace, &name),
            Heard::Unnamed => sink.missed(),
        }
    }
}

fn hex(text: &str) -> Option<Vec<u8>> {
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let text = text.as_bytes();
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.chunks(2)
        .map(|pair| Some(digit(pair[0])? << 4 | digit(pair[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_read_as_the_functions_write_them() {
        assert_eq!(
            Heard::parse("e:invoice:3432"),
            Some(Heard::Released(
                Mode::Exclusive,
                "invoice".into(),
                b"42".to_vec()
            ))
        );
        assert_eq!(
            Heard::parse("i:docs:00ff"),
            Some(Heard::WriteIntent("docs".into(), vec![0, 255]))
        );
        assert_eq!(Heard::parse("p:*"), Some(Heard::Unnamed));
        assert_eq!(Heard::parse("x:ns:00"), None);
        assert_eq!(Heard::parse("e:ns:0"), None);
        assert_eq!(Heard::parse("e:ns:zz"), None);
    }
}
