//! Envelope bodies: one JSON object per kind, each with `"v": 1`. Unknown fields and unknown
//! versions are refused with a reason; sizes are bounded.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{Kind, VERSION};

/// Longest agent message text in bytes.
pub const MAX_TEXT: usize = 64 * 1024;
/// Most agents one presence beat may announce.
pub const MAX_AGENTS: usize = 1024;
/// Most further messages one delivery receipt reports on (`more`).
pub const MAX_RECEIPT_MORE: usize = 255;

/// A message for an agent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentMessage {
    /// Body version.
    pub v: u32,
    /// The target agent's global id.
    pub to: Uuid,
    /// The sending agent, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Uuid>,
    /// The text.
    pub text: String,
}

/// A request to launch a profile; the origin comes from the transport, never from here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnRequest {
    /// Body version.
    pub v: u32,
    /// The profile asked for.
    pub profile: String,
    /// Requested environment (checked by the receiving host's policy).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory relative to the profile's root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// A display label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// The agent of the requesting host that asks (the new agent's spawner, which may message
    /// it); absent: that host's operator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<Uuid>,
}

/// How a spawn request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum SpawnOutcome {
    /// Launched and ready.
    Started,
    /// Refused by policy.
    Refused,
    /// Allowed but could not be launched or did not become ready.
    Failed,
}

impl SpawnOutcome {
    /// Its name, as JSON writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            SpawnOutcome::Started => "started",
            SpawnOutcome::Refused => "refused",
            SpawnOutcome::Failed => "failed",
        }
    }
}

/// The reply to a spawn request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnReply {
    /// Body version.
    pub v: u32,
    /// The request's message id.
    pub request: Uuid,
    /// What happened.
    pub outcome: SpawnOutcome,
    /// The new agent's global id (started only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Uuid>,
    /// Why (refused or failed), one line each.
    #[serde(default)]
    pub reasons: Vec<String>,
}

/// One agent in a presence beat.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentEntry {
    /// Global id.
    pub id: Uuid,
    /// Display name.
    pub name: String,
    /// Profile it runs.
    pub profile: String,
    /// Status (`starting`, `ready`, `busy`, `blocked`, `exited`).
    pub status: String,
    /// Since when, Unix milliseconds.
    pub since: i64,
}

/// A roster heartbeat: the sending host and its agents.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PresenceBeat {
    /// Body version.
    pub v: u32,
    /// Random per process start: a new boot resets the sequence.
    pub boot: Uuid,
    /// Increases with every beat of one boot.
    pub seq: u64,
    /// The host is stopping.
    #[serde(default)]
    pub leaving: bool,
    /// Its agents.
    pub agents: Vec<AgentEntry>,
}

/// Where a message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryState {
    /// In the broker, not yet taken by the owning host.
    Queued,
    /// Injected into the agent's pane, or held for the primary.
    Delivered,
    /// Held message pulled and acknowledged by the primary.
    Acknowledged,
    /// Will not be delivered; see the reason.
    Failed,
    /// The receiving host's policy refused it; see the reason.
    Refused,
}

impl DeliveryState {
    /// Its name, as JSON writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Queued => "queued",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Acknowledged => "acknowledged",
            DeliveryState::Failed => "failed",
            DeliveryState::Refused => "refused",
        }
    }
}

/// A report on a message's delivery state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryReceipt {
    /// Body version.
    pub v: u32,
    /// The message reported on.
    pub message: Uuid,
    /// Its state.
    pub state: DeliveryState,
    /// Why it failed (`no such agent`, `inbox full`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Further messages in the same state, for the same reason: a receiving gateway answers the
    /// messages one window brought from one sender with one receipt (at most
    /// [`MAX_RECEIPT_MORE`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more: Vec<Uuid>,
}

impl DeliveryReceipt {
    /// Every message it reports on: `message`, then `more`.
    pub fn messages(&self) -> impl Iterator<Item = Uuid> + '_ {
        std::iter::once(self.message).chain(self.more.iter().copied())
    }
}

/// A decoded body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// See [`AgentMessage`].
    AgentMessage(AgentMessage),
    /// See [`SpawnRequest`].
    SpawnRequest(SpawnRequest),
    /// See [`SpawnReply`].
    SpawnReply(SpawnReply),
    /// See [`PresenceBeat`].
    PresenceBeat(PresenceBeat),
    /// See [`DeliveryReceipt`].
    DeliveryReceipt(DeliveryReceipt),
}

