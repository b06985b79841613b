//! The schema a store keeps its leases in: its name, checked and quoted, and the statements of
//! the crate (written for the schema `tower_lease`) rewritten for it.

use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};

/// The schema a store uses unless told otherwise; the statements and `.sql` files are written
/// for it.
pub(crate) const DEFAULT_SCHEMA: &str = "tower_lease";

/// Why `name` cannot name the schema, if it cannot: a name is what PostgreSQL keeps unquoted
/// (lowercase ASCII letters, digits and `_`, not first a digit, at most 63 bytes), so that an
/// operator's `SELECT … FROM name.leases` finds it, and not `pg_…`, which PostgreSQL keeps for
/// itself.
pub(crate) fn check_schema_name(name: &str) -> Result<(), String> {
    let fits = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    let why = if name.is_empty() {
        "it is empty"
    } else if name.len() > 63 {
        "it is longer than 63 bytes"
    } else if !name.chars().all(fits) {
        "it may hold only lowercase ASCII letters, digits and _"
    } else if name.starts_with(|c: char| c.is_ascii_digit()) {
        "it may not start with a digit"
    } else if name.starts_with("pg_") {
        "names starting with pg_ are PostgreSQL's"
    } else {
        return Ok(());
    };
    Err(format!("invalid schema name {name:?}: {why}"))
}

/// A checked schema name, and the crate's statements for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Schema {
    name: &'static str,
}

impl Default for Schema {
    fn default() -> Self {
        Schema {
            name: DEFAULT_SCHEMA,
        }
    }
}

impl Schema {
    /// The schema `name`, or why it cannot be one.
    pub(crate) fn new(name: &str) -> Result<Schema, String> {
        check_schema_name(name)?;
        if name == DEFAULT_SCHEMA {
            return Ok(Schema::default());
        }
        Ok(Schema {
            name: intern(name.to_owned(), || name.to_owned()),
        })
    }

    /// The name as given, which is also the channel its releases are notified on.
    pub(crate) fn name(self) -> &'static str {
        self.name
    }

    /// The name quoted, as it goes into SQL: a keyword (`order`) is a name there too.
    pub(crate) fn quoted(self) -> String {
        format!("\"{}\"", self.name)
    }

    /// `template`, a statement of the crate naming `tower_lease.…`, for this schema: the
    /// template itself for the default schema, else its rewrite, made once per schema and
    /// statement and kept for the process's life (there are a few dozen statements, and a
    /// process uses a schema or two), so every call still sends a `&'static str` that its
    /// connection's statement cache knows.
    pub(crate) fn statement(self, template: &'static str) -> &'static str {
        if self.name == DEFAULT_SCHEMA {
            return template;
        }
        intern(format!("{}\u{0}{template}", self.name), || {
            self.rewrite(template)
        })
    }

    /// `sql` (the crate's `.sql` files, or a statement) with every name of the schema
    /// `tower_lease` replaced by this one's: qualified names, the schema's creation, its name as
    /// a `regnamespace` and the notification channel.
    pub(crate) fn rewrite(self, sql: &str) -> String {
        let quoted = self.quoted();
        sql.replace(
            "'tower_lease'::regnamespace",
            &format!("'{quoted}'::regnamespace"),
        )
        .replace(
            "pg_notify('tower_lease',",
            &format!("pg_notify('{}',", self.name),
        )
        .replace(
            "CREATE SCHEMA IF NOT EXISTS tower_lease;",
            &format!("CREATE SCHEMA IF NOT EXISTS {quoted};"),
        )
        .replace("tower_lease.", &format!("{quoted}."))
    }
}

/// The text made by `make` under `key`, made once and kept for the process's life.
fn intern(key: String, make: impl FnOnce() -> String) -> &'static str {
    static MADE: OnceLock<RwLock<HashMap<String, &'static str>>> = OnceLock::new();
    let made = MADE.get_or_init(RwLock::default);
    if let Some(text) = made.read().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return text;
    }
    let mut made = made.write().unwrap_or_else(|e| e.into_inner());
    made.entry(key)
        .or_insert_with(|| Box::leak(make().into_boxed_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unquoted_identifiers() {
        for good in ["tower_lease", "shop_locks", "_x", "a1", &"x".repeat(63)] {
            assert!(Schema::new(good).is_ok(), "{good:?}");
        }
        for bad in [
            "",
            "Locks",
            "1a",
            "a-b",
            "a b",
            "a\"b",
            "pg_x",
            "é",
            &"x".repeat(64),
        ] {
            assert!(Schema::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn statements_are_rewritten_once() {
        let schema = Schema::new("shop_locks").unwrap();
        let template = "SELECT tower_lease.lock_release($1, $2, $3) AS released";
        let rewritten = schema.statement(template);
        assert_eq!(
            rewritten,
            "SELECT \"shop_locks\".lock_release($1, $2, $3) AS released"
        );
        assert!(std::ptr::eq(rewritten, schema.statement(template)));
        assert!(std::ptr::eq(
            Schema::default().statement(template),
            template
        ));
    }
}
