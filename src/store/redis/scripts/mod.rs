//! The Lua scripts a [`RedisStore`](crate::RedisStore) runs and how they are called: one
//! `.lua` file each, by lock kind (`lock/`, `rw/`, `permit/`, `idempotency/`); how a script is
//! sent ([`call`]). `backend.rs` runs the extend and release scripts of a held lease.

pub(in crate::store::redis) mod call;

use std::sync::OnceLock;

use redis::Script;

use crate::backend::Mode;
use crate::store::redis::KeyRole;

pub(in crate::store::redis) static ACQUIRE: Lua = Lua::new(include_str!("lock/acquire.lua"));
pub(in crate::store::redis) static EXTEND: Lua = Lua::new(include_str!("lock/extend.lua"));
pub(in crate::store::redis) static RELEASE: Lua = Lua::new(include_str!("lock/release.lua"));
pub(in crate::store::redis) static READ_ACQUIRE: Lua =
    Lua::new(include_str!("rw/read_acquire.lua"));
pub(in crate::store::redis) static READ_EXTEND: Lua = Lua::new(include_str!("rw/read_extend.lua"));
pub(in crate::store::redis) static READ_RELEASE: Lua =
    Lua::new(include_str!("rw/read_release.lua"));
pub(in crate::store::redis) static WRITE_ACQUIRE: Lua =
    Lua::new(include_str!("rw/write_acquire.lua"));
pub(in crate::store::redis) static WITHDRAW_INTENT: Lua =
    Lua::new(include_str!("rw/withdraw_intent.lua"));
pub(in crate::store::redis) static PERMIT_ACQUIRE: Lua =
    Lua::new(include_str!("permit/permit_acquire.lua"));
pub(in crate::store::redis) static PERMIT_RELEASE: Lua =
    Lua::new(include_str!("permit/permit_release.lua"));
pub(in crate::store::redis) static IDEM_BEGIN: Lua =
    Lua::new(include_str!("idempotency/idem_begin.lua"));
pub(in crate::store::redis) static IDEM_COMPLETE: Lua =
    Lua::new(include_str!("idempotency/idem_complete.lua"));
pub(in crate::store::redis) static IDEM_BEGIN_ONCE: Lua =
    Lua::new(include_str!("idempotency/idem_begin_once.lua"));
pub(in crate::store::redis) static IDEM_FREE: Lua =
    Lua::new(include_str!("idempotency/idem_free.lua"));
pub(in crate::store::redis) static PERMITS_IN_USE: Lua =
    Lua::new(include_str!("permit/permits_in_use.lua"));

/// A script run with `EVALSHA`, and with `EVAL` when the server answers `NOSCRIPT`.
///
/// Each script comes in two variants from its one file: as written, publishing with `PUBLISH`
/// (a single Redis, or a cluster before 7.0), and sharded, the same with `SPUBLISH` (a cluster
/// whose notifier listens with `SSUBSCRIBE`: the message stays on the shard that owns the name
/// instead of crossing the cluster bus to every node). A channel shares its name's hash tag, so
/// `SPUBLISH` in a script stays in the slot of the script's keys, as Redis requires.
///
/// `redis::Script`'s fallback (`SCRIPT LOAD`, then `EVALSHA` again) fails when another
/// `SCRIPT FLUSH` lands between the two, and in a cluster `SCRIPT LOAD` goes to every node, so
/// one node down would fail calls for the slots of the others. `EVAL` runs the script in one
/// command on the slot's node and caches it there for the next `EVALSHA`.
pub(in crate::store::redis) struct Lua {
    pub(in crate::store::redis) code: &'static str,
    sha: OnceLock<String>,
    /// The sharded variant's code and hash, made on first use.
    sharded: OnceLock<(String, String)>,
}

impl Lua {
    const fn new(code: &'static str) -> Self {
        Self {
            code,
            sha: OnceLock::new(),
            sharded: OnceLock::new(),
        }
    }

    pub(in crate::store::redis) fn sha(&self) -> &str {
        let hash = || Script::new(self.code).get_hash().to_owned();
        self.sha.get_or_init(hash)
    }

    /// The variant's hash and code: sharded (`SPUBLISH`) or as written (`PUBLISH`).
    pub(in crate::store::redis) fn variant(&self, sharded: bool) -> (&str, &str) {
        if !sharded {
            return (self.sha(), self.code);
        }
        let (sha, code) = self.sharded.get_or_init(|| {
            let code = self
                .code
                .replace("redis.call('PUBLISH'", "redis.call('SPUBLISH'");
            (Script::new(&code).get_hash().to_owned(), code)
        });
        (sha, code)
    }
}

/// What a holder asks of its lease.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(in crate::store::redis) enum Holder {
    Extend,
    Release,
}

/// The script for `action` on a lease held in `mode`, and the key it acts on.
pub(in crate::store::redis) fn holder_script(
    mode: Mode,
    action: Holder,
) -> (&'static Lua, KeyRole) {
    match (mode, action) {
        (Mode::Exclusive, Holder::Extend) => (&EXTEND, KeyRole::Lock),
        (Mode::Write, Holder::Extend) => (&EXTEND, KeyRole::Writer),
        (Mode::Read, Holder::Extend) => (&READ_EXTEND, KeyRole::Readers),
        (Mode::Exclusive, Holder::Release) => (&RELEASE, KeyRole::Lock),
        (Mode::Write, Holder::Release) => (&RELEASE, KeyRole::Writer),
        (Mode::Read, Holder::Release) => (&READ_RELEASE, KeyRole::Readers),
        // A permit is extended exactly as a reader is: one member of a set scored by lease end.
        (Mode::Permit, Holder::Extend) => (&READ_EXTEND, KeyRole::Permits),
        (Mode::Permit, Holder::Release) => (&PERMIT_RELEASE, KeyRole::Permits),
        // A reservation's key holds its secret alone, as an exclusive lock's does.
        (Mode::Reservation, Holder::Extend) => (&EXTEND, KeyRole::Idempotency),
        (Mode::Reservation, Holder::Release) => (&RELEASE, KeyRole::Idempotency),
    }
}

/// The error Redis answers an `EVALSHA` whose script it does not have (after `SCRIPT FLUSH`, a
/// restart, or on a new cluster node): the call is sent again as `EVAL`.
pub(in crate::store::redis) const NO_SCRIPT: redis::ServerErrorKind =
    redis::ServerErrorKind::NoScript;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sharded_variant_of_every_publishing_script_publishes_with_spublish_only() {
        let publishing = [
            &RELEASE,
            &READ_RELEASE,
            &WRITE_ACQUIRE,
            &WITHDRAW_INTENT,
            &PERMIT_RELEASE,
            &IDEM_COMPLETE,
            &IDEM_FREE,
        ];
        for script in publishing {
            let (sha, code) = script.variant(true);
            assert!(code.contains("redis.call('SPUBLISH'"), "{code}");
            assert!(!code.contains("redis.call('PUBLISH'"), "{code}");
            assert_ne!(sha, script.sha());
            assert_eq!(script.variant(false), (script.sha(), script.code));
        }
        // A script that publishes nothing is one script either way.
        assert_eq!(ACQUIRE.variant(true).0, ACQUIRE.sha());
    }
}
