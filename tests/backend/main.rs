//! A backend written outside the crate, as a team with its own store writes one: several
//! processes (here, several [`Store`](tower_lease::Store)s) share one server, and each hears of
//! the others' releases and write intents only through what its backend delivers. What the
//! contract promises such a backend: waiters and shared reads in every process woken through
//! the notification sink, and every call bounded by the backend's timeout, with what a
//! timed-out call may still take given back. Needs no Redis.

mod relay;

mod notifications;
mod own_deadline;
mod timeout;
