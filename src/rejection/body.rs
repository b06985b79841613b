//! The boxed types the middlewares' bodies share: [`BoxError`] and [`RejectionBody`].

use std::error::Error as StdError;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;

/// The error type of the layer's bodies ([`LeaseBody`](crate::LeaseBody),
/// [`TimeoutBody`](crate::layer::TimeoutBody)): the inner body's error, boxed, or the layer's own
/// ([`LeaseLostError`](crate::layer::LeaseLostError), [`BodyTimeoutError`](crate::layer::BodyTimeoutError)).
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// The body of a response an [`OnRejection`](super::OnRejection) hook made, boxed.
pub type RejectionBody = UnsyncBoxBody<Bytes, BoxError>;
