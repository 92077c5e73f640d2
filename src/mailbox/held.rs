//! A held message, typed: what the held store keeps, what the injector types, what a pull
//! answers.

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::Shelf;
use crate::wire::{AgentMessage, Kind, Party, SpawnReply, SpawnRequest};

/// A message held on this host: for a local agent, for the host (a spawn reply), or for the
/// spawn worker (a spawn request).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Held {
    /// The message id.
    pub id: Uuid,
    /// Who sent it (broker-attested fleet, signing host).
    pub origin: Party,
    /// The local agent it is for (spawn replies and requests are for the host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<Uuid>,
    /// Created at, Unix milliseconds.
    pub created_ms: i64,
    /// Its kind and body.
    #[serde(flatten)]
    pub body: HeldBody,
}

/// What a held message carries, with its kind (`kind` and `body` side by side in JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", content = "body")]
pub enum HeldBody {
    /// A message for an agent.
    #[serde(rename = "agent.message")]
    Message(AgentMessage),
    /// Another host asks this one to launch a profile.
    #[serde(rename = "spawn.request")]
    SpawnRequest(SpawnRequest),
    /// Another host's answer to this host's spawn request.
    #[serde(rename = "spawn.reply")]
    SpawnReply(SpawnReply),
}

impl Held {
    /// Its kind.
    pub fn kind(&self) -> Kind {
        match self.body {
            HeldBody::Message(_) => Kind::AgentMessage,
            HeldBody::SpawnRequest(_) => Kind::SpawnRequest,
            HeldBody::SpawnReply(_) => Kind::SpawnReply,
        }
    }

    /// The shelf it waits on: a spawn request on the spawn worker's, a message for an agent on
    /// that agent's, anything else on the host's.
    pub fn shelf(&self) -> Shelf {
        shelf_for(self.kind(), self.to)
    }

    /// The message's text, for an agent message.
    pub fn text(&self) -> Option<&str> {
        match &self.body {
            HeldBody::Message(message) => Some(&message.text),
            _ => None,
        }
    }

    /// The record the held store keeps.
    pub fn encode(&self) -> Vec<u8> {
        // Plain structs of strings and numbers: serializing cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// A record of the held store; `None` for one that does not decode (never written so).
    pub fn decode(bytes: &[u8]) -> Option<Held> {
        serde_json::from_slice(bytes).ok()
    }
}

/// The shelf a message of `kind` for local agent `to` (if any) waits on.
pub fn shelf_for(kind: Kind, to: Option<Uuid>) -> Shelf {
    match (kind, to) {
        (Kind::SpawnRequest, _) => Shelf::Spawn,
        (_, Some(agent)) => Shelf::Agent(agent),
        (_, None) => Shelf::Host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The record keeps the shape held records always had: `kind` and `body` beside the rest,
    /// so records written before the type existed read back.
    #[test]
    fn a_record_of_the_old_shape_reads_back_typed() {
        let to = Uuid::now_v7();
        let old = serde_json::json!({
            "id": Uuid::now_v7().to_string(),
            "kind": "agent.message",
            "origin": {"fleet": "a", "host": "h"},
            "to": to.to_string(),
            "created_ms": 5,
            "body": {"v": 1, "to": to.to_string(), "text": "hi"},
        });
        let held = Held::decode(old.to_string().as_bytes()).expect("an old record decodes");
        assert_eq!(held.text(), Some("hi"));
        assert_eq!(held.kind(), Kind::AgentMessage);
        assert_eq!(held.shelf(), Shelf::Agent(to));
        let again: serde_json::Value = serde_json::from_slice(&held.encode()).unwrap();
        assert_eq!(again, old);
    }
}
