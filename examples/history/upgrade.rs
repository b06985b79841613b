//! Upgrade histories: the lock history's workers as the replicas of two builds on one store,
//! the previous version (`--upgrade-from EXE`, this program as built from an older commit) and
//! this one, restarted one at a time from the previous build to this one, and with
//! `--both-ways` back again, as a rolling deploy and a rollback go. There is no nemesis: beside
//! the checker's promises, every call must answer, and no lease may be lost.

use std::path::PathBuf;
use std::process::Child;

use serde_json::Value;

use crate::WORKERS;
use crate::record::{Hold, now_us};

/// The builds a rolling restart goes between.
#[derive(Clone, Debug)]
pub struct Upgrade {
    /// This program as the previous version built it: its `worker` takes the same arguments.
    pub from: PathBuf,
    /// Whether the replicas go back to the previous version after they all reached this one.
    pub both_ways: bool,
}

/// Which build each worker runs, and until when.
pub struct Rolling {
    upgrade: Upgrade,
    current: PathBuf,
    /// For each worker, when each of its builds stops (µs): the previous, this one, and, both
    /// ways, the previous again.
    ends: Vec<Vec<u64>>,
    /// The build each worker runs now: an index into its `ends`.
    running: Vec<usize>,
    /// When the first worker restarted on the other build (µs).
    pub first_restart: Option<u64>,
}

/// A worker process's number in its `generation`: the kind of client stays (`% 8`), and no
/// number meets another's, nor the server's, the driver's or the steady writer's.
pub fn process_number(worker: u64, generation: usize) -> u64 {
    worker + 16 * generation as u64
}

impl Rolling {
    /// The rolling restarts of a history from `start` to `end` (µs): the workers in turn, evenly
    /// spread, so that one restarts at a time.
    pub fn new(upgrade: Upgrade, current: PathBuf, start: u64, end: u64) -> Rolling {
        let legs: u64 = if upgrade.both_ways { 2 } else { 1 };
        let leg = (end - start) / legs;
        let ends = (0..WORKERS)
            .map(|worker| {
                let turn = leg * (worker + 1) / (WORKERS + 1);
                let mut ends: Vec<u64> = (0..legs).map(|l| start + l * leg + turn).collect();
                ends.push(end);
                ends
            })
            .collect();
        Rolling {
            upgrade,
            current,
            ends,
            running: vec![0; WORKERS as usize],
            first_restart: None,
        }
    }

    /// The build of `generation`: the previous version's first, then this one's, and so on.
    pub fn exe(&self, generation: usize) -> &PathBuf {
        if generation.is_multiple_of(2) {
            &self.upgrade.from
        } else {
            &self.current
        }
    }

    /// How many whole seconds `worker`'s build `generation` runs from now (at least one).
    pub fn secs(&self, worker: u64, generation: usize) -> u64 {
        let end = self.ends[worker as usize][generation];
        end.saturating_sub(now_us()).div_ceil(1_000_000).max(1)
    }

    /// The workers that did not reach their last build: a rolling restart that never finished
    /// proves nothing.
    pub fn unfinished(&self) -> Vec<String> {
        (0..WORKERS as usize)
            .filter(|&worker| self.running[worker] + 1 < self.ends[worker].len())
            .map(|worker| {
                format!(
                    "worker {worker} never restarted on its build {} (it ran build {})",
                    self.ends[worker].len() - 1,
                    self.running[worker]
                )
            })
            .collect()
    }

    /// The workers whose build exited and whose next build is due, each with that build's
    /// generation: the caller starts them in `clients`.
    pub fn due(&mut self, clients: &mut [Child]) -> Vec<(u64, usize)> {
        let mut due = Vec::new();
        for worker in 0..WORKERS {
            let generation = self.running[worker as usize];
            let last = self.ends[worker as usize].len() - 1;
            let exited = matches!(clients[worker as usize].try_wait(), Ok(Some(_)));
            if exited && generation < last {
                self.running[worker as usize] = generation + 1;
                self.first_restart.get_or_insert_with(now_us);
                due.push((worker, generation + 1));
            }
        }
        due
    }
}

/// What a rolling restart must not do, found in its history from its first restart (`since`,
/// µs) on: a call that failed (its outcome unknown, a write refused as not sent for a lease the
/// heartbeat lost), or a lease a worker gave up (released and found gone, or a release that
/// failed). The layer's holds record no release (the layer makes it), and the driver's
/// requests sent before the server listened have no answer: neither counts. What failed
/// before the first restart is the previous build's alone, among its own replicas.
pub fn failures(history: &[Value], since: u64) -> Vec<String> {
    let listening = history
        .iter()
        .filter(|v| v["op"] == "http" && v["status"].is_u64())
        .filter_map(|v| v["invoked"].as_u64())
        .min()
        .unwrap_or(u64::MAX);
    let mut failures = Vec::new();
    for v in history {
        let ended = v["completed"].as_u64().or(v["release_invoked"].as_u64());
        if ended.is_some_and(|ended| ended < since) {
            continue;
        }
        let op = v["op"].as_str().unwrap_or("");
        let outcome = v["outcome"].as_str().unwrap_or("");
        let before_listening =
            op == "http" && v["status"].is_null() && v["invoked"].as_u64() < Some(listening);
        if (outcome == "unknown" || outcome == "not_sent") && !before_listening {
            failures.push(format!("a failed call during the rolling restart: {v}"));
        }
        if op == "hold"
            && let Some(hold) = Hold::from_json(v)
            && !hold.served
            && hold.released != Some(true)
        {
            failures.push(format!("a lease lost during the rolling restart: {v}"));
        }
    }
    failures
}
