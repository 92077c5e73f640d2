//! Taking a delivery in: the broker-attested origin first, then the envelope, then one durable
//! transaction that records it as seen and holds it for local delivery. Only then is it acked.
//!
//! 1. The exchange it came through names the origin fleet (`x.in.O` ⇒ O, anything else ⇒ this
//!    fleet) — attested by broker permissions.
//! 2. `user_id` must be present (the broker validates it only when set) and equal that fleet.
//! 3. The envelope's claimed origin fleet must equal it too.
//! 4. Signature by the pinned key of the claimed host, time window (`wire::verify_authentic`).
//! 5. Replay and dedupe are one check, recorded with the hand-off in the same transaction.
//!
//! A refused message is acknowledged and dropped by the caller, never rejected with
//! `requeue=false` (LavinMQ honours per-message dead-letter headers).

use std::sync::Arc;

use lapin::BasicProperties;
use uuid::Uuid;

use super::envelope::from_delivery;
use crate::state::{StateError, StateStore};
use crate::wire::{Meta, Payload, PinnedKeys, PresenceBeat, Refusal, Window, verify_authentic};

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
    Malformed(String),
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
    /// The state store could not record it (the caller must not ack: it will be redelivered).
    #[error("cannot record the message")]
    State(#[source] StateError),
}

/// The inbound checks of one gateway.
pub struct Inbound {
    own_fleet: String,
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
            (meta, _) => Err(InboundRefusal::Malformed(format!(
                "`{}` on the roster queue",
                meta.kind.as_str()
            ))),
        }
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
        if user_id != fleet {
            return Err(InboundRefusal::UserIdMismatch {
                exchange: exchange.to_owned(),
                fleet,
                user_id,
            });
        }
        let sealed = from_delivery(properties, body).map_err(InboundRefusal::Malformed)?;
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
            Ok(payload) => Ok((sealed.meta, payload)),
            Err(refusal) if refusal.after_signature() => Err(InboundRefusal::Signed {
                meta: Box::new(sealed.meta),
                refusal,
            }),
            Err(refusal) => Err(InboundRefusal::Envelope(refusal)),
        }
    }

    /// Checks for fleet `own_fleet` with `pins`, a `skew_ms` window and `state`.
    pub fn new(own_fleet: &str, pins: PinnedKeys, skew_ms: i64, state: Arc<StateStore>) -> Inbound {
        Inbound {
            own_fleet: own_fleet.to_owned(),
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
        let new = self
            .state
            .accept_inbound(
                &meta.key_id,
                meta.id,
                meta.expires_ms.saturating_add(self.skew_ms),
                now_ms,
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
