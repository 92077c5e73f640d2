//! Envelopes: what crosses the broker. Versioned JSON bodies with a size limit checked before
//! parsing, and an Ed25519 signature by the origin host over a canonical encoding of the
//! envelope's metadata and the SHA-256 of its body (DESIGN.md "Origin authenticity", check 3).
//!
//! Imports: nothing from the crate (a leaf; the host key is a `secrecy` value of its own). Never
//! `broker` or `pane`: the broker maps
//! [`Meta`] onto AMQP properties and headers.

mod body;
mod key;
mod seal;
mod tracked;

#[cfg(test)]
mod tests;

pub use body::{
    AgentEntry, AgentMessage, BodyError, DeliveryReceipt, DeliveryState, MAX_AGENTS,
    MAX_RECEIPT_MORE, MAX_TEXT, Payload, PresenceBeat, SpawnOutcome, SpawnReply, SpawnRequest,
};
pub use key::{HostKey, KeyError, PinnedKeys, PublicKey};
pub use seal::{
    MemoryReplayCache, Refusal, ReplayCache, Sealed, Window, seal, verify, verify_authentic,
};
pub use tracked::Tracked;

/// The wall clock now, Unix milliseconds (0 before 1970, saturated far in the future).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Unix milliseconds as `YYYY-MM-DDTHH:MM:SSZ` (UTC; the proleptic Gregorian calendar).
pub fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

use uuid::Uuid;

/// The protocol tag every signature starts with.
pub const PROTOCOL: &str = "fleetd/v1";
/// The only body version this build reads and writes.
pub const VERSION: u32 = 1;
/// Largest body accepted, checked before parsing.
pub const MAX_BODY: usize = 256 * 1024;
/// Longest an envelope may be valid (`expires - created`): a message may wait this long in an
/// outbox or a queue (a broker outage, a host down) and still be taken in, and the replay cache
/// keeps each accepted (key id, message id) until the envelope has expired — so freshness is
/// bounded by expiry and the replay cache, never by when the sender queued it.
pub const MAX_LIFETIME_MS: i64 = 24 * 3600 * 1000;

/// Who sent an envelope, or to whom it goes.
#[derive(
    Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct Party {
    /// Fleet (broker vhost and user).
    pub fleet: String,
    /// Host within the fleet; empty when addressed to a fleet's agent by id.
    pub host: String,
}

/// What an envelope carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Kind {
    /// A message to an agent.
    #[serde(rename = "agent.message")]
    AgentMessage,
    /// A request to launch a profile.
    #[serde(rename = "spawn.request")]
    SpawnRequest,
    /// The outcome of a spawn request.
    #[serde(rename = "spawn.reply")]
    SpawnReply,
    /// A roster heartbeat.
    #[serde(rename = "presence.beat")]
    PresenceBeat,
    /// A delivery state report.
    #[serde(rename = "delivery.receipt")]
    DeliveryReceipt,
}

impl Kind {
    /// The AMQP `type` property value.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::AgentMessage => "agent.message",
            Kind::SpawnRequest => "spawn.request",
            Kind::SpawnReply => "spawn.reply",
            Kind::PresenceBeat => "presence.beat",
            Kind::DeliveryReceipt => "delivery.receipt",
        }
    }

    /// Parses an AMQP `type` property value.
    pub fn parse(text: &str) -> Option<Kind> {
        [
            Kind::AgentMessage,
            Kind::SpawnRequest,
            Kind::SpawnReply,
            Kind::PresenceBeat,
            Kind::DeliveryReceipt,
        ]
        .into_iter()
        .find(|k| k.as_str() == text)
    }
}

/// Everything about an envelope except its body and signature.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Meta {
    /// Envelope version.
    pub version: u32,
    /// Message id (UUIDv7): the dedupe and replay key.
    pub id: Uuid,
    /// What the body is.
    pub kind: Kind,
    /// The sending host (its key signs).
    pub origin: Party,
    /// The destination.
    pub dest: Party,
    /// The id of the origin host's key.
    pub key_id: String,
    /// Creation time, Unix milliseconds.
    pub created_ms: i64,
    /// Expiry time, Unix milliseconds.
    pub expires_ms: i64,
}
