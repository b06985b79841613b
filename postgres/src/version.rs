//! The versions of the schema: this one's number, the oldest whose calls run beside this one's
//! on the same tables, and the SQL that installs this one's functions.

use std::collections::HashSet;
use std::sync::LazyLock;

/// The schema's version: raised with every change of the SQL (a test in `schema.rs` holds the
/// SQL's hash for this version, and fails until both change together). Every function and type
/// of the schema is installed under a name that carries it, so that the replicas of several
/// versions each call their own functions on the shared tables.
pub(crate) const VERSION: i32 = 9;

/// The oldest version whose calls may run beside this version's on the same tables: their
/// rows, marks and notifications mean the same to both. A version installed beside an older
/// one drops the functions of the versions older than this one (their replicas could not run
/// beside it anyway), and refuses to install beside a newer one that does not reach back to it.
pub(crate) const OLDEST_PEER: i32 = 8;

/// What installs this version beside the others, in order: the schema and the versions' checks,
/// the shared tables, then this version's type and functions (`contract.sql` comes in between,
/// and the version's row last: `schema.rs`).
pub(crate) const INSTALL: &str = include_str!("sql/install.sql");
pub(crate) const CONTRACT: &str = include_str!("sql/contract.sql");
pub(crate) const TABLES: &str = include_str!("sql/tables.sql");
pub(crate) const FUNCTIONS: [&str; 8] = [
    include_str!("sql/schema.sql"),
    include_str!("sql/lock.sql"),
    include_str!("sql/rw.sql"),
    include_str!("sql/permit.sql"),
    include_str!("sql/idempotency.sql"),
    include_str!("sql/many.sql"),
    include_str!("sql/sweep.sql"),
    include_str!("sql/leases.sql"),
];

/// The names of the functions and types that `FUNCTIONS` creates (`lock_acquire`,
/// `acquisition`): installed, and called, as `lock_acquire_v9`.
pub(crate) static VERSIONED_NAMES: LazyLock<HashSet<&'static str>> = LazyLock::new(|| {
    FUNCTIONS
        .iter()
        .flat_map(|sql| sql.lines())
        .filter_map(|line| {
            let rest = line
                .strip_prefix("CREATE FUNCTION tower_lease.")
                .or_else(|| line.strip_prefix("CREATE TYPE tower_lease."))?;
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            Some(&rest[..end])
        })
        .collect()
});

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_function_and_the_type_are_versioned() {
        for name in [
            "lock_acquire",
            "sweep",
            "lock_class",
            "acquisition",
            "readable_name",
        ] {
            assert!(VERSIONED_NAMES.contains(name), "{name}");
        }
        assert!(!VERSIONED_NAMES.contains("locks"));
        assert!(!VERSIONED_NAMES.contains("leases"));
        assert_eq!(VERSIONED_NAMES.len(), 34, "{:?}", *VERSIONED_NAMES);
    }
}
