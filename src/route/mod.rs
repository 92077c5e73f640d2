//! Routing: the one fork — the target agent is here ? deliver locally : publish to its owner —
//! and the interface the local API uses to send, pull, acknowledge and follow deliveries.
//!
//! Imports: `roster` (where agents are), `mailbox` and `wire` (what replies carry). Never the
//! broker: the daemon implements [`Router`] with it.

pub mod reply;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::roster::HostId;

/// Where a message for an agent goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// The agent is on this host.
    Local,
    /// The agent is in this fleet: its inbox (the host, where the roster knows it).
    Fleet {
        /// The owning host, if known.
        host: Option<String>,
    },
    /// The agent is on a host of another fleet: through that fleet's ingress exchange.
    Foreign(HostId),
}

/// Decides the route of a message to agent `to`: `local` when it is a local agent, else where the
/// roster places it; an agent the roster does not know is tried in this fleet, where a missing
/// inbox comes back as "no such agent".
pub fn decide(local: bool, located: Option<HostId>, own_fleet: &str) -> Route {
    match located {
        _ if local => Route::Local,
        Some(host) if host.fleet != own_fleet => Route::Foreign(host),
        Some(host) => Route::Fleet {
            host: Some(host.host),
        },
        None => Route::Fleet { host: None },
    }
}

/// What a spawn asks for: the policy request's fields, and where. The local API's `spawn`
/// carries it (`api::Request::Spawn`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpawnAsk {
    /// The profile.
    pub profile: String,
    /// Variables the request sets (the policy decides which it may).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The working directory, inside the profile's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// The agent's name on the host that runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Another host to run it on (this host when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// That host's fleet (found in the roster when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<String>,
    /// The local agent the new agent answers to: its spawner, which may message it (and hear
    /// from it) without a `[[message]]` rule. An agent's token always spawns for that agent; the
    /// operator may name one of this host's agents (the primary's mailbox), or none.
    #[serde(default, rename = "for", skip_serializing_if = "Option::is_none")]
    pub for_agent: Option<Uuid>,
}

/// Why the gateway could not do what the local API asked.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// The request names something malformed or absent (an agent name, a profile's fields).
    #[error("{0}")]
    Invalid(String),
    /// The target is on another host, and this one runs without a broker.
    #[error(
        "{what}: single-host mode has no broker to reach other hosts (configure `fleet` and a broker)"
    )]
    NoBroker {
        /// What needed the broker.
        what: String,
    },
    /// The caller may not do this (a token refused, or an operation outside its capability).
    #[error("refused: {0}")]
    Refused(String),
    /// The durable store or the delivery path failed.
    #[error("{0}")]
    Failed(String),
}

/// What the local API asks of the gateway, answered with the typed replies of [`reply`].
pub trait Router: Send + Sync {
    /// The local agent named `name` (created, with a new global id, if needed).
    fn open_agent(&self, name: &str) -> Result<Uuid, RouterError>;
    /// Sends `text` to agent `to`; returns the message id and how it was routed.
    fn send(&self, to: Uuid, from: Option<Uuid>, text: String) -> Result<reply::Sent, RouterError>;
    /// Up to `limit` held messages, oldest first (for agent `to` if given). With an agent and
    /// none held, waits up to `wait` for one to arrive and answers as soon as it does.
    fn held(
        &self,
        limit: usize,
        to: Option<Uuid>,
        wait: std::time::Duration,
    ) -> Result<Vec<crate::mailbox::Held>, RouterError>;
    /// Acknowledges a held message (only one held for agent `only_for`, when given); `false`
    /// when none was held.
    fn ack(&self, id: Uuid, only_for: Option<Uuid>) -> Result<bool, RouterError>;
    /// The delivery state of a message this host sent (only one agent `sent_by` sent, when
    /// given).
    fn delivery(
        &self,
        id: Uuid,
        sent_by: Option<Uuid>,
    ) -> Result<Option<reply::Delivery>, RouterError>;
    /// The local agent whose capability token `token` is, while its agent runs; the reason
    /// otherwise.
    fn authenticate(&self, token: &secrecy::SecretString) -> Result<Uuid, RouterError>;
    /// Records a refused local API request (from peer uid `uid`) in the audit log.
    fn refused(&self, agent: Option<Uuid>, uid: u32, op: &str, reason: &str);
    /// Runs the spawn pipeline for a request made on this host, or asks another host; the
    /// outcome with its reasons. `by`: the local agent asking with its token (its profile's
    /// `may_spawn` must name the profile), or the operator.
    fn spawn(&self, ask: &SpawnAsk, by: Option<Uuid>) -> Result<reply::Spawned, RouterError>;
    /// The operator clears local agent `id`'s prompt (written on its terminal by someone else):
    /// its held messages are typed again; the line dismissed.
    fn unblock(&self, id: Uuid) -> Result<reply::Unblocked, RouterError>;
    /// Why each local agent that is `blocked` or `down` is so (for this host's operator).
    fn notes(&self) -> Vec<(Uuid, String)>;
    /// Puts this host's agents into the roster as they are this moment (a roster read then
    /// says `blocked` as soon as the injector holds a message, not at the next announcement).
    fn refresh_local(&self);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(fleet: &str, host: &str) -> HostId {
        HostId {
            fleet: fleet.to_owned(),
            host: host.to_owned(),
        }
    }

    #[test]
    fn local_agents_win_then_the_roster_places_the_rest() {
        assert_eq!(decide(true, Some(host("b", "x")), "a"), Route::Local);
        assert_eq!(
            decide(false, Some(host("b", "x")), "a"),
            Route::Foreign(host("b", "x"))
        );
        assert_eq!(
            decide(false, Some(host("a", "y")), "a"),
            Route::Fleet {
                host: Some("y".to_owned())
            }
        );
        assert_eq!(decide(false, None, "a"), Route::Fleet { host: None });
    }
}
