//! Where a request's lock name comes from: [`ExtractName`], and the extractors for the usual
//! cases.
//!
//! Any closure `Fn(&Request<B>) -> Option<N>` is an extractor, for an owned name type `N`
//! (`String`, `Vec<u8>`, `Bytes`, an integer, …). The helpers here cover the usual cases:
//!
//! ```
//! use http::Request;
//! use tower_lease::extract::{self, ExtractName};
//!
//! let req = Request::post("/invoices/in%2F42/finalize")
//!     .header("x-tenant", "acme")
//!     .body(())
//!     .unwrap();
//!
//! assert_eq!(extract::path_segment(1).extract(&req), Some(b"in/42".to_vec()));
//! assert_eq!(extract::path_segment(9).extract(&req), None);
//! assert_eq!(extract::path().extract(&req), Some(b"/invoices/in/42/finalize".to_vec()));
//! assert_eq!(extract::header("x-tenant").extract(&req).as_deref(), Some(&b"acme"[..]));
//! assert_eq!(extract::constant("nightly").extract(&req), Some("nightly"));
//!
//! // A closure: lock per tenant, and leave requests without the header unlocked.
//! let per_tenant = |req: &Request<()>| {
//!     req.headers().get("x-tenant").map(|v| v.as_bytes().to_vec())
//! };
//! assert_eq!(per_tenant.extract(&req), Some(b"acme".to_vec()));
//! ```

use std::fmt;

use bytes::Bytes;
use http::Request;
use http::header::HeaderName;
use percent_encoding::percent_decode_str;

use crate::LockName;

pub(crate) use crate::name::from_request::NameDefect;

/// Picks the lock name for a request.
///
/// `None` means the request is not locked: it passes straight through to the inner service. A
/// name that is empty or longer than [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes is answered
/// with `400 Bad Request`, and so, unless the layer takes
/// [`binary_names`](crate::LockLayer::binary_names), is one that is not UTF-8 text or holds a
/// control character or a brace.
///
/// Implemented for every `Fn(&Request<B>) -> Option<N> + Clone + Send + Sync + 'static`.
pub trait ExtractName<B> {
    /// The name type, owned so the lease can outlive the borrow of the request.
    type Name: LockName;

    /// The lock name for `req`, or `None` to leave it unlocked.
    fn extract(&self, req: &Request<B>) -> Option<Self::Name>;

    /// The bytes of [`extract`](Self::extract)'s name handed to `f`, or `None` to leave the
    /// request unlocked: what the layers call, as they keep a copy of their own. An extractor
    /// that can lend the bytes from the request itself (as [`path_segment`] does for a segment
    /// with nothing to decode) overrides it, so no owned name is made only to be copied.
    fn with_name<T>(&self, req: &Request<B>, f: impl FnOnce(&[u8]) -> T) -> Option<T> {
        self.extract(req).map(|name| f(&name.lock_name()))
    }
}

impl<B, F, N> ExtractName<B> for F
where
    F: Fn(&Request<B>) -> Option<N> + Clone + Send + Sync + 'static,
    N: LockName,
{
    type Name = N;

    fn extract(&self, req: &Request<B>) -> Option<N> {
        self(req)
    }
}

/// The `index`th segment of the request path, percent-decoded, counting from 0 after the
/// leading `/`: for `/invoices/{id}/finalize`, `path_segment(1)` is the id.
///
/// A path with fewer segments passes through unlocked; an empty segment (`/invoices//x`) is an
/// invalid name and gets `400`. Decoding happens before the name is checked, so `%2F`, `%00` or
/// bytes that are not UTF-8 are part of the name, as raw bytes. Inside an axum `Router::nest`,
/// the path is the one the nested router sees, without the prefix.
pub fn path_segment(index: usize) -> PathSegment {
    PathSegment { index }
}

/// The extractor [`path_segment`] makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathSegment {
    index: usize,
}

impl<B> ExtractName<B> for PathSegment {
    type Name = Vec<u8>;

