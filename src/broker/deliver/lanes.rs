//! Destinations the broker refuses: a nack without a return says only that the broker did not
//! take a message — RabbitMQ's answer for a full `reject-publish` inbox, and also for a quorum
//! queue without a leader for the moment (seen for ~26 s after a node kill while the queue held
//! nothing). Such an entry stays in the outbox; its lane (vhost and routing key: one queue)
//! rests, with backoff, and is then tested with one message (the oldest) before the rest follow,
//! so that what goes after a refusal goes in the sender's order. Meanwhile the queue's depth is
//! asked (a passive declare): at its limit, the refused messages failed for good (`inbox full`);
//! below it, or when the broker will not say, they stay, retrying.
//!
//! One per connection, like the pump that owns it.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use uuid::Uuid;

/// Where an outbox entry goes: the vhost and the routing key (one queue).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Lane {
    /// The vhost.
    pub(super) vhost: String,
    /// The routing key.
    pub(super) key: String,
}

/// What the broker said of a queue's depth.
pub(super) type Depth = Result<u32, DepthUnknown>;

/// Why a queue's depth is not known (its refused messages keep retrying).
#[derive(Debug, thiserror::Error)]
pub(super) enum DepthUnknown {
    /// No open channel in its vhost to ask on.
    #[error("no channel to ask it on")]
    NoChannel,
    /// The broker refused the passive declare (no such queue, no permission).
    #[error("the broker refused to say: {0}")]
    Refused(#[from] lapin::Error),
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The asking task ended without an answer.
    #[error("no answer")]
    Dropped,
}

/// The first rest after a refusal; doubled with each refused test, up to the link's cap.
const FIRST_REST: Duration = Duration::from_millis(500);

/// A lane the broker refuses now.
#[derive(Debug)]
struct Refusing {
    /// Its entries nacked and waiting to go again.
    refused: BTreeSet<Uuid>,
    /// Refused tests in this spell.
    failures: u32,
    /// Nacks in this spell (for the log).
    nacks: u64,
    /// When the spell began.
    since: Instant,
    /// No test before this.
    until: Instant,
    /// The entry in flight testing the lane.
    probe: Option<Uuid>,
    /// A depth asked and not answered yet.
    depth: Option<oneshot::Receiver<Depth>>,
    /// Whether the depth has been asked since the last refusal.
    asked: bool,
    /// Its rest is over and its entries were unparked: the next scan tests it (until then the
    /// link need not wake for it again).
    woken: bool,
}

/// Whether an entry of a lane may be published now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Admit {
    /// The lane is not refused: publish.
    Go,
    /// The lane's rest is over: publish this one as its test.
    Test,
    /// The lane rests, or its test is in flight: leave it (parked: not listed again until the
    /// lane wakes).
    Park,
}

/// How a refusal spell ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Ended {
    /// Nacks in the spell.
    pub(super) nacks: u64,
    /// How long it lasted.
    pub(super) lasted: Duration,
}

/// The lanes the broker refuses, and the entries parked behind them.
#[derive(Debug, Default)]
pub(super) struct Lanes {
    refusing: HashMap<Lane, Refusing>,
    /// Entries left out of the outbox scan until their lane wakes.
    parked: HashMap<Uuid, Lane>,
}

impl Lanes {
    /// Whether `id` is parked (the pump's outbox scan leaves it out).
    pub(super) fn parked(&self, id: Uuid) -> bool {
        self.parked.contains_key(&id)
    }

    /// Whether any lane is refused.
    pub(super) fn any(&self) -> bool {
        !self.refusing.is_empty()
    }

    /// The earliest moment a resting lane may be tested (the link wakes the pump then).
    pub(super) fn wake_at(&self) -> Option<Instant> {
        self.refusing
            .values()
            .filter(|r| r.probe.is_none() && !r.woken)
            .map(|r| r.until)
            .min()
    }

    /// Unparks the entries of every lane whose rest is over and that has no test in flight, so
    /// the next scan lists them (the oldest becomes the test).
    pub(super) fn wake(&mut self, now: Instant) {
        let mut awake = Vec::new();
        for (lane, refusing) in &mut self.refusing {
            if refusing.probe.is_none() && refusing.until <= now && !refusing.woken {
                refusing.woken = true;
                awake.push(lane.clone());
            }
        }
        if !awake.is_empty() {
            self.parked.retain(|_, lane| !awake.contains(lane));
        }
    }

