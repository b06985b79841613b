//! What a `RedisStore` knows of its server's compare-and-set commands (`mod.rs` here uses
//! them), and how it reads their answers.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::backend::{Extended, Mode};
use crate::{Error, Result};

/// Which compare-and-set commands the server has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::store::redis) enum Cas {
    /// Not asked yet, or the question went unanswered (a lost connection, a timeout).
    Unknown,
    /// None of them: the scripts.
    Lua,
    /// `SET … IFEQ` only (Valkey 8.x): native extends, scripted releases.
    SetIfEq,
    /// `SET … IFEQ` and `DELIFEQ` (Valkey 9.0+).
    DelIfEq,
    /// `SET … IFEQ` and `DELEX … IFEQ` (Redis 8.4+).
    DelEx,
}

impl Cas {
    const ALL: [Cas; 5] = [
        Cas::Unknown,
        Cas::Lua,
        Cas::SetIfEq,
        Cas::DelIfEq,
        Cas::DelEx,
    ];

    pub(in crate::store::redis) fn extends(self) -> bool {
        matches!(self, Cas::SetIfEq | Cas::DelIfEq | Cas::DelEx)
    }

    /// The path a store on this server takes, as its debug event says it.
    pub(in crate::store::redis) fn describe(self) -> &'static str {
        match self {
            Cas::Unknown => "not asked yet: scripts until the server answers",
            Cas::Lua => "scripts (extend.lua, release.lua)",
            Cas::SetIfEq => "native extend (SET IFEQ), scripted release",
            Cas::DelIfEq => "native extend (SET IFEQ) and release (DELIFEQ)",
            Cas::DelEx => "native extend (SET IFEQ) and release (DELEX IFEQ)",
        }
    }
}

/// What a store learned of its server, shared by its clones.
#[derive(Debug, Default)]
pub(in crate::store::redis) struct Native(AtomicU8);

impl Native {
    pub(in crate::store::redis) fn get(&self) -> Cas {
        Cas::ALL[usize::from(self.0.load(Ordering::Relaxed)).min(Cas::ALL.len() - 1)]
    }

    pub(in crate::store::redis) fn set(&self, cas: Cas) {
        let index = Cas::ALL.iter().position(|&c| c == cas).unwrap_or(0);
        self.0.store(index as u8, Ordering::Relaxed);
    }
}

/// Whether a lease of `mode` is kept in a key that holds its secret alone, as the native
/// commands compare it: an exclusive lock's (fenced or not: its fence has a key of its own)
/// and a writer's.
pub(in crate::store::redis) fn native_mode(mode: Mode) -> bool {
    matches!(mode, Mode::Exclusive | Mode::Write)
}

/// Whether `COMMAND INFO DELIFEQ DELEX` found each, from one server's answer or, on a
/// cluster, every node's (all of them must have it); `None` for an answer that is neither.
pub(in crate::store::redis) fn commands_found(reply: redis::Value) -> Option<(bool, bool)> {
    match reply {
        redis::Value::Array(infos) if infos.len() == 2 => {
            Some((infos[0] != redis::Value::Nil, infos[1] != redis::Value::Nil))
        }
        redis::Value::Map(nodes) if !nodes.is_empty() => {
            nodes
                .into_iter()
                .try_fold((true, true), |(a, b), (_, reply)| {
                    let (found_a, found_b) = commands_found(reply)?;
                    Some((a && found_a, b && found_b))
                })
        }
        _ => None,
    }
}

/// Whether `reply` says the server does not know the command or its `IFEQ`.
pub(in crate::store::redis) fn unknown(reply: &redis::Value) -> bool {
    let redis::Value::ServerError(e) = reply else {
        return false;
    };
    let detail = e.details().unwrap_or_default().to_ascii_lowercase();
    detail.contains("unknown command") || detail.contains("syntax error")
}

/// Whether `reply` is an `OOM` refusal: `SET` is refused on a full server (`noeviction`), even
/// when it would only move an expiry.
pub(in crate::store::redis) fn out_of_memory(reply: &redis::Value) -> bool {
    matches!(reply, redis::Value::ServerError(e) if e.code() == "OOM")
}

/// A `SET … IFEQ`'s answer: `OK` when it extended, nil when the lease was gone.
pub(in crate::store::redis) fn set_ifeq_extended(reply: redis::Value) -> Result<Extended> {
    match reply.extract_error().map_err(Error::Redis)? {
        redis::Value::Okay => Ok(Extended::Held),
        redis::Value::Nil => Ok(Extended::Gone),
        other => Err(Error::UnexpectedReply(format!(
            "SET IFEQ answered {other:?}"
        ))),
    }
}