    fn extract(&self, req: &Request<B>) -> Option<Vec<u8>> {
        let segment = self.segment(req)?;
        if !segment.contains('%') {
            // Nothing to decode, as in most paths: one copy instead of decoding byte by byte.
            return Some(segment.as_bytes().to_vec());
        }
        Some(percent_decode_str(segment).collect())
    }

    fn with_name<T>(&self, req: &Request<B>, f: impl FnOnce(&[u8]) -> T) -> Option<T> {
        let segment = self.segment(req)?;
        if !segment.contains('%') {
            // Lent from the path as it is: no `Vec` for the layer to copy and drop.
            return Some(f(segment.as_bytes()));
        }
        Some(f(&percent_decode_str(segment).collect::<Vec<u8>>()))
    }
}

impl PathSegment {
    /// The segment as it stands in the path, not yet decoded.
    fn segment<'r, B>(&self, req: &'r Request<B>) -> Option<&'r str> {
        let path = req.uri().path();
        path.strip_prefix('/')
            .unwrap_or(path)
            .split('/')
            .nth(self.index)
    }
}

/// Several segments of the request path, each percent-decoded, joined with `/` into one name:
/// for `/events/{event}/seats/{seat}/buy`, `path_segments([1, 3])` locks `"{event}/{seat}"`.
///
/// Segments count from 0 after the leading `/`, as in [`path_segment`]. A path with fewer
/// segments passes through unlocked; an empty segment (`/events//seats/4/buy`) makes the whole
/// name invalid, so it gets `400`. Within each decoded segment `%` and `/` are written back as
/// `%25` and `%2F`, so no two different segment lists make the same name.
///
/// ```
/// use http::Request;
/// use tower_lease::extract::{self, ExtractName};
///
/// let seats = extract::path_segments([1, 3]);
/// let req = Request::post("/events/gala/seats/12/buy").body(()).unwrap();
/// assert_eq!(seats.extract(&req), Some(b"gala/12".to_vec()));
/// let req = Request::post("/events/a%2Fb/seats/12/buy").body(()).unwrap();
/// assert_eq!(seats.extract(&req), Some(b"a%2Fb/12".to_vec()));
/// let req = Request::post("/events//seats/12/buy").body(()).unwrap();
/// assert_eq!(seats.extract(&req), Some(Vec::new()), "an invalid name: 400");
/// ```
pub fn path_segments<const COUNT: usize>(indexes: [usize; COUNT]) -> PathSegments<COUNT> {
    PathSegments { indexes }
}

/// The extractor [`path_segments`] makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathSegments<const COUNT: usize> {
    indexes: [usize; COUNT],
}

impl<B, const COUNT: usize> ExtractName<B> for PathSegments<COUNT> {
    type Name = Vec<u8>;

    fn extract(&self, req: &Request<B>) -> Option<Vec<u8>> {
        let path = req.uri().path();
        let path = path.strip_prefix('/').unwrap_or(path);
        let mut name = Vec::with_capacity(path.len());
        for (i, &index) in self.indexes.iter().enumerate() {
            let segment = path.split('/').nth(index)?;
            if segment.is_empty() {
                // One empty part makes the whole name invalid, whatever the others hold.
                return Some(Vec::new());
            }
            if i > 0 {
                name.push(b'/');
            }
            for byte in percent_decode_str(segment) {
                match byte {
                    b'%' => name.extend_from_slice(b"%25"),
                    b'/' => name.extend_from_slice(b"%2F"),
                    byte => name.push(byte),
                }
            }
        }
        Some(name)
    }
}

/// The whole request path, percent-decoded (without the query).
///
/// Decoding makes every spelling of one path (`/a%62c` and `/abc`) take the same lock; it also
/// makes `/a%2Fb` and `/a/b` share one, which locks more than needed but never less.
pub fn path() -> WholePath {
    WholePath(())
}

/// The extractor [`path`] makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WholePath(());

impl<B> ExtractName<B> for WholePath {
    type Name = Vec<u8>;

    fn extract(&self, req: &Request<B>) -> Option<Vec<u8>> {
        Some(percent_decode_str(req.uri().path()).collect())
    }
}

