//! The request body of a locked request: read whole before the lock is taken
//! ([`BufferBody`](buffer::BufferBody), under `buffer_body`), or streamed to the handler under
//! the lock within the layer's `body_timeout` ([`TimeoutBody`](timeout_body::TimeoutBody)).

pub(crate) mod buffer;
pub(crate) mod timeout_body;
