//! A JSON body in a canonical form, for [`Fingerprint::Json`](crate::Fingerprint::Json):
//! two bodies that mean the same have the same form.
//!
//! The form: no whitespace between tokens; an object's members sorted by name (by code point,
//! as the names' UTF-8 bytes sort), members with one name kept in their order (a parser may
//! take the first or the last, so their order is part of the meaning); strings with their
//! escapes decoded and written again the one way (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`,
//! other controls as `\u00xx`, everything else as itself); numbers, `true`, `false` and `null`
//! as written. It is RFC 8785's (JCS) but for the numbers, which JCS writes as an IEEE double
//! would (`10.0` as `10`, and integers over 2⁵³ rounded): two numbers the handler may read
//! differently stay different. A body already in this form is its own form, so its
//! fingerprint is the one [`Fingerprint::Bytes`](crate::Fingerprint::Bytes) gives.
//!
//! The crate's own code, a recursive descent over the bytes: no dependency, and the form can
//! never change under the crate's feet (a `serde_json` built with `preserve_order` by another
//! crate in the same build would keep members in their order), which replicas that compare
//! fingerprints need.

/// How deeply arrays and objects may nest, as `serde_json` allows by default: the parser
/// recurses once per level.
const MAX_DEPTH: usize = 128;

/// The canonical form of `json`, or `None` if it is not one JSON value (RFC 8259, UTF-8,
/// without a byte order mark), surrounded by whitespace at most, nested at most
/// [`MAX_DEPTH`] deep.
pub(crate) fn canonical(json: &[u8]) -> Option<Vec<u8>> {
    let mut parser = Parser { input: json, at: 0 };
    let mut out = Vec::with_capacity(json.len());
    parser.whitespace();
    parser.value(&mut out, 0)?;
    parser.whitespace();
    (parser.at == json.len()).then_some(out)
}

struct Parser<'a> {
    input: &'a [u8],
    at: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.input.get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        self.at += usize::from(found);
        found
    }

    fn whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.at += 1;
        }
    }

    /// One value, at `depth` levels of arrays and objects.
    fn value(&mut self, out: &mut Vec<u8>, depth: usize) -> Option<()> {
        match self.peek()? {
            b'{' => self.object(out, depth + 1),
            b'[' => self.array(out, depth + 1),
            b'"' => {
                let string = self.string()?;
                write_string(out, &string);
                Some(())
            }
            b't' => self.literal(out, b"true"),
            b'f' => self.literal(out, b"false"),
            b'n' => self.literal(out, b"null"),
            b'-' | b'0'..=b'9' => self.number(out),
            _ => None,
        }
    }

    fn object(&mut self, out: &mut Vec<u8>, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.at += 1;
        self.whitespace();
        let mut members: Vec<(String, Vec<u8>)> = Vec::new();
        if !self.eat(b'}') {
            loop {
                if self.peek()? != b'"' {
                    return None;
                }
                let name = self.string()?;
                self.whitespace();
                if !self.eat(b':') {
                    return None;
                }
                self.whitespace();
                let mut value = Vec::new();
                self.value(&mut value, depth)?;
                members.push((name, value));
                self.whitespace();
                if self.eat(b'}') {
                    break;
                }
                if !self.eat(b',') {
                    return None;
                }
                self.whitespace();
            }
        }
        // Stable: members with one name keep their order.
        members.sort_by(|a, b| a.0.cmp(&b.0));
        out.push(b'{');
        for (i, (name, value)) in members.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_string(out, name);
            out.push(b':');
            out.extend_from_slice(value);
        }
        out.push(b'}');
        Some(())
    }

    fn array(&mut self, out: &mut Vec<u8>, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.at += 1;
        self.whitespace();
        out.push(b'[');
        if self.eat(b']') {
            out.push(b']');
            return Some(());
        }
        loop {
            self.value(out, depth)?;
            self.whitespace();
            if self.eat(b']') {
                out.push(b']');
                return Some(());
            }
            if !self.eat(b',') {
                return None;
            }
            out.push(b',');
            self.whitespace();
        }
    }

    fn literal(&mut self, out: &mut Vec<u8>, literal: &[u8]) -> Option<()> {
        if !self.input[self.at..].starts_with(literal) {
            return None;
        }
        self.at += literal.len();
        out.extend_from_slice(literal);
        Some(())
    }

    /// A number as written, once it follows the grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)?
    /// ([eE] [+-]? [0-9]+)?`.
    fn number(&mut self, out: &mut Vec<u8>) -> Option<()> {
        let start = self.at;
        self.eat(b'-');
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.eat(b'.') {
            self.first_digit()?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.at += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.at += 1;
            }
            self.first_digit()?;
        }
        out.extend_from_slice(&self.input[start..self.at]);
        Some(())
    }

    /// At least one digit.
    fn first_digit(&mut self) -> Option<()> {
        if !self.next()?.is_ascii_digit() {
            return None;
        }
        self.digits();
        Some(())
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.at += 1;
        }
    }

    /// A string's value, its escapes decoded: `None` for a control character, a bad escape,
    /// a lone surrogate or bytes that are not UTF-8.
    fn string(&mut self) -> Option<String> {
        self.at += 1;
        let mut bytes = Vec::new();
        loop {
            match self.next()? {
                b'"' => return String::from_utf8(bytes).ok(),
                b'\\' => {
                    let c = match self.next()? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.escaped_char()?,
                        _ => return None,
                    };
                    bytes.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                }
                0x00..=0x1F => return None,
                byte => bytes.push(byte),
            }
        }
    }

    /// The character of a `\u` escape (after the `u`), with the low half of a surrogate pair.
    fn escaped_char(&mut self) -> Option<char> {
        let high = self.hex4()?;
        let code = match high {
            0xD800..=0xDBFF => {
                if !(self.eat(b'\\') && self.eat(b'u')) {
                    return None;
                }
                let low = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return None;
                }
                0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
            }
            0xDC00..=0xDFFF => return None,
            _ => high,
        };
        char::from_u32(code)
    }

    fn hex4(&mut self) -> Option<u32> {
        let mut value = 0;
        for _ in 0..4 {
            let digit = char::from(self.next()?).to_digit(16)?;
            value = value * 16 + digit;
        }
        Some(value)
    }
}