    /// Whether entry `id` of `lane` may go now ([`Admit::Park`] parks it).
    pub(super) fn admit(&mut self, lane: &Lane, id: Uuid, now: Instant) -> Admit {
        let Some(refusing) = self.refusing.get(lane) else {
            return Admit::Go;
        };
        if refusing.probe.is_none() && refusing.until <= now {
            return Admit::Test;
        }
        self.parked.insert(id, lane.clone());
        Admit::Park
    }

    /// Entry `id` was published as `lane`'s test.
    pub(super) fn testing(&mut self, lane: &Lane, id: Uuid) {
        if let Some(refusing) = self.refusing.get_mut(lane) {
            refusing.probe = Some(id);
            refusing.woken = false;
        }
    }

    /// The broker nacked entry `id` of `lane` without a return. `true` when this starts a
    /// spell (log it). `cap`: the longest rest.
    pub(super) fn refused(&mut self, lane: &Lane, id: Uuid, now: Instant, cap: Duration) -> bool {
        let new = !self.refusing.contains_key(lane);
        let refusing = self.refusing.entry(lane.clone()).or_insert(Refusing {
            refused: BTreeSet::new(),
            failures: 0,
            nacks: 0,
            since: now,
            until: now,
            probe: None,
            depth: None,
            asked: false,
            woken: false,
        });
        refusing.nacks = refusing.nacks.saturating_add(1);
        refusing.refused.insert(id);
        // A new spell, or its test refused: rest longer. Other refusals (entries in flight
        // when the first came back) join the spell without moving its rest.
        if new || refusing.probe == Some(id) {
            refusing.failures = refusing.failures.saturating_add(1);
            let rest = FIRST_REST
                .saturating_mul(2u32.saturating_pow(refusing.failures.saturating_sub(1).min(16)))
                .min(cap.max(FIRST_REST));
            refusing.until = now + rest;
            refusing.probe = None;
            refusing.asked = false;
            refusing.woken = false;
        }
        self.parked.insert(id, lane.clone());
        new
    }

    /// The broker answered an entry of `lane` (an ack, or a return: not a bare nack): a spell,
    /// if there was one, is over and its entries go again, oldest first.
    pub(super) fn answered(&mut self, lane: &Lane, now: Instant) -> Option<Ended> {
        let refusing = self.refusing.remove(lane)?;
        self.parked.retain(|_, parked| parked != lane);
        Some(Ended {
            nacks: refusing.nacks,
            lasted: now.saturating_duration_since(refusing.since),
        })
    }

    /// Lanes whose depth should be asked now (refused since it was last asked, nothing asked
    /// yet); marks them asked.
    pub(super) fn due_for_depth(&mut self) -> Vec<Lane> {
        let mut out = Vec::new();
        for (lane, refusing) in &mut self.refusing {
            if !refusing.asked && refusing.depth.is_none() {
                refusing.asked = true;
                out.push(lane.clone());
            }
        }
        out
    }

    /// A depth was asked for `lane`; its answer arrives on `answer`.
    pub(super) fn asking(&mut self, lane: &Lane, answer: oneshot::Receiver<Depth>) {
        if let Some(refusing) = self.refusing.get_mut(lane) {
            refusing.depth = Some(answer);
        }
    }

    /// Depths answered since the last call, with each lane's refused entries (not in flight).
    pub(super) fn answers(&mut self) -> Vec<(Lane, Depth, Vec<Uuid>)> {
        let mut out = Vec::new();
        for (lane, refusing) in &mut self.refusing {
            let Some(pending) = refusing.depth.as_mut() else {
                continue;
            };
            let depth = match pending.try_recv() {
                Err(oneshot::error::TryRecvError::Empty) => continue,
                Ok(depth) => depth,
                Err(oneshot::error::TryRecvError::Closed) => Err(DepthUnknown::Dropped),
            };
            refusing.depth = None;
            let waiting = refusing
                .refused
                .iter()
                .copied()
                .filter(|id| refusing.probe != Some(*id))
                .collect();
            out.push((lane.clone(), depth, waiting));
        }
        out
    }

    /// Entries of `lane` failed for good (their inbox is full): no longer waiting. The lane
    /// stays refused (what follows it is tested before it goes).
    pub(super) fn failed(&mut self, lane: &Lane, ids: &[Uuid]) {
        if let Some(refusing) = self.refusing.get_mut(lane) {
            for id in ids {
                refusing.refused.remove(id);
            }
        }
        for id in ids {
            self.parked.remove(id);
        }
    }

