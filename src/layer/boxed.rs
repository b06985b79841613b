//! The boxed types the layer's bodies share: [`BoxError`] and [`RejectionBody`].

use std::error::Error as StdError;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;

/// The error type of the layer's bodies ([`LeaseBody`](super::LeaseBody),
/// [`TimeoutBody`](super::TimeoutBody)): the inner body's error, boxed, or the layer's own
/// ([`LeaseLostError`](super::LeaseLostError), [`BodyTimeoutError`](super::BodyTimeoutError)).
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// The body of a response an [`OnRejection`](super::OnRejection) hook made, boxed.
pub type RejectionBody = UnsyncBoxBody<Bytes, BoxError>;