/// The value of the header `name`, as raw bytes; requests without it pass through unlocked.
///
/// When the header appears more than once, the first value counts.
///
/// # Panics
///
/// If `name` is not a valid header name.
pub fn header<K>(name: K) -> Header
where
    K: TryInto<HeaderName>,
    K::Error: fmt::Debug,
{
    let name = name
        .try_into()
        .expect("tower-lease: extract::header needs a valid header name");
    Header { name }
}

/// The extractor [`header`] makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    name: HeaderName,
}

impl<B> ExtractName<B> for Header {
    type Name = Bytes;

    fn extract(&self, req: &Request<B>) -> Option<Bytes> {
        let value = req.headers().get(&self.name)?;
        Some(Bytes::copy_from_slice(value.as_bytes()))
    }
}

/// The same name for every request: one lock for the whole route, such as a job that must not
/// run twice at once.
pub fn constant<N>(name: N) -> Constant<N>
where
    N: LockName + Clone + Send + Sync + 'static,
{
    Constant { name }
}

/// The extractor [`constant`] makes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Constant<N> {
    name: N,
}

impl<B, N> ExtractName<B> for Constant<N>
where
    N: LockName + Clone,
{
    type Name = N;

    fn extract(&self, _req: &Request<B>) -> Option<N> {
        Some(self.name.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(uri: &str) -> Request<()> {
        Request::get(uri).body(()).unwrap()
    }

    #[test]
    fn path_segments_count_after_the_leading_slash() {
        let seg = |i: usize, uri: &str| path_segment(i).extract(&req(uri));
        assert_eq!(seg(0, "/invoices/42/finalize"), Some(b"invoices".to_vec()));
        assert_eq!(seg(1, "/invoices/42/finalize"), Some(b"42".to_vec()));
        assert_eq!(
            seg(2, "/invoices/42/finalize?x=1"),
            Some(b"finalize".to_vec())
        );
        assert_eq!(seg(3, "/invoices/42/finalize"), None);
        assert_eq!(seg(1, "/invoices//finalize"), Some(Vec::new()));
        assert_eq!(seg(1, "/invoices/"), Some(Vec::new()));
    }

    #[test]
    fn path_segments_are_percent_decoded_to_raw_bytes() {
        let seg = |uri: &str| path_segment(1).extract(&req(uri)).unwrap();
        assert_eq!(seg("/i/a%2Fb"), b"a/b");
        assert_eq!(seg("/i/%00%7B%7D"), b"\0{}");
        assert_eq!(seg("/i/%FF%FE"), [0xff, 0xfe]);
        assert_eq!(seg("/i/caf%C3%A9"), "café".as_bytes());
    }

    #[test]
    fn a_lent_segment_is_the_name_extract_makes() {
        // What the layers take (`with_name`, lent from the path when nothing is to decode)
        // must be what `extract` answers, decoded or not, present or not.
        for uri in [
            "/i/42",
            "/i/a%2Fb",
            "/i/%FF",
            "/i/",
            "/i//x",
            "/i",
            "/i/42?q=%20",
        ] {
            let request = req(uri);
            let lent = path_segment(1).with_name(&request, <[u8]>::to_vec);
            assert_eq!(lent, path_segment(1).extract(&request), "{uri}");
        }
    }

    #[test]
    fn several_segments_make_one_name_that_tells_them_apart() {
        let name = |uri: &str| path_segments([0, 2]).extract(&req(uri));
        assert_eq!(name("/a/x/b"), Some(b"a/b".to_vec()));
        assert_eq!(name("/a%2Fb/x/c"), Some(b"a%2Fb/c".to_vec()));
        assert_ne!(name("/a%2Fb/x/c"), name("/a/x/b%2Fc"));
        assert_eq!(name("/100%25/x/c"), Some(b"100%25/c".to_vec()));
        assert_eq!(name("/a/x"), None, "too few segments: unlocked");
        assert_eq!(name("/a/x/"), Some(Vec::new()), "an empty segment: invalid");
        assert_eq!(name("//x/b"), Some(Vec::new()), "an empty segment: invalid");
    }
}
