//! The schema a store keeps its leases in: its name, checked and quoted, and the statements of
//! the crate (written for the schema `tower_lease`) rewritten for it.

use std::collections::HashMap;
use std::sync::{OnceLock, RwLock};

use crate::version::{VERSION, VERSIONED_NAMES};

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
    } else if name == "public" || name == "information_schema" {
        "it is every user's schema: give the leases one of their own, which the store may \
         treat as its own (it makes tables in it, and drops the functions of old versions)"
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

    /// `template`, a statement of the crate naming `tower_lease.…`, for this schema and version
    /// (see [`rewrite`](Self::rewrite)): made once per schema and statement and kept for the
    /// process's life (there are a few dozen statements, and a process uses a schema or two),
    /// so every call still sends a `&'static str` that its connection's statement cache knows.
    /// Looked up by the two texts' addresses, so a call allocates nothing.
    pub(crate) fn statement(self, template: &'static str) -> &'static str {
        type Made = HashMap<(usize, usize, usize), &'static str>;
        static MADE: OnceLock<RwLock<Made>> = OnceLock::new();
        let key = (
            self.name.as_ptr() as usize,
            template.as_ptr() as usize,
            template.len(),
        );
        let made = MADE.get_or_init(RwLock::default);
        if let Some(text) = made.read().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return text;
        }
        let mut made = made.write().unwrap_or_else(|e| e.into_inner());
        made.entry(key)
            .or_insert_with(|| Box::leak(self.rewrite(template).into_boxed_str()))
    }

    /// `sql` (the crate's `.sql` files, or a statement), written for the schema `tower_lease`,
    /// for this one: its name as a literal (`'tower_lease'`: a `regnamespace`, the notification
    /// channel) and as the schema made, and every qualified name, where those of the functions
    /// and the type take this version's number (`tower_lease.lock_acquire` becomes
    /// `"shop"."lock_acquire_v9"`, and `tower_lease.locks` `"shop".locks`).
    pub(crate) fn rewrite(self, sql: &str) -> String {
        let quoted = self.quoted();
        let sql = sql
            .replace("'tower_lease'", &format!("'{}'", self.name))
            .replace("SCHEMA tower_lease;", &format!("SCHEMA {quoted};"));
        let mut out = String::with_capacity(sql.len() + sql.len() / 8);
        let mut rest = sql.as_str();
        while let Some(at) = rest.find("tower_lease.") {
            out.push_str(&rest[..at]);
            rest = &rest[at + "tower_lease.".len()..];
            let end = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            let (object, after) = rest.split_at(end);
            out.push_str(&quoted);
            out.push('.');
            out.push_str(object);
            if VERSIONED_NAMES.contains(object) {
                out.push_str(&format!("_v{VERSION}"));
            }
            rest = after;
        }
        out.push_str(rest);
        out
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
            "public",
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
            format!("SELECT \"shop_locks\".lock_release_v{VERSION}($1, $2, $3) AS released")
        );
        assert!(std::ptr::eq(rewritten, schema.statement(template)));
        assert_eq!(
            Schema::default().statement(template),
            format!("SELECT \"tower_lease\".lock_release_v{VERSION}($1, $2, $3) AS released")
        );
    }

    #[test]
    fn only_functions_and_types_take_the_version() {
        let sql = "SELECT tower_lease.lock_class(), 'tower_lease'::regnamespace \
                   FROM tower_lease.locks l, tower_lease.acquisition a; \
                   CREATE SCHEMA tower_lease; SELECT 'tower_lease.' || t";
        assert_eq!(
            Schema::new("shop").unwrap().rewrite(sql),
            format!(
                "SELECT \"shop\".lock_class_v{VERSION}(), 'shop'::regnamespace \
                 FROM \"shop\".locks l, \"shop\".acquisition_v{VERSION} a; \
                 CREATE SCHEMA \"shop\"; SELECT '\"shop\".' || t"
            )
        );
    }
}
