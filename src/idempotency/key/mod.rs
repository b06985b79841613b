//! The idempotency key: the `Idempotency-Key` header and the store name a key gets within its
//! scope (here), the handler's [`IdempotencyKey`](extension::IdempotencyKey) and the request's
//! [`fingerprint`](fingerprint::fingerprint), with a JSON body's canonical form
//! ([`json`]).

pub(super) mod extension;
pub(crate) mod fingerprint;
pub(super) mod json;

use std::borrow::Cow;

use http::HeaderValue;

/// The longest key, in characters of its content.
pub(crate) const MAX_KEY_LEN: usize = 255;

/// The content of an `Idempotency-Key` header: a structured-field string (`"8e03978e-…"`, with
/// `\"` and `\\` escapes) or a bare token (`8e03978e-…`), whose content is 1 to
/// [`MAX_KEY_LEN`] printable ASCII characters. Both spellings of one content name one key.
pub(crate) fn parse(value: &HeaderValue) -> Option<Cow<'_, [u8]>> {
    let bytes = trim(value.as_bytes());
    let content = match bytes.first()? {
        b'"' => Cow::Owned(unquote(bytes)?),
        // A bare key is its own content: borrowed from the header, not copied.
        _ if is_token(bytes) => Cow::Borrowed(bytes),
        _ => return None,
    };
    (1..=MAX_KEY_LEN)
        .contains(&content.len())
        .then_some(content)
}

/// RFC 8941 §4.2 allows surrounding spaces; the header machinery has already dropped tabs.
fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|&b| b != b' ').unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|&b| b != b' ')
        .map_or(start, |end| end + 1);
    &bytes[start..end]
}

/// An sf-string (RFC 8941 §3.3.3): `"` printable ASCII with `\"` and `\\` escapes `"`.
fn unquote(bytes: &[u8]) -> Option<Vec<u8>> {
    let inner = bytes.strip_prefix(b"\"")?.strip_suffix(b"\"")?;
    let mut content = Vec::with_capacity(inner.len());
    let mut chars = inner.iter();
    while let Some(&c) = chars.next() {
        match c {
            b'\\' => match chars.next()? {
                &escaped @ (b'"' | b'\\') => content.push(escaped),
                _ => return None,
            },
            b'"' => return None,
            b' '..=b'~' => content.push(c),
            _ => return None,
        }
    }
    Some(content)
}

/// A bare key: the characters of an sf-token (RFC 8941 §3.3.4: tchars, `:` and `/`), whatever
/// it starts with. A strict sf-token starts with a letter or `*`; accepting a digit first lets
/// the bare UUIDs most clients send through.
fn is_token(bytes: &[u8]) -> bool {
    let tchar = |c: &u8| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~:/".contains(c);
    !bytes.is_empty() && bytes.iter().all(tchar)
}

/// The store name of `key` within `scope`: the scope with `\` and `:` escaped, a `:`, then the
/// key. The first unescaped `:` ends the scope, so no two (scope, key) pairs share a name.
pub(crate) fn name(scope: &[u8], key: &[u8]) -> Vec<u8> {
    let mut name = Vec::with_capacity(scope.len() + key.len() + 1);
    for &b in scope {
        if matches!(b, b'\\' | b':') {
            name.push(b'\\');
        }
        name.push(b);
    }
    name.push(b':');
    name.extend_from_slice(key);
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key of a header as it arrives: its bytes, opaque ones (`é`) among them.
    fn key(header: &str) -> Option<String> {
        let value = HeaderValue::from_bytes(header.as_bytes()).unwrap();
        parse(&value).map(|key| String::from_utf8(key.into_owned()).unwrap())
    }

    #[test]
    fn quoted_and_bare_keys_name_the_same_key() {
        assert_eq!(key("\"8e03978e-40d5\"").as_deref(), Some("8e03978e-40d5"));
        assert_eq!(key("8e03978e-40d5").as_deref(), Some("8e03978e-40d5"));
        assert_eq!(key("order/42:a").as_deref(), Some("order/42:a"));
        assert_eq!(key(" \"k\" ").as_deref(), Some("k"));
        assert_eq!(
            key(r#""a \"quoted\" \\ key""#).as_deref(),
            Some(r#"a "quoted" \ key"#)
        );
    }

    #[test]
    fn malformed_keys_are_refused() {
        for bad in [
            "",
            "\"\"",
            "\"open",
            "a b",
            "\"bad \\n escape\"",
            "k\"",
            "\"a\"b\"",
            "é",
        ] {
            assert_eq!(key(bad), None, "{bad:?}");
        }
        assert!(key(&format!("\"{}\"", "k".repeat(255))).is_some());
        assert_eq!(key(&format!("\"{}\"", "k".repeat(256))), None);
        assert_eq!(key(&"k".repeat(256)), None);
    }

    #[test]
    fn names_are_injective_in_scope_and_key() {
        let pairs: [(&[u8], &[u8]); 6] = [
            (b"a", b"b:c"),
            (b"a:b", b"c"),
            (b"a\\", b"b"),
            (b"a", b"\\:b"),
            (b"", b"a:b"),
            (b"a\\:b", b"c"),
        ];
        let names: std::collections::HashSet<_> = pairs.iter().map(|(s, k)| name(s, k)).collect();
        assert_eq!(names.len(), pairs.len());
        assert_eq!(name(b"", b"k"), b":k");
        assert_eq!(name(b"t:1", b"k"), b"t\\:1:k");
    }
}