    /// The lane entry `id` was refused on, if it waits in one (a return read after its nack is
    /// LavinMQ's full inbox).
    pub(super) fn refused_on(&self, id: Uuid) -> Option<Lane> {
        self.refusing
            .iter()
            .find(|(_, r)| r.refused.contains(&id))
            .map(|(lane, _)| lane.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lane(key: &str) -> Lane {
        Lane {
            vhost: "/f".to_owned(),
            key: key.to_owned(),
        }
    }

    const CAP: Duration = Duration::from_secs(30);

    #[test]
    fn a_refused_lane_rests_then_is_tested_by_one_entry_while_others_go() {
        let (a, b) = (lane("agent.b1.x"), lane("ctl.b1"));
        let mut lanes = Lanes::default();
        let t0 = Instant::now();
        let (m1, m2, m3) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        assert!(lanes.refused(&a, m1, t0, CAP), "a spell starts");
        assert!(!lanes.refused(&a, m2, t0, CAP), "the same spell");
        assert!(lanes.parked(m1) && lanes.parked(m2));
        assert_eq!(
            lanes.admit(&b, m3, t0),
            Admit::Go,
            "another queue is not held up"
        );
        assert_eq!(lanes.admit(&a, m3, t0), Admit::Park, "resting");
        assert_eq!(lanes.wake_at(), Some(t0 + FIRST_REST));
        let later = t0 + FIRST_REST;
        lanes.wake(later);
        assert!(!lanes.parked(m1) && !lanes.parked(m2) && !lanes.parked(m3));
        assert_eq!(lanes.wake_at(), None, "woken: the next scan tests it");
        assert_eq!(lanes.admit(&a, m1, later), Admit::Test, "the oldest tests");
        lanes.testing(&a, m1);
        assert_eq!(
            lanes.admit(&a, m2, later),
            Admit::Park,
            "one test at a time"
        );
        assert_eq!(lanes.wake_at(), None, "a test is in flight");
        // The test is refused again: a longer rest.
        assert!(!lanes.refused(&a, m1, later, CAP));
        assert_eq!(lanes.wake_at(), Some(later + FIRST_REST * 2));
        // Then taken: the spell ends and everything parked goes again.
        let ended = lanes.answered(&a, later).unwrap();
        assert_eq!(ended.nacks, 3);
        assert!(!lanes.any() && !lanes.parked(m2));
        assert_eq!(lanes.admit(&a, m2, later), Admit::Go);
        assert_eq!(lanes.answered(&a, later), None, "no spell");
    }

    #[test]
    fn rests_double_up_to_the_cap() {
        let a = lane("agent.b1.x");
        let mut lanes = Lanes::default();
        let mut now = Instant::now();
        let m = Uuid::now_v7();
        lanes.refused(&a, m, now, Duration::from_secs(3));
        let mut rests = Vec::new();
        for _ in 0..5 {
            let until = lanes.wake_at().unwrap();
            rests.push(until - now);
            now = until;
            lanes.wake(now);
            assert_eq!(lanes.admit(&a, m, now), Admit::Test);
            lanes.testing(&a, m);
            lanes.refused(&a, m, now, Duration::from_secs(3));
        }
        assert_eq!(
            rests,
            [500, 1000, 2000, 3000, 3000].map(Duration::from_millis)
        );
    }

    #[test]
    fn each_refusal_round_asks_the_depth_once_and_answers_name_the_waiting_entries() {
        let a = lane("agent.b1.x");
        let mut lanes = Lanes::default();
        let now = Instant::now();
        let (m1, m2) = (Uuid::now_v7(), Uuid::now_v7());
        lanes.refused(&a, m1, now, CAP);
        lanes.refused(&a, m2, now, CAP);
        assert_eq!(lanes.due_for_depth(), vec![a.clone()]);
        assert!(lanes.due_for_depth().is_empty(), "asked once");
        let (tx, rx) = oneshot::channel();
        lanes.asking(&a, rx);
        assert!(lanes.answers().is_empty(), "not answered yet");
        tx.send(Ok(10_000)).unwrap();
        let answers = lanes.answers();
        assert!(
            matches!(answers.as_slice(), [(lane, Ok(10_000), waiting)] if *lane == a && *waiting == [m1, m2]),
            "{answers:?}"
        );
        lanes.failed(&a, &[m1, m2]);
        assert!(!lanes.parked(m1) && lanes.refused_on(m1).is_none());
        assert!(
            lanes.any(),
            "the lane stays refused until the broker takes one"
        );
    }
}
