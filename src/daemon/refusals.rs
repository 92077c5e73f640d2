//! Refused local API requests in the audit log, bounded. The first refusal of a kind — peer
//! uid, agent, operation, reason — in an interval is recorded as it happens (`api.refused`);
//! the rest of that interval's are counted and recorded once, with their count, when the
//! interval ends (`api.refusals_counted`). A flood of refusals grows the audit log by a few
//! records per kind and interval, not by one synced record per request.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use uuid::Uuid;

use crate::wire::now_ms;

/// How long refusals of one kind are counted before their count is recorded.
pub const INTERVAL: Duration = Duration::from_secs(10);

/// Kinds followed at once; beyond, a peer's further kinds are counted as one (`many kinds`).
const MAX_KINDS: usize = 1024;

/// One kind of refusal.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Kind {
    uid: u32,
    agent: Option<Uuid>,
    op: String,
    reason: String,
}

/// A kind's current interval.
#[derive(Debug)]
struct Spell {
    started: Instant,
    started_ms: i64,
    /// Refusals after the first (recorded) one.
    repeated: u64,
}

/// The refusals counted in their intervals.
#[derive(Debug, Default)]
pub struct Refusals {
    spells: Mutex<HashMap<Kind, Spell>>,
}

/// An audit record: its event and detail.
pub type Record = (&'static str, Value);

impl Refusals {
    /// The records one refusal adds now: the refusal itself when it is the first of its kind
    /// in its interval, and the counts of every interval that has ended.
    pub fn refused(
        &self,
        agent: Option<Uuid>,
        uid: u32,
        op: &str,
        reason: &str,
        now: Instant,
    ) -> Vec<Record> {
        let Ok(mut spells) = self.spells.lock() else {
            // Poisoned: every refusal is recorded, as before there were intervals.
            return vec![first(agent, uid, op, reason)];
        };
        let mut records = ended(&mut spells, now, false);
        let mut kind = Kind {
            uid,
            agent,
            op: op.to_owned(),
            reason: reason.to_owned(),
        };
        if spells.len() >= MAX_KINDS && !spells.contains_key(&kind) {
            kind = Kind {
                uid,
                agent: None,
                op: "*".to_owned(),
                reason: "many kinds of refusal (each counted as this one)".to_owned(),
            };
        }
        match spells.get_mut(&kind) {
            Some(spell) => spell.repeated += 1,
            None => {
                records.push(first(kind.agent, uid, &kind.op, &kind.reason));
                spells.insert(
                    kind,
                    Spell {
                        started: now,
                        started_ms: now_ms(),
                        repeated: 0,
                    },
                );
            }
        }
        records
    }

    /// The counts of the intervals ended by `now` (of every interval, with `all`: at stop).
    pub fn ended(&self, now: Instant, all: bool) -> Vec<Record> {
        self.spells
            .lock()
            .map(|mut spells| ended(&mut spells, now, all))
            .unwrap_or_default()
    }
}

/// Takes the intervals ended by `now` (or all) out of `spells`: one record for each with
/// refusals after its first.
fn ended(spells: &mut HashMap<Kind, Spell>, now: Instant, all: bool) -> Vec<Record> {
    let mut records = Vec::new();
    spells.retain(|kind, spell| {
        if !all && now.duration_since(spell.started) < INTERVAL {
            return true;
        }
        if spell.repeated > 0 {
            records.push((
                "api.refusals_counted",
                json!({
                    "agent": kind.agent.map(|a| a.to_string()), "uid": kind.uid, "op": kind.op,
                    "reason": kind.reason, "count": spell.repeated,
                    "since_ms": spell.started_ms, "until_ms": now_ms(),
                }),
            ));
        }
        false
    });
    records
}

/// The record of a refusal as it happens.
fn first(agent: Option<Uuid>, uid: u32, op: &str, reason: &str) -> Record {
    (
        "api.refused",
        json!({"agent": agent.map(|a| a.to_string()), "uid": uid, "op": op, "reason": reason}),
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code fails loudly")]

    use super::*;

    #[test]
    fn a_flood_is_one_record_then_one_count_per_interval() {
        let refusals = Refusals::default();
        let t0 = Instant::now();
        let mut records = Vec::new();
        for i in 0..10_000u32 {
            let at = t0 + Duration::from_millis(u64::from(i));
            records.extend(refusals.refused(None, 1000, "send", "bad token", at));
        }
        // 10 s of refusals, 1 ms apart: the first, then the first interval's count when the
        // second interval's first refusal comes.
        let at_end = t0 + Duration::from_secs(30);
        records.extend(refusals.ended(at_end, false));
        let events: Vec<&str> = records.iter().map(|(e, _)| *e).collect();
        assert_eq!(
            events,
            ["api.refused", "api.refusals_counted"],
            "{records:?}"
        );
        assert_eq!(records[1].1["count"], 9_999);
        assert!(
            refusals.ended(at_end, true).is_empty(),
            "nothing left to count"
        );

        // Another peer's, another reason's: each its own first record.
        let more = refusals.refused(None, 1001, "send", "bad token", at_end);
        let other = refusals.refused(None, 1000, "send", "not the operator", at_end);
        assert_eq!((more.len(), other.len()), (1, 1));
        // At stop, a count not yet recorded is (a single refusal has none).
        refusals.refused(None, 1001, "send", "bad token", at_end);
        let stop = refusals.ended(at_end, true);
        assert_eq!(stop.len(), 1);
        assert_eq!(stop[0].1["count"], 1);
    }

    #[test]
    fn kinds_beyond_the_bound_are_counted_as_one() {
        let refusals = Refusals::default();
        let now = Instant::now();
        let mut records = 0;
        for _ in 0..3 * MAX_KINDS {
            let varied = format!("an agent pulls only its own, not {}'s", Uuid::now_v7());
            records += refusals
                .refused(None, 1000, "held.pull", &varied, now)
                .len();
        }
        assert_eq!(records, MAX_KINDS + 1, "the bound, and one for the rest");
        let counted = refusals.ended(now, true);
        assert_eq!(counted.len(), 1);
        assert_eq!(counted[0].1["count"], 2 * MAX_KINDS - 1);
    }
}
