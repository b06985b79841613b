//! The checker: decides whether a history is possible under the lock's promises.
//!
//! - Mutual exclusion: no two holdings of one name overlap, where a holding runs from the
//!   acquisition's answer to the last moment its process saw the lease held (or to the sending
//!   of a release the store acknowledged). An acquisition whose outcome is unknown holds
//!   nothing its process acts on, so it adds no holding. A restart that lost the store's data
//!   (no persistence) may let a second holder in before the first hears of it: such overlaps are
//!   counted apart, not as violations, as the README says of a store without persistence.
//! - Readers of an `RwLock` share, its writer excludes them and other writers; at most
//!   `PERMITS` permits of the semaphore are held at once.
//! - Fences: an exclusive acquisition sent after another's answer has a larger fence; a reader
//!   sent after a writer's answer sees at least the writer's fence.
//! - The resource: in the order the fenced register accepted writes, fences never go back.
//! - Releases: a release the store acknowledged is inside a holding that overlaps no other
//!   (the first check, with the holding stretched to the release).
//! - Requests through the layer: a `200` comes from a handler that ran (its holding is in
//!   the history), and a refused request (`409`, `423`, `429`) never reached its handler.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::record::Hold;
use crate::worker::PERMITS;

/// What the checker found in one history.
#[derive(Debug, Default)]
pub struct Verdict {
    pub operations: usize,
    pub faults: usize,
    pub violations: Vec<String>,
    pub excused: usize,
    pub stale_writes_refused: usize,
}

