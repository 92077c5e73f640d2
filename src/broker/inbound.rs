//! Taking a delivery in: the broker-attested origin first, then the envelope, then one durable
//! transaction that records it as seen and holds it for local delivery. Only then is it acked.
//!
//! 1. The exchange it came through names the origin fleet (`x.in.O` ⇒ O, anything else ⇒ this
//!    fleet) — attested by broker permissions.
//! 2. `user_id` must be present (the broker validates it only when set) and be that fleet's
//!    user — `FLEET`, or a host user `FLEET.HOST`.
//! 3. The envelope's claimed origin fleet must equal it too, and a host user's host the claimed
//!    origin host (a host's credential speaks only for that host).
//! 4. Signature by the pinned key of the claimed host, time window (`wire::verify_authentic`).
//! 5. Replay and dedupe are one check, recorded with the hand-off in the same transaction.
//!
//! A refused message is acknowledged and dropped by the caller, never rejected with
//! `requeue=false` (LavinMQ honours per-message dead-letter headers).

use std::sync::Arc;

use lapin::BasicProperties;
use uuid::Uuid;

use super::envelope::from_delivery;
use super::grants::split_host_user;
use crate::state::{StateError, StateStore};
use crate::wire::{
    Kind, Meta, Party, Payload, PinnedKeys, PresenceBeat, Refusal, Window, verify_authentic,
};

/// What happened to an accepted delivery.
#[derive(Debug, PartialEq, Eq)]
pub enum Accepted {
    /// New: held for local delivery.
    New(Box<(Meta, Payload)>),
    /// Seen before (redelivery or replay): acknowledge and drop.
    Duplicate(Uuid),
}

