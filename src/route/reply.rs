//! The local API's replies: one type per operation, serialized by the server, read by the CLI
//! and returned by `fleetd mcp` as its tools' structured output (their output schemas derive
//! from these types). An error is not a reply: the server answers `{"error": "…"}`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::mailbox::Held;
use crate::roster::{PeerState, Row};
use crate::wire::{SpawnOutcome, Tracked};

/// `status`: the host, the broker link and the sandbox level.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Status {
    /// This host's name.
    pub host: String,
    /// The broker link, in one line (`broker: not configured (single-host mode)` without one).
    pub broker: String,
    /// The sandbox fleetd itself runs in.
    pub sandbox: String,
}

/// `roster`: every host heard from, this one first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Roster {
    /// The hosts.
    pub hosts: Vec<RosterHost>,
}

/// One host in the roster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RosterHost {
    /// Its fleet.
    pub fleet: String,
    /// Its name.
    pub host: String,
    /// `alive`, or `suspect` (silent for a while).
    pub state: PeerState,
    /// Its agents, as it last announced them.
    pub agents: Vec<RosterAgent>,
}

/// One agent in the roster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RosterAgent {
    /// Its global id: the target of `send`.
    pub id: Uuid,
    /// Its name on its host.
    pub name: String,
    /// The profile it runs.
    pub profile: String,
    /// `starting`, `ready`, `busy`, `blocked`, `exited` or `down`.
    pub status: String,
    /// Since when, Unix milliseconds.
    pub since: i64,
    /// Why it is `blocked` or `down` (this host's agents, for its operator only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

impl Roster {
    /// The roster's rows as the reply shows them; `notes` (agent → why) are put on their
    /// agents.
    pub fn of(rows: Vec<Row>, notes: &[(Uuid, String)]) -> Roster {
        let hosts = rows
            .into_iter()
            .map(|row| RosterHost {
                state: row.state,
                fleet: row.fleet,
                host: row.host,
                agents: row
                    .agents
                    .into_iter()
                    .map(|agent| RosterAgent {
                        why: notes
                            .iter()
                            .find(|(id, _)| *id == agent.id)
                            .map(|(_, why)| why.clone()),
                        id: agent.id,
                        name: agent.name,
                        profile: agent.profile,
                        status: agent.status,
                        since: agent.since,
                    })
                    .collect(),
            })
            .collect();
        Roster { hosts }
    }
}

/// `agent.open`: the mailbox's global id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Opened {
    /// Its global id.
    pub id: Uuid,
}

/// How a message was routed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Routed {
    /// To an agent of this host, without the broker.
    Local,
    /// Through the broker, to a host of this fleet.
    Fleet,
    /// Through the broker, to a host of another fleet.
    Foreign,
}

impl Routed {
    /// Its name, as JSON writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Routed::Local => "local",
            Routed::Fleet => "fleet",
            Routed::Foreign => "foreign",
        }
    }
}

/// `send`: the message id and how it went.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Sent {
    /// The message id, for `delivery`.
    pub id: Uuid,
    /// `local`, `fleet` or `foreign`.
    pub route: Routed,
}

/// `held.pull`: held messages, oldest first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Pulled {
    /// Each with its id, kind, origin (fleet, host), the agent it is for, when it was created
    /// and its body (an agent message's `text` and sender, or a spawn reply).
    pub messages: Vec<Held>,
}

/// `held.ack`: whether the message was held.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Acked {
    /// `false`: already acknowledged, or never held (for this agent).
    pub acknowledged: bool,
}

/// `delivery`: where a message this host sent is.
pub type Delivery = Tracked;

/// `spawn`: how it ended. A remote spawn names the host, its fleet and the request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Spawned {
    /// `started`, `refused` or `failed`.
    pub outcome: SpawnOutcome,
    /// The new agent's global id, when started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Uuid>,
    /// Its name on its host (a spawn on this host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The host it was asked of (another host's spawn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// That host's fleet (another host's spawn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<String>,
    /// The request's message id (another host's spawn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<Uuid>,
    /// The deciding host's reasons.
    #[serde(default)]
    pub reasons: Vec<String>,
}

impl Spawned {
    /// Whether the agent started.
    pub fn started(&self) -> bool {
        self.outcome == SpawnOutcome::Started
    }
}

/// `agent.unblock`: the prompt line dismissed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Unblocked {
    /// The agent.
    pub agent: Uuid,
    /// The line it was blocked on.
    pub dismissed: String,
}