pub fn check(history: &[Value]) -> Verdict {
    let mut verdict = Verdict::default();
    let mut logs: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
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
            Some("accepted") => {
                if let (Some(name), Some(fence), Some(process)) = (
                    v["name"].as_str(),
                    v["fence"].as_u64(),
                    v["process"].as_u64(),
                ) {
                    logs.entry(name.to_owned())
                        .or_default()
                        .push((fence, process));
                }
            }
            // A request's handler: the request itself is counted as one operation below.
            Some("hold") if v["request"].is_u64() => {
                if let Some(hold) = Hold::from_json(v) {
                    holds.entry(hold.name.clone()).or_default().push(hold);
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
        let excused = |from: u64, to: u64| {
            data_lost
                .iter()
                .any(|&(at, until)| at <= to && until >= from)
        };
        // A read the layer served may have joined a share its server took before a loss of
        // the store's data: it counts as held from the first served read of its fence (the
        // same writer generation, so perhaps the same share), for excusing only.
        let mut share_from: BTreeMap<u64, u64> = BTreeMap::new();
        for h in holds.iter().filter(|h| h.served && h.kind == "read") {
            let from = share_from.entry(h.fence).or_insert(h.acquired);
            *from = (*from).min(h.acquired);
        }
        let from_of = |h: &Hold| match (h.served && h.kind == "read", share_from.get(&h.fence)) {
            (true, Some(&from)) => from.min(h.acquired),
            _ => h.acquired,
        };
        for (i, &(a, (a_from, a_to))) in held.iter().enumerate() {
            for &(b, (b_from, b_to)) in &held[i + 1..] {
                // Sorted by start: no later holding overlaps `a` once one starts after its end.
                if b_from >= a_to {
                    break;
                }
                // Readers share, and permits are counted below.
                let shared = |h: &Hold| h.kind == "read" || h.kind == "permit";
                if shared(a) && shared(b) {
                    continue;
                }
                if excused(a_from.min(from_of(a)).min(from_of(b)), b_from) {
                    verdict.excused += 1;
                    continue;
                }
                verdict.violations.push(format!(
                    "exclusion, name {name}: process {} held {} (fence {}) over [{a_from}, \
                     {a_to}] µs and process {} held {} (fence {}) over [{b_from}, {b_to}] µs; \
                     both held for {} µs from {b_from}",
                    a.process,
                    a.kind,
                    a.fence,
                    b.process,
                    b.kind,
                    b.fence,
                    a_to.min(b_to) - b_from,
                ));
            }
        }
        // At most PERMITS permits at once: sweep the holdings' starts and ends. Over the limit
        // is excused when the store lost its data while one of the holders inside held.
        let mut edges: Vec<(u64, bool, usize)> = Vec::new();
        for (i, &(h, (from, to))) in held.iter().enumerate() {
            if h.kind == "permit" {
                edges.push((from, true, i));
                edges.push((to, false, i));
            }
        }
        // Ends before starts at one instant: a permit given back lets the next in.
        edges.sort_by_key(|&(at, starts, _)| (at, starts));
        let mut inside: Vec<usize> = Vec::new();
        for &(at, starts, i) in &edges {
            if !starts {
                inside.retain(|&j| j != i);
                continue;
            }
            inside.push(i);
            if inside.len() <= PERMITS as usize {
                continue;
            }
            let earliest = inside.iter().map(|&j| held[j].1.0).min().unwrap_or(at);
            if excused(earliest, at) {
                verdict.excused += 1;
                continue;
            }
            let holders: Vec<String> = inside
                .iter()
                .map(|&j| format!("process {} over {:?} µs", held[j].0.process, held[j].1))
                .collect();
            verdict.violations.push(format!(
                "permits, name {name}: {} permits held at {at} µs ({}), with {PERMITS} permits",
                inside.len(),
                holders.join(", ")
            ));
        }
        // Fences: an acquisition sent after another's answer sees a larger fence, or for a
        // reader after a writer, the writer's.
        for (i, a) in holds.iter().enumerate() {
            for b in &holds[i + 1..] {
                if b.invoked <= a.acquired || a.kind == "permit" || b.kind == "permit" {
                    continue;
                }
                let ordered = match (a.kind.as_str(), b.kind.as_str()) {
                    ("read", "read") => true,
                    // A store that lost its data lost the last writer's fence with it (the
                    // next writer's is still larger: fences follow the store's clock).
                    (_, "read") => {
                        b.fence >= a.fence || excused(a.acquired.min(from_of(b)), b.acquired)
                    }
                    _ => b.fence > a.fence,
                };
                if !ordered {
                    verdict.violations.push(format!(
                        "fences, name {name}: process {} took {} with fence {} (answered at {} \
                         µs), and process {} took {} with fence {} after it, sent at {} µs",
                        a.process,
                        a.kind,
                        a.fence,
                        a.acquired,
                        b.process,
                        b.kind,
                        b.fence,
                        b.invoked
                    ));
                }
            }
        }
    }
    requests(history, &mut verdict);
    for (name, log) in &logs {
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

/// The faults after which the store is written to through a new primary.
const FAILOVERS: [&str; 3] = ["kill_primary", "sentinel_failover", "pg_failover"];

/// For each failover, in the history's order, its kind and the longest stretch in µs without a
/// successful exclusive acquisition (a lock's or a writer's), from the fault's start until the
/// first one after its end, when the sentinels and the replica had settled; `None` when none
/// came after it (the history ended first, or the store stayed unwritable). The acquisitions
/// in between split the stretch, since one answered just after the start may have been the
/// old primary's.
pub fn write_gaps(history: &[Value]) -> Vec<(&'static str, Option<u64>)> {
    let mut writes: Vec<u64> = history
        .iter()
        .filter(|v| v["op"] == "hold" && (v["kind"] == "lock" || v["kind"] == "write"))
        .filter_map(|v| v["acquired"].as_u64())
        .collect();
    writes.sort_unstable();
    let failovers = history.iter().filter(|v| v["op"] == "fault");
    let failovers = failovers.filter_map(|v| {
        let kind = FAILOVERS.into_iter().find(|&kind| v["kind"] == kind)?;
        Some((kind, v["invoked"].as_u64()?, v["completed"].as_u64()?))
    });
    failovers
        .map(|(kind, from, until)| {
            let (mut last, mut longest) = (from, 0);
            for &at in &writes[writes.partition_point(|&at| at <= from)..] {
                longest = longest.max(at - last);
                last = at;
                if at >= until {
                    return (kind, Some(longest));
                }
            }
            (kind, None)
        })
        .collect()
}

/// [`write_gaps`] in seconds by kind, and the longest of those writes resumed after; `None`
/// without failovers.
pub fn write_gaps_line(history: &[Value]) -> Option<String> {
    let gaps = write_gaps(history);
    let secs = |gap: Option<u64>| match gap {
        Some(us) => format!("{:.2} s", us as f64 / 1e6),
        None => "not resumed by the end".to_owned(),
    };
    let by_kind = FAILOVERS.into_iter().filter_map(|kind| {
        let of_kind: Vec<String> = gaps
            .iter()
            .filter(|g| g.0 == kind)
            .map(|g| secs(g.1))
            .collect();
        (!of_kind.is_empty()).then(|| format!("{kind} {}", of_kind.join(", ")))
    });
    let by_kind: Vec<String> = by_kind.collect();
    if gaps.is_empty() {
        return None;
    }
    let longest = secs(gaps.iter().filter_map(|g| g.1).max());
    Some(format!(
        "write gaps after failovers: {}; longest {longest}",
        by_kind.join("; ")
    ))
}

/// Requests through the layer against what their handlers recorded.
fn requests(history: &[Value], verdict: &mut Verdict) {
    let handled: std::collections::BTreeSet<u64> = history
        .iter()
        .filter(|v| v["op"] == "hold")
        .filter_map(|v| v["request"].as_u64())
        .collect();
    for v in history.iter().filter(|v| v["op"] == "http") {
        let Some(request) = v["request"].as_u64() else {
            continue;
        };
        let ran = handled.contains(&request);
        let wrong = match v["outcome"].as_str() {
            Some("ok") => !ran,
            Some("fail") => ran,
            _ => false,
        };
        if wrong {
            verdict.violations.push(format!(
                "request {request} ({} {}, sent at {} µs) answered {} though its handler {}",
                v["method"],
                v["name"],
                v["invoked"],
                v["status"],
                if ran { "ran" } else { "never ran" },
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::{check, write_gaps};

    fn request(request: u64, outcome: &str, status: u16) -> Value {
        json!({
            "op": "http", "process": 1_000_000 + request, "request": request, "method": "PUT",
            "name": "a", "status": status, "outcome": outcome, "invoked": 10, "completed": 1_000,
        })
    }

    /// A holding of lock `a`; a request's handler's when `request` is given.
    fn hold(process: u64, request: Option<u64>, acquired: u64, confirmed: u64) -> Value {
        let mut hold = json!({
            "op": "hold", "process": process, "kind": "lock", "name": "a", "fence": acquired,
            "invoked": acquired - 5, "acquired": acquired, "confirmed": confirmed,
            "release_invoked": 0, "released": null,
        });
        if let Some(request) = request {
            hold["request"] = json!(request);
        }
        hold
    }

    fn failover(kind: &str, invoked: u64, completed: u64) -> Value {
        json!({
            "op": "fault", "kind": kind, "invoked": invoked, "completed": completed,
            "loses_data": false,
        })
    }

    #[test]
    fn a_write_gap_runs_from_the_failovers_start_to_the_first_write_after_its_end() {
        // A write at 100, the primary killed over [1000, 2000], writes again from 3500: the
        // gap is 2500 µs, not 3400 from the last write, and ends with the write at 3500.
        let mut history = vec![
            hold(0, None, 100, 200),
            failover("kill_primary", 1_000, 2_000),
            hold(1, None, 3_500, 3_600),
            hold(0, None, 9_000, 9_100),
        ];
        assert_eq!(write_gaps(&history), [("kill_primary", Some(2_500))]);
        // A write answered just after the start splits the stretch.
        history.push(hold(1, None, 1_200, 1_300));
        assert_eq!(write_gaps(&history), [("kill_primary", Some(2_300))]);
    }

    #[test]
    fn writes_before_a_failover_do_not_end_its_gap() {
        // Answered at 900 but recorded after the failover [1000, 2000]: writes did not resume.
        let mut history = vec![
            failover("sentinel_failover", 1_000, 2_000),
            hold(0, None, 900, 950),
        ];
        assert_eq!(write_gaps(&history), [("sentinel_failover", None)]);
        history.push(hold(1, None, 2_400, 2_500));
        assert_eq!(write_gaps(&history), [("sentinel_failover", Some(1_400))]);
    }

    #[test]
    fn an_ok_whose_handler_never_ran_is_a_violation() {
        let verdict = check(&[request(7, "ok", 200)]);
        assert_eq!(verdict.violations.len(), 1, "{:?}", verdict.violations);
        assert!(verdict.violations[0].contains("never ran"));
        let ran = check(&[request(7, "ok", 200), hold(1_000_007, Some(7), 100, 300)]);
        assert!(ran.violations.is_empty(), "{:?}", ran.violations);
    }

    #[test]
    fn a_refused_request_whose_handler_ran_is_a_violation() {
        let verdict = check(&[request(7, "fail", 409), hold(1_000_007, Some(7), 100, 300)]);
        assert_eq!(verdict.violations.len(), 1, "{:?}", verdict.violations);
        // An unknown outcome may have run its handler, or not.
        let unknown = check(&[
            request(7, "unknown", 503),
            hold(1_000_007, Some(7), 100, 300),
        ]);
        assert!(unknown.violations.is_empty(), "{:?}", unknown.violations);
    }

    #[test]
    fn a_request_holds_only_while_its_handler_saw_the_lease() {
        // The request spans [10, 1000]; its handler saw the lease over [100, 150] only, before
        // the next holder's answer at 200.
        let apart = [
            request(7, "unknown", 503),
            hold(1_000_007, Some(7), 100, 150),
            hold(0, None, 200, 400),
        ];
        let verdict = check(&apart);
        assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
        let overlapping = [
            request(7, "ok", 200),
            hold(1_000_007, Some(7), 100, 300),
            hold(0, None, 200, 400),
        ];
        let verdict = check(&overlapping);
        assert_eq!(verdict.violations.len(), 1, "{:?}", verdict.violations);
        assert!(verdict.violations[0].starts_with("exclusion"));
    }

    #[test]
    fn a_served_read_on_a_share_taken_before_a_data_loss_is_excused() {
        let read = |request: u64, acquired: u64, confirmed: u64| {
            let mut hold = hold(1_000_000 + request, Some(request), acquired, confirmed);
            hold["kind"] = json!("read");
            hold["fence"] = json!(5);
            hold
        };
        let lost = json!({"op": "fault", "loses_data": true, "invoked": 100, "completed": 110});
        // The server's share (fence 5) served a read at 50, before the store lost its data at
        // 100; a writer then took the lock at 120, and a read on the old share ran at 200.
        let history = [
            lost.clone(),
            request(1, "ok", 200),
            read(1, 50, 60),
            request(2, "ok", 200),
            read(2, 200, 400),
            hold(0, None, 120, 300),
        ];
        let verdict = check(&history);
        assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
        assert_eq!(verdict.excused, 1);
        // Without the loss, the same overlap is a violation, and so is the read's old fence.
        let verdict = check(&history[1..]);
        assert_eq!(verdict.violations.len(), 2, "{:?}", verdict.violations);
        assert!(verdict.violations[0].starts_with("exclusion"));
    }
}
