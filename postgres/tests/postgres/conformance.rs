//! The conformance suite of `tower-lease-testkit` on `PgStore`, each scenario on a server of
//! its own, with a second store on it as another process and `TRUNCATE` as its data loss.

tower_lease_testkit::conformance!(crate::support::testkit_env().await);
