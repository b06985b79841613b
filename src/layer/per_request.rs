//! What a request decides for itself besides its name: whether it reads or writes
//! ([`ReadWhen`], for [`RwLockLayer`](crate::RwLockLayer)), and how many permits it may share
//! its name with ([`PermitsFor`], for [`SemaphoreLayer`](crate::SemaphoreLayer)).

use http::{Method, Request};

/// Decides whether a request takes the read (shared) or the write (exclusive) lease of an
/// [`RwLockLayer`](crate::RwLockLayer).
///
/// Implemented for every `Fn(&Request<B>) -> bool + Clone + Send + Sync + 'static`; the
/// default is [`SafeMethods`].
pub trait ReadWhen<B> {
    /// `true` to take a read lease for `req`, `false` for the write lease.
    fn is_read(&self, req: &Request<B>) -> bool;
}

impl<B, F> ReadWhen<B> for F
where
    F: Fn(&Request<B>) -> bool + Clone + Send + Sync + 'static,
{
    fn is_read(&self, req: &Request<B>) -> bool {
        self(req)
    }
}

/// Reads for the safe methods `GET`, `HEAD`, `OPTIONS` and `TRACE`; writes for all others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SafeMethods;

impl<B> ReadWhen<B> for SafeMethods {
    fn is_read(&self, req: &Request<B>) -> bool {
        matches!(
            *req.method(),
            Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE
        )
    }
}

/// Decides how many permits a request of a [`SemaphoreLayer`](crate::SemaphoreLayer) may share
/// its name with: a tenant's plan, say.
///
/// Implemented for every `Fn(&Request<B>) -> u32 + Clone + Send + Sync + 'static`; the default
/// is [`SemaphorePermits`]. A limit of 0 answers `400` (and counts as `invalid_limit` in the
/// `metrics` feature's `tower_lease_acquire_total`).
pub trait PermitsFor<B> {
    /// The most permits live at once for `req` to get in; `None` for the semaphore's own.
    fn permits_for(&self, req: &Request<B>) -> Option<u32>;
}

impl<B, F> PermitsFor<B> for F
where
    F: Fn(&Request<B>) -> u32 + Clone + Send + Sync + 'static,
{
    fn permits_for(&self, req: &Request<B>) -> Option<u32> {
        Some(self(req))
    }
}

/// Every request gets the semaphore's own number of permits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SemaphorePermits;

impl<B> PermitsFor<B> for SemaphorePermits {
    fn permits_for(&self, _req: &Request<B>) -> Option<u32> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_methods_read() {
        for (method, read) in [
            (Method::GET, true),
            (Method::HEAD, true),
            (Method::OPTIONS, true),
            (Method::TRACE, true),
            (Method::POST, false),
            (Method::PUT, false),
            (Method::PATCH, false),
            (Method::DELETE, false),
        ] {
            let req = Request::builder().method(method.clone()).body(()).unwrap();
            assert_eq!(SafeMethods.is_read(&req), read, "{method}");
        }
    }
}
