//! The idempotency workload's checker. Per key, from the driver's attempts (`idem` lines: what
//! each attempt got back, and when) and the ledger (`run` lines: every run of the handler, and
//! when it started):
//!
//! - no run starts after the key's first acknowledged (`2xx`) response reached its client: an
//!   acknowledged payment is never charged again;
//! - every `2xx` answer for the key names the same run as the first, and that run is in the
//!   ledger: a replay is the acknowledged response, not another;
//! - under `at_most_once`, at most one run, whatever crashed.
//!
//! A run that starts before the first acknowledgement and is not the acknowledged one is a
//! retry of a request whose response nobody got, which the default layer allows (its replica
//! died, or its lease ran out): counted, not a violation. So is a run that starts after it
//! under a lower fence than the acknowledged run's: a replica frozen between the layer's
//! reservation and its handler's first step, which no layer can stop and the fence exposes
//! (the "stale writes refused by the register" of the lock histories).

use std::collections::BTreeMap;

use serde_json::Value;

/// What the check found.
#[derive(Debug, Default)]
pub struct Verdict {
    pub attempts: usize,
    pub runs: usize,
    pub keys: usize,
    pub acknowledged: usize,
    /// Keys run more than once, none of the extra runs after an acknowledgement.
    pub rerun: usize,
    /// Final answers that no run was acknowledged by: outcome unknown, not stored.
    pub unresolved: usize,
    /// Runs after an acknowledgement under an older reservation (a lower fence).
    pub stale: usize,
    pub faults: usize,
    pub violations: Vec<String>,
}

struct Attempt {
    status: u64,
    body: String,
    completed: u64,
}

pub fn check(history: &[Value]) -> Verdict {
    let mut verdict = Verdict::default();
    let mut at_most_once = false;
    let mut attempts: BTreeMap<&str, Vec<Attempt>> = BTreeMap::new();
    // Per key: (start, run, fence).
    let mut runs: BTreeMap<&str, Vec<(u64, &str, u64)>> = BTreeMap::new();
    for v in history {
        match v["op"].as_str() {
            Some("idem_config") => at_most_once = v["at_most_once"].as_bool().unwrap_or(false),
            Some("fault") => verdict.faults += 1,
            Some("idem") => {
                verdict.attempts += 1;
                let (Some(key), Some(completed)) = (v["key"].as_str(), v["completed"].as_u64())
                else {
                    continue;
                };
                let entry = attempts.entry(key).or_default();
                if let Some(status) = v["status"].as_u64() {
                    let body = v["body"].as_str().unwrap_or("").to_owned();
                    entry.push(Attempt {
                        status,
                        body,
                        completed,
                    });
                }
            }
            Some("run") => {
                verdict.runs += 1;
                if let (Some(key), Some(at), Some(run)) =
                    (v["key"].as_str(), v["at"].as_u64(), v["run"].as_str())
                {
                    let fence = v["fence"].as_u64().unwrap_or(0);
                    runs.entry(key).or_default().push((at, run, fence));
                }
            }
            _ => {}
        }
    }
    verdict.keys = attempts.len();
    let none = Vec::new();
    for (key, tried) in &attempts {
        let ran = runs.get(key).unwrap_or(&none);
        verdict.rerun += usize::from(ran.len() > 1);
        if at_most_once && ran.len() > 1 {
            let names: Vec<&str> = ran.iter().map(|(_, run, _)| *run).collect();
            verdict.violations.push(format!(
                "key {key}: {} runs under at_most_once ({})",
                ran.len(),
                names.join(", ")
            ));
        }
        let mut acks: Vec<&Attempt> = tried
            .iter()
            .filter(|a| (200..300).contains(&a.status))
            .collect();
        acks.sort_by_key(|a| a.completed);
        let Some(first) = acks.first() else {
            let last = tried.iter().max_by_key(|a| a.completed);
            verdict.unresolved += usize::from(last.is_some_and(|a| matches!(a.status, 409 | 410)));
            continue;
        };
        verdict.acknowledged += 1;
        let Some(&(_, _, acked_fence)) = ran.iter().find(|(_, run, _)| *run == first.body) else {
            verdict.violations.push(format!(
                "key {key}: acknowledged run {} is not in the ledger",
                first.body
            ));
            continue;
        };
        for (at, run, fence) in ran.iter().filter(|(at, ..)| *at > first.completed) {
            if *fence < acked_fence {
                verdict.stale += 1;
                continue;
            }
            verdict.violations.push(format!(
                "key {key}: run {run} (fence {fence}) started at {at}, {} µs after run {} \
                 (fence {acked_fence}) was acknowledged",
                at - first.completed,
                first.body
            ));
        }
        for ack in acks.iter().filter(|a| a.body != first.body) {
            verdict.violations.push(format!(
                "key {key}: {} at {} answered run {}, the acknowledged run is {}",
                ack.status, ack.completed, ack.body, first.body
            ));
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn attempt(key: &str, status: Option<u64>, body: &str, completed: u64) -> Value {
        json!({
            "op": "idem", "key": key, "status": status, "body": body,
            "invoked": completed - 10, "completed": completed,
        })
    }

    fn run(key: &str, run: &str, at: u64) -> Value {
        // Fences grow with the start, as the store issues them.
        json!({ "op": "run", "key": key, "run": run, "at": at, "fence": at })
    }

    #[test]
    fn a_retry_of_an_unanswered_request_may_run_again() {
        let history = [
            run("k", "1.a", 100),
            attempt("k", None, "", 200),
            run("k", "2.b", 300),
            attempt("k", Some(201), "2.b", 400),
            attempt("k", Some(201), "2.b", 500),
        ];
        let verdict = check(&history);
        assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
        assert_eq!((verdict.acknowledged, verdict.rerun), (1, 1));
    }

    #[test]
    fn a_run_after_an_acknowledgement_and_a_differing_replay_are_violations() {
        let history = [
            run("k", "1.a", 100),
            attempt("k", Some(201), "1.a", 200),
            run("k", "2.b", 300),
            attempt("k", Some(201), "2.b", 400),
        ];
        let verdict = check(&history);
        assert_eq!(verdict.violations.len(), 2, "{:?}", verdict.violations);
    }

    #[test]
    fn a_frozen_replicas_late_run_under_an_older_fence_is_counted_not_a_violation() {
        let mut stale = run("k", "1.a", 300);
        stale["fence"] = json!(50);
        let history = [
            run("k", "2.b", 100),
            attempt("k", Some(201), "2.b", 200),
            stale,
        ];
        let verdict = check(&history);
        assert!(verdict.violations.is_empty(), "{:?}", verdict.violations);
        assert_eq!(verdict.stale, 1);
    }

    #[test]
    fn an_acknowledged_run_missing_from_the_ledger_is_a_violation() {
        let history = [attempt("k", Some(201), "9.z", 200)];
        assert_eq!(check(&history).violations.len(), 1);
    }

    #[test]
    fn under_at_most_once_a_second_run_is_a_violation_whatever_crashed() {
        let history = [
            json!({ "op": "idem_config", "at_most_once": true }),
            run("k", "1.a", 100),
            attempt("k", None, "", 200),
            run("k", "2.b", 300),
            attempt("k", Some(201), "2.b", 400),
        ];
        assert_eq!(check(&history).violations.len(), 1);
    }
}