/// `string` as a JSON string, escaped only where it must be.
fn write_string(out: &mut Vec<u8>, string: &str) {
    out.push(b'"');
    for c in string.chars() {
        match c {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\u{0}'..='\u{1f}' => {
                out.extend_from_slice(format!("\\u{:04x}", u32::from(c)).as_bytes());
            }
            c => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::canonical;

    fn form(json: &str) -> String {
        String::from_utf8(canonical(json.as_bytes()).expect(json)).unwrap()
    }

    #[test]
    fn whitespace_member_order_and_escapes_do_not_count() {
        let expected = r#"{"a":[1,{"x":null,"y":true}],"b":"Ada \"A\"","c":false}"#;
        for json in [
            expected,
            r#" { "c" : false , "b" : "Ada \"A\"" , "a" : [ 1 , { "y" : true , "x" : null } ] } "#,
            "{\n\t\"b\": \"\\u0041da \\u0022A\\\"\",\r\n\"a\":[1,{\"y\":true,\"x\":null}],\"c\":false}\n",
            r#"{"\u0063":false,"a":[1,{"x":null,"y":true}],"b":"Ada \"A\""}"#,
        ] {
            assert_eq!(form(json), expected, "{json}");
        }
    }

    #[test]
    fn what_counts_stays() {
        // Numbers as written, array order, members with one name in their order.
        assert_eq!(
            form("[10, 10.0, 1e1, 1E+1, -0, 0.5e-3]"),
            "[10,10.0,1e1,1E+1,-0,0.5e-3]"
        );
        assert_eq!(form(r#"{"a":1,"a":2}"#), r#"{"a":1,"a":2}"#);
        assert_eq!(form(r#"{"b":0,"a":2,"a":1}"#), r#"{"a":2,"a":1,"b":0}"#);
        assert_ne!(form("[1,2]"), form("[2,1]"));
        // Whitespace inside strings is the string's.
        assert_eq!(form(r#"" a b ""#), r#"" a b ""#);
    }

    #[test]
    fn strings_are_written_one_way() {
        assert_eq!(
            form(r#""\/\b\f\n\r\t\u0001\u001F""#),
            r#""/\b\f\n\r\t\u0001\u001f""#
        );
        assert_eq!(form(r#""\u00e9\u20AC\ud83d\ude00""#), "\"é€😀\"");
        assert_eq!(form("\"é€😀\""), "\"é€😀\"");
        // Sorted by code point, as their UTF-8 bytes sort.
        assert_eq!(form(r#"{"é":1,"z":2,"Z":3}"#), r#"{"Z":3,"z":2,"é":1}"#);
        assert_eq!(form("\"\\u007f\""), "\"\u{7f}\"");
    }

    #[test]
    fn scalars_and_empty_containers() {
        for json in [
            "true", "false", "null", "0", "-1.5E3", "\"\"", "{}", "[]", "[[]]",
        ] {
            assert_eq!(form(json), json);
        }
        assert_eq!(form(" { } "), "{}");
        assert_eq!(form("[ ]"), "[]");
    }

    #[test]
    fn what_is_not_json_has_no_form() {
        for json in [
            "",
            " ",
            "{",
            "}",
            "[1,]",
            "{\"a\":1,}",
            "{\"a\" 1}",
            "{a:1}",
            "[1 2]",
            "01",
            "1.",
            ".5",
            "1e",
            "+1",
            "-",
            "tru",
            "nul",
            "True",
            "\"a",
            "\"\\x\"",
            "\"\\u12\"",
            "\"\\ud800\"",
            "\"\\udc00\"",
            "\"\\ud800\\u0041\"",
            "\"\t\"",
            "1 2",
            "{} x",
            "\u{feff}{}",
            "'a'",
            "NaN",
        ] {
            assert_eq!(canonical(json.as_bytes()), None, "{json:?}");
        }
        assert_eq!(canonical(b"\"\xff\""), None, "not UTF-8");
        assert_eq!(canonical(b"amount=10&to=Ada"), None);
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(canonical(deep(128).as_bytes()).is_some());
        assert_eq!(canonical(deep(129).as_bytes()), None);
        let objects = |n: usize| format!("{}1{}", "{\"a\":".repeat(n), "}".repeat(n));
        assert!(canonical(objects(128).as_bytes()).is_some());
        assert_eq!(canonical(objects(129).as_bytes()), None);
        // A body of a million brackets does not overflow the stack.
        assert_eq!(canonical(deep(1 << 20).as_bytes()), None);
    }
}
