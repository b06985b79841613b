//! How a finished response waits for its lease's release: at most the layer's `release_wait`.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use crate::coarse_timer::Overdue;
use crate::lease::finish_on_drop::FinishOnDrop;

/// Waits for `release` until `wait` is over; after that the caller drops `release`, which
/// finishes it in the background.
pub(crate) fn poll_release(
    release: &mut FinishOnDrop<()>,
    wait: &mut Overdue,
    cx: &mut Context<'_>,
    namespace: &str,
) -> Poll<()> {
    if Pin::new(release).poll(cx).is_ready() {
        return Poll::Ready(());
    }
    ready!(wait.poll(cx));
    tracing::warn!(
        namespace,
        "the store did not confirm the release in time; answering, and finishing it in the background"
    );
    Poll::Ready(())
}
