//! The fingerprint of a request: what a retry must repeat to get the first one's response.

use http::request::Parts;

use crate::backend::FINGERPRINT_LEN;

/// How [`IdempotencyLayer`](crate::IdempotencyLayer) reads a request body into its fingerprint,
/// the part of a request a retry must repeat to be answered with the first one's response
/// (set with [`IdempotencyLayer::fingerprint`](crate::IdempotencyLayer::fingerprint)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fingerprint {
    /// Every byte of the body counts (the default): a retry must send the very same bytes.
    #[default]
    Bytes,
    /// A JSON body counts by its meaning: whitespace between tokens, the order of an object's
    /// members and the spelling of a string's escapes (`"\u0041"` is `"A"`) do not count.
    /// Numbers count as written (`10`, `10.0` and `1e1` differ, as they may to the handler),
    /// and so does the order of array items and of an object's members with one name. A body
    /// that is not JSON (a form, malformed JSON, more than 128 levels of nesting) and an empty
    /// one count by their bytes, as under [`Bytes`](Self::Bytes): the handler gets it as sent
    /// and answers it as it would. The handler always gets the body's bytes as sent.
    Json,
}

/// A 128-bit hash of the method, the path with query, and the whole body (under
/// [`Fingerprint::Json`], a JSON body's [canonical form](super::json)), each length-delimited
/// so no two requests' inputs run together.
///
/// It is not cryptographic (the crate takes no hash dependency): two lanes of a 64-bit
/// multiply-rotate hash over little-endian words, finished with MurmurHash3's `fmix64`. It is
/// stable across Rust versions and platforms, as replicas of a rolling deployment need. A
/// collision only matters within one key, between two requests the same client sent with it:
/// by chance about 2⁻¹²⁸, and made on purpose it only replays the client's own response to
/// itself.
///
/// A canonical form is valid JSON and a body without one is not, so a JSON body and one that
/// is not never share their hashed bytes; and a body already in canonical form hashes as
/// under [`Fingerprint::Bytes`].
pub(crate) fn fingerprint(parts: &Parts, body: &[u8], how: Fingerprint) -> [u8; FINGERPRINT_LEN] {
    let mut hasher = Hasher::default();
    hasher.field(parts.method.as_str().as_bytes());
    let path = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    hasher.field(path.as_bytes());
    let canonical = match how {
        Fingerprint::Json if !body.is_empty() => super::json::canonical(body),
        _ => None,
    };
    hasher.field(canonical.as_deref().unwrap_or(body));
    hasher.finish()
}

const P1: u64 = 0x9E37_79B9_7F4A_7C15;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;

struct Hasher {
    a: u64,
    b: u64,
}

impl Default for Hasher {
    fn default() -> Self {
        Self {
            a: 0x243F_6A88_85A3_08D3,
            b: 0x1319_8A2E_0370_7344,
        }
    }
}

impl Hasher {
    fn word(&mut self, word: u64) {
        self.a = (self.a ^ word).wrapping_mul(P1).rotate_left(31);
        self.b = (self.b ^ word.rotate_left(17))
            .wrapping_mul(P2)
            .rotate_left(29)
            ^ self.a;
    }

    fn field(&mut self, bytes: &[u8]) {
        self.word(bytes.len() as u64);
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            self.word(u64::from_le_bytes(word.try_into().expect("8 bytes")));
        }
        let mut last = [0; 8];
        let rest = words.remainder();
        last[..rest.len()].copy_from_slice(rest);
        self.word(u64::from_le_bytes(last));
    }

    fn finish(self) -> [u8; FINGERPRINT_LEN] {
        let a = fmix64(self.a ^ self.b.rotate_left(7));
        let b = fmix64(self.b ^ a);
        let mut out = [0; FINGERPRINT_LEN];
        out[..8].copy_from_slice(&a.to_le_bytes());
        out[8..].copy_from_slice(&b.to_le_bytes());
        out
    }
}

fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    k ^= k >> 33;
    k = k.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    k ^ (k >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(method: &str, uri: &str, body: &[u8]) -> [u8; FINGERPRINT_LEN] {
        let req = http::Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .unwrap();
        fingerprint(&req.into_parts().0, body, Fingerprint::Bytes)
    }

    fn json(body: &str) -> [u8; FINGERPRINT_LEN] {
        let req = http::Request::post("/pay").body(()).unwrap();
        fingerprint(&req.into_parts().0, body.as_bytes(), Fingerprint::Json)
    }

    #[test]
    fn under_json_a_body_counts_by_its_meaning() {
        assert_eq!(json(r#"{"a": 1, "b": [2]}"#), json(r#"{"b":[ 2 ],"a":1}"#));
        assert_ne!(json(r#"{"a": 1}"#), json(r#"{"a": 1.0}"#));
        // A canonical body hashes as its bytes; one that is not JSON, by its bytes.
        assert_eq!(json(r#"{"a":1}"#), of("POST", "/pay", br#"{"a":1}"#));
        assert_eq!(json("a=1"), of("POST", "/pay", b"a=1"));
        assert_eq!(json(""), of("POST", "/pay", b""));
        assert_ne!(json(" {}"), of("POST", "/pay", b" {}"));
    }

    #[test]
    fn every_part_of_the_request_counts() {
        let base = of("POST", "/pay?x=1", b"amount=5");
        assert_eq!(base, of("POST", "/pay?x=1", b"amount=5"));
        assert_ne!(base, of("PUT", "/pay?x=1", b"amount=5"));
        assert_ne!(base, of("POST", "/pay?x=2", b"amount=5"));
        assert_ne!(base, of("POST", "/pay", b"amount=5"));
        assert_ne!(base, of("POST", "/pay?x=1", b"amount=6"));
        assert_ne!(base, of("POST", "/pay?x=1", b"amount=5\0"));
        // Fields are delimited: bytes cannot move from one to the next.
        assert_ne!(of("POST", "/a", b"b"), of("POST", "/ab", b""));
    }

    #[test]
    fn the_hash_is_stable() {
        // Replicas built by other compilers must agree: this value never changes.
        assert_eq!(json(" { } "), of("POST", "/pay", b"{}"));
        let hex: String = of("POST", "/pay", b"{}")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(hex.len(), 32);
        assert_eq!(hex, STABLE);
    }

    const STABLE: &str = "bd9393d345be091c39cc54e3a0158bbb";
}
