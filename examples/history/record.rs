//! What a history is made of: one JSON line per completed operation or injected fault, with
//! times on the machine's one monotonic clock (`CLOCK_MONOTONIC`, in µs), shared by every process.

use serde_json::{Value, json};

/// Now on the monotonic clock every process of the run shares, in µs.
pub fn now_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// One holding of a lease by one process, from the acquisition's answer to its release.
#[derive(Clone, Debug)]
pub struct Hold {
    pub process: u64,
    /// `lock`, `read`, `write` or `permit`.
    pub kind: String,
    pub name: String,
    pub fence: u64,
    /// When the acquisition was sent, and when it answered "acquired".
    pub invoked: u64,
    pub acquired: u64,
    /// The last moment the process saw its lease as held (`Held::is_held`), before a write or
    /// its release; 0 when it never did (an answer that came after the lease had run out, to a
    /// process frozen while it was on its way).
    pub confirmed: u64,
    /// The release: when it was sent, and whether the store acknowledged it (`Some(true)`),
    /// found the lease gone (`Some(false)`) or failed (`None`).
    pub release_invoked: u64,
    pub released: Option<bool>,
    /// Held by a request the layer served: a read may have joined a share the server took
    /// before the request came.
    pub served: bool,
}

impl Hold {
    /// When the process held the lease, by its own account or the store's: from the
    /// acquisition's answer to the last confirmation, or to the release's sending when the store
    /// acknowledged the release (it still had our secret then); `None` when neither says it
    /// held at all after the answer.
    pub fn interval(&self) -> Option<(u64, u64)> {
        let end = match self.released {
            Some(true) => self.release_invoked.max(self.confirmed),
            _ => self.confirmed,
        };
        (end > self.acquired).then_some((self.acquired, end))
    }

    pub fn to_json(&self) -> Value {
        json!({
            "op": "hold", "process": self.process, "kind": self.kind, "name": self.name, "fence": self.fence,
            "invoked": self.invoked, "acquired": self.acquired, "confirmed": self.confirmed,
            "release_invoked": self.release_invoked, "released": self.released,
        })
    }

    pub fn from_json(v: &Value) -> Option<Self> {
        Some(Self {
            process: v["process"].as_u64()?,
            kind: v["kind"].as_str()?.to_owned(),
            name: v["name"].as_str()?.to_owned(),
            fence: v["fence"].as_u64()?,
            invoked: v["invoked"].as_u64()?,
            acquired: v["acquired"].as_u64()?,
            confirmed: v["confirmed"].as_u64()?,
            release_invoked: v["release_invoked"].as_u64()?,
            released: v["released"].as_bool(),
            served: v["request"].is_u64(),
        })
    }
}

/// A write to the fenced register, with its outcome.
pub fn op(
    process: u64,
    op: &str,
    name: &str,
    outcome: &str,
    invoked: u64,
    completed: u64,
) -> Value {
    json!({
        "op": op, "process": process, "name": name, "outcome": outcome,
        "invoked": invoked, "completed": completed,
    })
}

/// A fault the nemesis injected; `loses_data` when the store came back without its leases.
pub fn fault(kind: &str, at: u64, until: u64, loses_data: bool) -> Value {
    json!({ "op": "fault", "kind": kind, "invoked": at, "completed": until, "loses_data": loses_data })
}

/// An acquisition that took nothing: refused (`busy`), or failed with its outcome unknown.
pub fn acquire(
    process: u64,
    kind: &str,
    name: &str,
    outcome: &str,
    invoked: u64,
    completed: u64,
) -> Value {
    json!({
        "op": "acquire", "process": process, "kind": kind, "name": name, "outcome": outcome,
        "invoked": invoked, "completed": completed,
    })
}
