//! How both middlewares refuse a request: the one table of [`Reason`]s (status, problem type,
//! title), the RFC 9457 problem+json body they answer by default, and the
//! [`OnRejection`] hook through which an application renders a [`Rejection`] itself.

mod body;
mod problem;
mod reason;
mod render;

pub use self::body::{BoxError, RejectionBody};
pub(crate) use self::problem::Problem;
pub use self::reason::Reason;
pub(crate) use self::render::Renderer;
pub use self::render::{AnyBody, BytesBody, OnRejection, Rejection};
