//! [`LeaseLost`]: the layer's policy for a lease lost while the inner service works.

/// What happens when a lease is lost while the inner service is still working on the request.
///
/// A lease is lost when the store says it is no longer ours (it ran out, or someone deleted
/// it), or when no extension could be confirmed before it would have run out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseLost {
    /// Drop the inner future (cancelling the handler at its next `.await`) and answer `503`.
    /// A response that completes after its lease ran out is replaced by `503` as well, and a
    /// body streamed under [`hold_through_body`](crate::LockLayer::hold_through_body) ends
    /// with an error.
    #[default]
    Abort,
    /// Keep going: only flag the [`Lease`](crate::Lease) ([`is_held`](crate::Lease::is_held) turns `false`,
    /// [`lost`](crate::Lease::lost) resolves), so the handler can stop at a point of its choosing.
    Continue,
}
