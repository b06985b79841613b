//! What a completed request leaves for its retries: its status, the headers worth replaying
//! and its body (or a marker that it completed without them), in a compact binary form the
//! store keeps as opaque bytes (here); storing it before the response goes out ([`complete`]),
//! then in the background ([`background`]); the in-process copy of completed records
//! ([`cache`]).

pub(super) mod background;
pub(super) mod cache;
pub(super) mod complete;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, StatusCode};

/// The first byte of every record: a later layout gets another, and a replica that does not
/// know it answers `503` rather than replaying garbage.
const VERSION: u8 = 1;

const COMPLETE: u8 = 0;
const NOT_STORED: u8 = 1;

/// A stored response.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Record {
    /// The whole response: status, the replayed headers, body.
    Response {
        status: StatusCode,
        headers: HeaderMap,
        body: Bytes,
    },
    /// The request completed with `status`, but its response was not kept.
    NotStored { status: StatusCode },
}

/// Whether `name` is replayed: not a hop-by-hop header (RFC 9110 §7.6.1, and those the
/// response's `Connection` lists), not `Set-Cookie` (a session cookie handed out twice is
/// a session shared by two clients).
fn replayed(name: &HeaderName, connection: &[HeaderValue]) -> bool {
    const HOP_BY_HOP: [&str; 9] = [
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    ];
    if *name == header::SET_COOKIE || HOP_BY_HOP.contains(&name.as_str()) {
        return false;
    }
    !connection.iter().any(|listed| {
        let listed = listed.to_str().unwrap_or("");
        listed
            .split(',')
            .any(|token| token.trim().eq_ignore_ascii_case(name.as_str()))
    })
}

/// Encodes a complete response.
pub(crate) fn encode(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Bytes {
    // Most responses list nothing in `Connection`; the listed names are read only if any.
    let connection: &[HeaderValue] = match headers.get(header::CONNECTION) {
        None => &[],
        Some(_) => &headers
            .get_all(header::CONNECTION)
            .iter()
            .cloned()
            .collect::<Vec<_>>(),
    };
    // Walked twice, for the length and then the bytes, rather than collected.
    let kept = || {
        headers
            .iter()
            .filter(|(name, _)| replayed(name, connection))
    };
    let (count, len) = kept().fold((0, 6), |(count, len), (n, v)| {
        (count + 1, len + 6 + n.as_str().len() + v.len())
    });
    let mut out = BytesMut::with_capacity(len + body.len());
    out.put_u8(VERSION);
    out.put_u8(COMPLETE);
    out.put_u16(status.as_u16());
    out.put_u16(count as u16);
    for (name, value) in kept() {
        out.put_u16(name.as_str().len() as u16);
        out.put_slice(name.as_str().as_bytes());
        out.put_u32(value.len() as u32);
        out.put_slice(value.as_bytes());
    }
    out.put_slice(body);
    out.freeze()
}

/// Encodes the marker of a request that completed with `status` and whose response was not
/// kept.
pub(crate) fn encode_not_stored(status: StatusCode) -> Bytes {
    let [high, low] = status.as_u16().to_be_bytes();
    Bytes::from(vec![VERSION, NOT_STORED, high, low])
}

/// Decodes a record; `None` for one this version cannot read.
pub(crate) fn decode(bytes: Bytes) -> Option<Record> {
    let mut at = Reader { bytes, at: 0 };
    if at.take(1)?[0] != VERSION {
        return None;
    }
    let kind = at.take(1)?[0];
    let status = StatusCode::from_u16(at.u16()?).ok()?;
    match kind {
        NOT_STORED => return Some(Record::NotStored { status }),
        COMPLETE => {}
        _ => return None,
    }
    let count = at.u16()?;
    // Room for the `Idempotent-Replayed` header the replay adds, without growing the map.
    let mut headers = HeaderMap::with_capacity(count as usize + 1);
    for _ in 0..count {
        let len = at.u16()? as usize;
        let name = HeaderName::from_bytes(&at.take(len)?).ok()?;
        let len = at.u32()? as usize;
        let value = HeaderValue::from_maybe_shared(at.take(len)?).ok()?;
        headers.append(name, value);
    }
    let body = at.bytes.slice(at.at..);
    Some(Record::Response {
        status,
        headers,
        body,
    })
}

struct Reader {
    bytes: Bytes,
    at: usize,
}

impl Reader {
    fn take(&mut self, len: usize) -> Option<Bytes> {
        let end = self
            .at
            .checked_add(len)
            .filter(|&end| end <= self.bytes.len())?;
        let taken = self.bytes.slice(self.at..end);
        self.at = end;
        Some(taken)
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?[..].try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?[..].try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_round_trips_without_hop_by_hop_headers_or_cookies() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.append("x-receipt", HeaderValue::from_static("r1"));
        headers.append("x-receipt", HeaderValue::from_static("r2"));
        headers.insert("set-cookie", HeaderValue::from_static("session=secret"));
        headers.insert("connection", HeaderValue::from_static("x-private"));
        headers.insert("x-private", HeaderValue::from_static("hop"));
        headers.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        let encoded = encode(StatusCode::CREATED, &headers, b"{\"ok\":true}");
        let Some(Record::Response {
            status,
            headers: replayed,
            body,
        }) = decode(encoded)
        else {
            panic!("not a response");
        };
        assert_eq!(status, StatusCode::CREATED);
        assert_eq!(body, "{\"ok\":true}");
        let names: Vec<_> = replayed.keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["content-type", "x-receipt"]);
        assert_eq!(replayed.get_all("x-receipt").iter().count(), 2);
    }

    #[test]
    fn markers_round_trip_and_garbage_is_refused() {
        let marker = encode_not_stored(StatusCode::OK);
        let status = StatusCode::OK;
        assert_eq!(decode(marker), Some(Record::NotStored { status }));
        assert_eq!(decode(Bytes::from_static(b"")), None);
        assert_eq!(decode(Bytes::from_static(&[2, 0, 0, 200])), None);
        assert_eq!(decode(Bytes::from_static(&[1, 0, 0, 200, 0, 5, 0])), None);
    }
}