impl Payload {
    /// The kind of this payload.
    pub fn kind(&self) -> Kind {
        match self {
            Payload::AgentMessage(_) => Kind::AgentMessage,
            Payload::SpawnRequest(_) => Kind::SpawnRequest,
            Payload::SpawnReply(_) => Kind::SpawnReply,
            Payload::PresenceBeat(_) => Kind::PresenceBeat,
            Payload::DeliveryReceipt(_) => Kind::DeliveryReceipt,
        }
    }

    /// The JSON bytes of the body.
    pub fn encode(&self) -> Vec<u8> {
        let value = match self {
            Payload::AgentMessage(b) => serde_json::to_vec(b),
            Payload::SpawnRequest(b) => serde_json::to_vec(b),
            Payload::SpawnReply(b) => serde_json::to_vec(b),
            Payload::PresenceBeat(b) => serde_json::to_vec(b),
            Payload::DeliveryReceipt(b) => serde_json::to_vec(b),
        };
        // Serializing these plain structs cannot fail; an empty body would fail verification.
        value.unwrap_or_default()
    }

    /// Decodes a body of `kind`; the caller has checked its size.
    pub fn decode(kind: Kind, bytes: &[u8]) -> Result<Payload, BodyError> {
        let version = serde_json::from_slice::<serde_json::Value>(bytes)
            .map_err(|e| BodyError::NotJson {
                line: e.line(),
                column: e.column(),
            })?
            .get("v")
            .and_then(serde_json::Value::as_u64);
        match version {
            Some(v) if v == u64::from(VERSION) => {}
            Some(v) => return Err(BodyError::Version(v)),
            None => return Err(BodyError::NoVersion),
        }
        let shape = |e: serde_json::Error| {
            let text = e.to_string();
            // serde names the field (`unknown field `x``); drop the position suffix.
            BodyError::Shape(
                text.split(" at line")
                    .next()
                    .unwrap_or("invalid body")
                    .to_owned(),
            )
        };
        let payload = match kind {
            Kind::AgentMessage => {
                Payload::AgentMessage(serde_json::from_slice(bytes).map_err(shape)?)
            }
            Kind::SpawnRequest => {
                Payload::SpawnRequest(serde_json::from_slice(bytes).map_err(shape)?)
            }
            Kind::SpawnReply => Payload::SpawnReply(serde_json::from_slice(bytes).map_err(shape)?),
            Kind::PresenceBeat => {
                Payload::PresenceBeat(serde_json::from_slice(bytes).map_err(shape)?)
            }
            Kind::DeliveryReceipt => {
                Payload::DeliveryReceipt(serde_json::from_slice(bytes).map_err(shape)?)
            }
        };
        match &payload {
            Payload::AgentMessage(m) if m.text.len() > MAX_TEXT => Err(BodyError::TextTooLong),
            Payload::PresenceBeat(b) if b.agents.len() > MAX_AGENTS => {
                Err(BodyError::TooManyAgents)
            }
            Payload::DeliveryReceipt(r) if r.more.len() > MAX_RECEIPT_MORE => {
                Err(BodyError::TooManyReceipts)
            }
            _ => Ok(payload),
        }
    }
}

/// Why a body does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// Not JSON at all.
    #[error("body is not JSON (line {line}, column {column})")]
    NotJson {
        /// Where the JSON broke: line.
        line: usize,
        /// Column.
        column: usize,
    },
    /// A version this build does not read.
    #[error("unknown body version {0} (this build reads {VERSION})")]
    Version(u64),
    /// No `v` field.
    #[error("body has no version `v`")]
    NoVersion,
    /// JSON of the wrong shape for its kind (serde's words, without a position).
    #[error("{0}")]
    Shape(String),
    /// A message's text over [`MAX_TEXT`].
    #[error("message text longer than {MAX_TEXT} bytes")]
    TextTooLong,
    /// A beat with more than [`MAX_AGENTS`] agents.
    #[error("more than {MAX_AGENTS} agents in one beat")]
    TooManyAgents,
    /// A receipt for more than `MAX_RECEIPT_MORE + 1` messages.
    #[error("more than {} messages in one receipt", MAX_RECEIPT_MORE + 1)]
    TooManyReceipts,
}
