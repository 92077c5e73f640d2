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
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
}

impl Tracked {
    /// The order states may move in (failed and refused are final).
    pub fn rank(&self) -> u8 {
        match (self.state, self.in_broker) {
            (DeliveryState::Queued, false) => 1,
            (DeliveryState::Queued, true) => 2,
            (DeliveryState::Delivered, _) => 3,
            (DeliveryState::Acknowledged, _) => 4,
            (DeliveryState::Failed | DeliveryState::Refused, _) => 5,
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
        };
        let in_broker = Tracked {
            in_broker: true,
            ..queued.clone()
        };
        let delivered = queued.moved(DeliveryState::Delivered, None, 2);
        let acked = delivered.moved(DeliveryState::Acknowledged, None, 3);
        let failed = queued.moved(DeliveryState::Failed, Some("no such agent".to_owned()), 4);
        let ranks: Vec<u8> = [&queued, &in_broker, &delivered, &acked, &failed]
            .iter()
            .map(|t| t.rank())
            .collect();
        assert_eq!(ranks, vec![1, 2, 3, 4, 5]);
        assert!(delivered.in_broker, "a delivered message went through");
        assert_eq!(Tracked::decode(&failed.encode()), Some(failed));
    }
}
