//! The checker: decides whether a history is possible under the lock's promises.
//!
//! - Mutual exclusion: no two holdings of one name overlap, where a holding runs from the
//!   acquisition's answer to the last moment its process saw the lease held (or to the sending
//!   of a release the store acknowledged). An acquisition whose outcome is unknown holds
//!   nothing its process acts on, so it adds no holding. A restart that lost the store's data
//!   (no persistence) may let a second holder in before the first hears of it: such overlaps are
//!   counted apart, not as violations, as the README says of a store without persistence.
//! - Fences: an acquisition that began after another of the same name ended has a larger fence.
//! - The resource: in the order the fenced register accepted writes, fences never go back.
//! - Releases: a release the store acknowledged is inside a holding that overlaps no other
//!   (the first check, with the holding stretched to the release).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::record::Hold;

/// What the checker found in one history.
#[derive(Debug, Default)]
pub struct Verdict {
    pub operations: usize,
    pub faults: usize,
    pub violations: Vec<String>,
    pub excused: usize,
    pub stale_writes_refused: usize,
}

pub fn check(history: &[Value], logs: &BTreeMap<String, Vec<(u64, u64)>>) -> Verdict {
    let mut verdict = Verdict::default();
    let mut holds: BTreeMap<String, Vec<Hold>> = BTreeMap::new();
    let mut data_lost = Vec::new();
    for v in history {
        match v["op"].as_str() {
            Some("fault") => {
                verdict.faults += 1;
                if v["loses_data"].as_bool() == Some(true) {
                    let at = v["invoked"].as_u64().unwrap_or(0);
                    let until = v["completed"].as_u64().unwrap_or(at);
                    data_lost.push((at, until));
                }
            }
            Some("hold") => {
                verdict.operations += 2; // its acquisition and its release
                if let Some(hold) = Hold::from_json(v) {
                    holds.entry(hold.name.clone()).or_default().push(hold);
                }
            }
            Some(_) => {
                verdict.operations += 1;
                if v["op"] == "write" && v["outcome"] == "stale" {
                    verdict.stale_writes_refused += 1;
                }
            }
            None => {}
        }
    }
    for (name, holds) in &mut holds {
        holds.sort_by_key(|h| h.acquired);
        let held: Vec<(&Hold, (u64, u64))> = holds
            .iter()
            .filter_map(|h| Some((h, h.interval()?)))
            .collect();
        for (i, &(a, (a_from, a_to))) in held.iter().enumerate() {
            for &(b, (b_from, b_to)) in &held[i + 1..] {
                // Sorted by start: no later holding overlaps `a` once one starts after its end.
                if b_from >= a_to {
                    break;
                }
                let lost_between = data_lost
                    .iter()
                    .any(|&(at, until)| at <= b_from && until >= a_from);
                if lost_between {
                    verdict.excused += 1;
                    continue;
                }
                verdict.violations.push(format!(
                    "mutual exclusion, name {name}: process {} held fence {} over [{a_from}, \
                     {a_to}] µs and process {} held fence {} over [{b_from}, {b_to}] µs; both \
                     held for {} µs from {b_from}",
                    a.process,
                    a.fence,
                    b.process,
                    b.fence,
                    a_to.min(b_to) - b_from,
                ));
            }
        }
        for (i, a) in holds.iter().enumerate() {
            for b in &holds[i + 1..] {
                if b.invoked > a.acquired && b.fence <= a.fence {
                    verdict.violations.push(format!(
                        "fences, name {name}: process {} acquired fence {} at {} µs, and process \
                         {} acquired fence {} after it, at {} µs",
                        a.process, a.fence, a.acquired, b.process, b.fence, b.acquired
                    ));
                }
            }
        }
    }
    for (name, log) in logs {
        let mut highest = (0, 0);
        for &(fence, process) in log {
            if fence < highest.0 {
                verdict.violations.push(format!(
                    "resource, name {name}: the register accepted fence {fence} from process \
                     {process} after fence {} from process {}",
                    highest.0, highest.1
                ));
            }
            if fence > highest.0 {
                highest = (fence, process);
            }
        }
    }
    verdict
}
