//! The tests of `tower-lease-postgres`, one binary (one link) for all: each module one area,
//! each test on PostgreSQL servers of its own (Debian's binaries, an `initdb` cluster in the
//! temporary folder on a free loopback port), what they share in `support`.

mod support;

mod claim;
mod claim_sqlx;
mod client_certificates;
mod commits;
mod conformance;
mod faults;
mod heartbeats;
mod isolation;
mod layer;
mod listener;
mod migrations;
mod notifications;
mod operators;
mod partition;
mod pgbouncer;
mod setup;
mod standby;
mod tls;
mod upgrade;
