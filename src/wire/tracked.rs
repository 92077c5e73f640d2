//! The sender's record of where one of its messages is: kept in the state store, advanced by
//! publisher confirms and by the owner's delivery receipts, read by `fleetd delivery ID`.
//!
//! Stored as one rank byte followed by JSON: the store keeps a new record only when its rank is
//! higher, so states only move forward (queued → in the broker → delivered → acknowledged, or
//! failed or refused), whatever order reports arrive in.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{DeliveryState, Party};

/// Where a sent message is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Tracked {
    /// The target agent.
    pub to: Uuid,
    /// The local agent that sent it, when one did (an agent may follow only its own messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Uuid>,
    /// The fleet (and host, where known) it was sent to; receipts must come from that fleet.
    pub dest: Party,
    /// Its state.
    pub state: DeliveryState,
    /// `false` while only in the local outbox; `true` once the broker confirmed it.
    pub in_broker: bool,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When this state was reached, Unix milliseconds.
    pub at_ms: i64,
    /// Set while the broker refuses it (a nack that does not show its inbox full: a quorum
    /// queue changing leader, say): since when, Unix milliseconds. It stays in the outbox and
    /// goes again with backoff; its state is not known until the broker takes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retrying_since_ms: Option<i64>,
}

impl Tracked {
    /// The order states may move in (failed and refused are final). Retrying (refused by the
    /// broker, still in the outbox) ranks between queued and in the broker: records written
    /// before it existed only ever rise against the new numbers (an old 2, in the broker, is
    /// overwritten by nothing lower than in the broker).
    pub fn rank(&self) -> u8 {
        match (self.state, self.in_broker, self.retrying_since_ms) {
            (DeliveryState::Queued, false, None) => 1,
            (DeliveryState::Queued, false, Some(_)) => 2,
            (DeliveryState::Queued, true, _) => 3,
            (DeliveryState::Delivered, ..) => 4,
            (DeliveryState::Acknowledged, ..) => 5,
            (DeliveryState::Failed | DeliveryState::Refused, ..) => 6,
        }
    }

    /// The same record refused by the broker at `at_ms` and waiting to go again; unchanged when
    /// it is already retrying (the first refusal's time stays) or past the outbox.
    pub fn retrying(&self, why: &str, at_ms: i64) -> Tracked {
        if self.state != DeliveryState::Queued || self.in_broker || self.retrying_since_ms.is_some()
        {
            return self.clone();
        }
        Tracked {
            reason: Some(format!(
                "unknown since {}, retrying: {why}",
                super::utc(at_ms)
            )),
            retrying_since_ms: Some(at_ms),
            at_ms,
            ..self.clone()
        }
    }

    /// The stored form: rank byte, then JSON.
    pub fn encode(&self) -> Vec<u8> {
        let mut bytes = vec![self.rank()];
        bytes.extend(serde_json::to_vec(self).unwrap_or_default());
        bytes
    }

    /// Reads the stored form back.
    pub fn decode(bytes: &[u8]) -> Option<Tracked> {
        serde_json::from_slice(bytes.get(1..)?).ok()
    }

    /// The same record moved to `state` at `at_ms`.
    pub fn moved(&self, state: DeliveryState, reason: Option<String>, at_ms: i64) -> Tracked {
        Tracked {
            state,
            in_broker: self.in_broker || state != DeliveryState::Queued,
            reason,
            at_ms,
            retrying_since_ms: None,
            ..self.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_rank_in_delivery_order_and_round_trip() {
        let queued = Tracked {
            to: Uuid::now_v7(),
            from: None,
            dest: Party {
                fleet: "f".to_owned(),
                host: String::new(),
            },
            state: DeliveryState::Queued,
            in_broker: false,
            reason: None,
            at_ms: 1,
            retrying_since_ms: None,
        };
        let in_broker = Tracked {
            in_broker: true,
            ..queued.clone()
        };
        let delivered = queued.moved(DeliveryState::Delivered, None, 2);
        let acked = delivered.moved(DeliveryState::Acknowledged, None, 3);
        let failed = queued.moved(DeliveryState::Failed, Some("no such agent".to_owned()), 4);
        let retrying = queued.retrying("refused", 5);
        assert_eq!(
            retrying.reason.as_deref(),
            Some("unknown since 1970-01-01T00:00:00Z, retrying: refused")
        );
        assert_eq!(
            retrying.retrying("again", 9),
            retrying,
            "the first refusal stays"
        );
        // The pump's settle: confirmed, so in the broker.
        let mut taken = retrying.moved(DeliveryState::Queued, None, 6);
        taken.in_broker = true;
        assert!(taken.retrying_since_ms.is_none() && taken.reason.is_none());
        assert!(taken.rank() > retrying.rank());
        let ranks: Vec<u8> = [&queued, &retrying, &in_broker, &delivered, &acked, &failed]
            .iter()
            .map(|t| t.rank())
            .collect();
        assert_eq!(ranks, vec![1, 2, 3, 4, 5, 6]);
        assert!(delivered.in_broker, "a delivered message went through");
        assert_eq!(Tracked::decode(&failed.encode()), Some(failed));
    }

    #[test]
    fn dates_are_utc() {
        use crate::wire::utc;
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(utc(1_796_454_601_999), "2026-12-05T07:10:01Z");
    }
}
