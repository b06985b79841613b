//! What a request holds and how it lets go: its [`LeaseGuard`](guard::LeaseGuard) (a lease of
//! its own, or its part in a shared one), the policy for a lease lost while the handler runs
//! ([`LeaseLost`](lease_lost::LeaseLost)), the wait of a finished response for its release
//! ([`release_wait`]), and the layer's recent hold times, for the `Retry-After` of a busy answer
//! ([`HoldTimes`](hold_times::HoldTimes)).

pub(crate) mod guard;
pub(crate) mod hold_times;
pub(crate) mod lease_lost;
pub(crate) mod release_wait;
