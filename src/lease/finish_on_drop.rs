//! [`FinishOnDrop`]: a store call that runs to its end even when the request that made it is
//! dropped.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::Result;
use crate::backend::BoxFuture;
use crate::definition::attempt::Attempt;
use crate::store::raw::RawLease;

/// An acquisition's answer, with the instant its command was sent.
pub(crate) type Acquired = (Instant, Result<Attempt<RawLease>>);

pin_project! {
    /// An acquisition that also answers when it was first polled, which is before its command
    /// leaves: counting the lease from then never overestimates its end.
    ///
    /// A type rather than an `async` block around the call: awaiting a captured future moves
    /// it into a second slot of the block's state, and this state is boxed for every
    /// acquisition in flight.
    pub(crate) struct SentAt<F> {
        #[pin]
        call: F,
        sent_at: Option<Instant>,
    }
}

impl<F> SentAt<F> {
    pub(crate) fn new(call: F) -> Self {
        Self {
            call,
            sent_at: None,
        }
    }
}

impl<F: Future> Future for SentAt<F> {
    type Output = (Instant, F::Output);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let sent_at = *this.sent_at.get_or_insert_with(Instant::now);
        let answer = ready!(this.call.poll(cx));
        Poll::Ready((sent_at, answer))
    }
}

/// A store call that is finished in a spawned task if the request is dropped first.
///
/// Once a command has left, the store acts on it whether or not anyone waits for the answer: a
/// request cancelled while its acquisition is in flight would leave a lease nobody holds, and one
/// cancelled while its release is in flight might never send it. Either way the lock would stay
/// taken for a whole TTL. So a dropped call runs on to its end, and a lease it took is given back.
pub(crate) struct FinishOnDrop<T: Send + 'static> {
    /// `None` once the call has answered.
    call: Option<BoxFuture<'static, T>>,
    /// A call never polled has sent nothing and can simply be dropped.
    polled: bool,
    /// What to do with the answer of a call nobody waits for any more; `None` for a call that
    /// is simply dropped (it finishes its own store calls).
    if_abandoned: Option<FollowUp<T>>,
}

/// What to run after a call nobody waits for answered, if anything.
pub(crate) type FollowUp<T> = fn(T) -> Option<BoxFuture<'static, ()>>;

impl FinishOnDrop<Acquired> {
    /// An acquisition: abandoned, a lease it took is released at once.
    pub(crate) fn acquisition(call: BoxFuture<'static, Acquired>) -> Self {
        Self::new(call, |(_, attempt)| match attempt {
            Ok(Attempt::Acquired(holding)) => Some(Box::pin(async move {
                if let Err(error) = holding.release().await {
                    tracing::warn!(
                        namespace = holding.namespace(),
                        %error,
                        "releasing the lease of a cancelled request failed; it stays held until its TTL runs out"
                    );
                }
            })),
            _ => None,
        })
    }
}

impl<T: Send + 'static> FinishOnDrop<T> {
    /// A call that is dropped with its caller: one whose own store calls finish themselves,
    /// such as a bounded wait, which must not go on waiting for a client that is gone.
    pub(crate) fn droppable(call: BoxFuture<'static, T>) -> Self {
        Self {
            call: Some(call),
            polled: false,
            if_abandoned: None,
        }
    }
}

impl FinishOnDrop<()> {
    /// A release: abandoned, it is still sent and awaited in the background.
    pub(crate) fn release(call: BoxFuture<'static, ()>) -> Self {
        Self::new(call, |()| None)
    }
}

impl<T: Send + 'static> FinishOnDrop<T> {
    /// A call that, abandoned, still runs to its end in the background, its answer dropped:
    /// a token's or a `Held`'s release, whose caller may give up on it (a `select!` whose
    /// other branch won, a timeout) after the lease was already taken out of its care.
    pub(crate) fn to_the_end(call: BoxFuture<'static, T>) -> Self {
        Self::new(call, |_| None)
    }
}

impl<T: Send + 'static> FinishOnDrop<T> {
    /// A call whose answer, when nobody waits for it any more, goes to `if_abandoned`.
    pub(crate) fn new(call: BoxFuture<'static, T>, if_abandoned: FollowUp<T>) -> Self {
        Self {
            call: Some(call),
            polled: false,
            if_abandoned: Some(if_abandoned),
        }
    }
}

impl<T: Send + 'static> Future for FinishOnDrop<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        self.polled = true;
        let call = self
            .call
            .as_mut()
            .expect("FinishOnDrop polled after completion");
        let answer = ready!(call.as_mut().poll(cx));
        self.call = None;
        Poll::Ready(answer)
    }
}

impl<T: Send + 'static> Drop for FinishOnDrop<T> {
    fn drop(&mut self) {
        let Some(call) = self.call.take().filter(|_| self.polled) else {
            return;
        };
        let Some(if_abandoned) = self.if_abandoned else {
            return;
        };
        // Outside a runtime the call cannot go on; the TTL frees whatever it took.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Some(follow_up) = if_abandoned(call.await) {
                    follow_up.await;
                }
            });
        }
    }
}