/// Why a delivery was refused. Names fleets, hosts and fields; never body content.
#[derive(Debug, thiserror::Error)]
pub enum InboundRefusal {
    /// No `user_id`: the broker validated nothing.
    #[error("message without user_id")]
    NoUserId,
    /// `user_id` is not the fleet the exchange stands for.
    #[error("user_id `{user_id}` does not match fleet `{fleet}` of exchange `{exchange}`")]
    UserIdMismatch {
        /// The delivery's exchange.
        exchange: String,
        /// The fleet it stands for.
        fleet: String,
        /// The message's user_id.
        user_id: String,
    },
    /// A host user published an envelope claiming another host.
    #[error("user_id `{user_id}` belongs to host `{host}`; the envelope claims host `{claimed}`")]
    HostMismatch {
        /// The message's user_id.
        user_id: String,
        /// The host it belongs to.
        host: String,
        /// The claimed origin host.
        claimed: String,
    },
    /// The envelope claims another origin fleet than the broker attests.
    #[error("the envelope claims fleet `{claimed}`, the broker attests `{fleet}`")]
    OriginMismatch {
        /// Attested fleet.
        fleet: String,
        /// Claimed fleet.
        claimed: String,
    },
    /// The properties or headers do not form an envelope.
    #[error("not a fleetd envelope: {0}")]
    Malformed(super::envelope::EnvelopeError),
    /// The envelope failed verification.
    #[error("{0}")]
    Envelope(#[from] Refusal),
    /// The envelope's signature verified, but it was refused after (its window or its body):
    /// its origin is authentic and may be told why.
    #[error("{refusal}")]
    Signed {
        /// The authentic metadata.
        meta: Box<Meta>,
        /// Why it was refused.
        refusal: Refusal,
    },
    /// A pinned peer's authentic envelope addressed to another fleet or host (the destination
    /// is signed): refused before anything acts on it, and never answered — a replay carried
    /// to the wrong host learns nothing. Shown bounded and escaped.
    #[error("addressed to `{}/{}`, not to this host", bounded(&.dest.fleet, 64), bounded(&.dest.host, 64))]
    Misaddressed {
        /// The authentic metadata.
        meta: Box<Meta>,
        /// Where it was addressed (a copy of `meta.dest`, for the message).
        dest: Party,
    },
    /// The state store could not record it (the caller must not ack: it will be redelivered).
    #[error("cannot record the message")]
    State(#[source] StateError),
}

/// At most `max` characters of a foreign-chosen text, escaped: no control characters or line
/// breaks reach a log line or an audit record, and a huge field stays one short line.
pub(crate) fn bounded(text: &str, max: usize) -> String {
    let mut out: String = text
        .chars()
        .take(max)
        .flat_map(char::escape_debug)
        .collect();
    if text.chars().nth(max).is_some() {
        out.push('…');
    }
    out
}

/// The inbound checks of one gateway.
pub struct Inbound {
    own_fleet: String,
    own_host: String,
    pins: PinnedKeys,
    skew_ms: i64,
    state: Arc<StateStore>,
}

impl Inbound {
    /// Checks a presence beat (steps 1–4; beats are soft state: no durable record, the roster's
    /// sequence numbers drop repeats).
    pub fn beat(
        &self,
        exchange: &str,
        properties: &BasicProperties,
        body: &[u8],
        now_ms: i64,
    ) -> Result<(Meta, PresenceBeat), InboundRefusal> {
        match self.authentic(exchange, properties, body, now_ms)? {
            (meta, Payload::PresenceBeat(beat)) => Ok((meta, beat)),
            (meta, _) => Err(InboundRefusal::Malformed(
                super::envelope::EnvelopeError::OffQueue(meta.kind.as_str()),
            )),
        }
    }

    /// Whether an envelope for `dest` of `kind` is for this gateway: its fleet always, its host
    /// exactly — or no host for a presence beat (to the whole fleet). An agent message always
    /// names its host: the broker routes it by host (`agent.HOST.ID`), and one whose sender did
    /// not know the host is routed nowhere.
    fn addressed_here(&self, dest: &Party, kind: Kind) -> bool {
        dest.fleet == self.own_fleet
            && (dest.host == self.own_host || (dest.host.is_empty() && kind == Kind::PresenceBeat))
    }

    /// The allowed clock skew, milliseconds.
    pub fn skew_ms(&self) -> i64 {
        self.skew_ms
    }

    /// Steps 1–4: the broker-attested origin, then the envelope.
    pub(super) fn authentic(
        &self,
        exchange: &str,
        properties: &BasicProperties,
        body: &[u8],
        now_ms: i64,
    ) -> Result<(Meta, Payload), InboundRefusal> {
        let fleet = exchange
            .strip_prefix("x.in.")
            .unwrap_or(&self.own_fleet)
            .to_owned();
        let user_id = properties
            .user_id()
            .as_ref()
            .map(|u| u.as_str().to_owned())
            .ok_or(InboundRefusal::NoUserId)?;
        let (user_fleet, user_host) = match split_host_user(&user_id) {
            Some((fleet, host)) => (fleet, Some(host)),
            None => (user_id.as_str(), None),
        };
        if user_fleet != fleet {
            return Err(InboundRefusal::UserIdMismatch {
                exchange: exchange.to_owned(),
                fleet,
                user_id,
            });
        }
        let sealed = from_delivery(properties, body).map_err(InboundRefusal::Malformed)?;
        if let Some(host) = user_host.filter(|h| *h != sealed.meta.origin.host) {
            return Err(InboundRefusal::HostMismatch {
                host: host.to_owned(),
                claimed: sealed.meta.origin.host.clone(),
                user_id,
            });
        }
        if sealed.meta.origin.fleet != fleet {
            return Err(InboundRefusal::OriginMismatch {
                fleet,
                claimed: sealed.meta.origin.fleet.clone(),
            });
        }
        let window = Window {
            now_ms,
            skew_ms: self.skew_ms,
        };
        match verify_authentic(&sealed, &self.pins, window) {
            Ok(_) if !self.addressed_here(&sealed.meta.dest, sealed.meta.kind) => {
                Err(InboundRefusal::Misaddressed {
                    dest: sealed.meta.dest.clone(),
                    meta: Box::new(sealed.meta),
                })
            }
            Ok(payload) => Ok((sealed.meta, payload)),
            Err(refusal) if refusal.after_signature() => Err(InboundRefusal::Signed {
                meta: Box::new(sealed.meta),
                refusal,
            }),
            Err(refusal) => Err(InboundRefusal::Envelope(refusal)),
        }
    }

    /// Checks for gateway `me` (its fleet and host) with `pins`, a `skew_ms` window and
    /// `state`.
    pub fn new(me: &Party, pins: PinnedKeys, skew_ms: i64, state: Arc<StateStore>) -> Inbound {
        Inbound {
            own_fleet: me.fleet.clone(),
            own_host: me.host.clone(),
            pins,
            skew_ms,
            state,
        }
    }

    /// Checks one delivery and, if new, holds it durably.
    pub fn accept(
        &self,
        exchange: &str,
        properties: &BasicProperties,
        body: &[u8],
        now_ms: i64,
    ) -> Result<Accepted, InboundRefusal> {
        let (meta, payload) = self.authentic(exchange, properties, body, now_ms)?;
        let to = match &payload {
            Payload::AgentMessage(m) => Some(m.to),
            _ => None,
        };
        let new = self
            .state
            .accept_inbound(
                &meta.key_id,
                meta.id,
                meta.expires_ms.saturating_add(self.skew_ms),
                now_ms,
                crate::mailbox::shelf_for(meta.kind, to),
                body,
            )
            .map_err(InboundRefusal::State)?;
        Ok(if new {
            Accepted::New(Box::new((meta, payload)))
        } else {
            Accepted::Duplicate(meta.id)
        })
    }
}
