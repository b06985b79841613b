//! The boxed types the middlewares' bodies share: [`BoxError`] and [`RejectionBody`].

use std::error::Error as StdError;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;

/// The error type of the middlewares' bodies: the inner body's error, boxed, or the
/// middleware's own (a lease lost while the response body streamed, a request body that took
/// longer than its limit).
pub type BoxError = Box<dyn StdError + Send + Sync>;

/// The body of a response an [`OnRejection`](super::OnRejection) hook made, boxed.
pub type RejectionBody = UnsyncBoxBody<Bytes, BoxError>;
