//! Delivery over the broker (DESIGN.md "Delivery"): where an envelope goes, the outbound pump
//! (outbox → publish on a confirm channel → settle on the broker's answer) and the inbound
//! intake (a window of deliveries verified, then deduplicated, held and answered with receipts
//! in **one** durable transaction — group commit — and only then acknowledged).
//!
//! A message for a local agent is held in the state store: a mailbox agent (the primary) pulls
//! and acknowledges it; a pane agent's is typed by the daemon's injector, which records it
//! delivered in the same step.

mod admit;
mod intake;
mod lanes;
mod pump;
mod settle;

pub use pump::{Outlets, Pump, PumpError};

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use uuid::Uuid;

use super::envelope::OutboxRecord;
use super::topology::{SEND_EXCHANGE, agent_key, control_key, ingress_exchange};
use crate::agent::Registry;
use crate::mailbox::{Arrivals, Held, Mailbox};
use crate::state::{Shelf, StateError, StateStore};
use crate::wire::{
    self, AgentMessage, DeliveryReceipt, DeliveryState, HostKey, Kind, Meta, Party, Payload,
    Sealed, SpawnReply, SpawnRequest, Tracked, now_ms,
};

/// How long an envelope stays valid: long enough to outlast a broker outage in the outbox or a
/// host's downtime in its queue (the longest a receiver accepts).
pub const MESSAGE_TTL_MS: i64 = wire::MAX_LIFETIME_MS;

/// How long a spawn request lives: a little over the longest the requester waits for the reply
/// (290 s). One its gateway cannot take by then expires in the outbox (logged once) instead of
/// being retried for a day.
pub const SPAWN_REQUEST_TTL_MS: i64 = 10 * 60 * 1000;
/// Most outbox entries published per pump round (the rest follow as confirms arrive).
const PUMP_ROUND: usize = 256;
/// Most publishes awaiting the broker's confirm at once: a backlog (after an outage) goes out
/// as a bounded stream, not all at once.
pub const MAX_IN_FLIGHT: usize = 4 * PUMP_ROUND;

/// Where an envelope is published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Address {
    /// The vhost.
    pub vhost: String,
    /// The exchange.
    pub exchange: String,
    /// The routing key.
    pub key: String,
}

/// Why a message could not be queued.
#[derive(Debug, thiserror::Error)]
pub enum CourierError {
    /// The state store refused (full, or failing).
    #[error(transparent)]
    State(#[from] StateError),
    /// The message is malformed.
    #[error("{0}")]
    Invalid(String),
    /// It would leave this host, and this host runs without a broker (single-host mode).
    #[error("single-host mode: nothing leaves this host (no broker, no host key)")]
    NoBroker,
}

/// One gateway's delivery: its identity, key, state and local agents.
pub struct Courier {
    fleet: String,
    host: String,
    vhost: String,
    /// This host's signing key; `None` in single-host mode, where nothing is sealed.
    key: Option<Arc<HostKey>>,
    state: Arc<StateStore>,
    agents: Arc<Registry>,
    /// Woken when the outbox has something to publish.
    pub outbox_ready: Notify,
    /// The host-local mailbox the intake holds into (and local sends use directly).
    mailbox: Arc<Mailbox>,
    /// Where agents were last placed (see [`Courier::placed_at`]), and when it was last stored.
    placements: std::sync::Mutex<HashMap<Uuid, Placed>>,
    /// The policy messages from other hosts are decided by (see [`Courier::use_policy`]).
    policy: std::sync::OnceLock<crate::policy::Current>,
}

/// How long a remembered placement serves.
const PLACEMENT_TTL: std::time::Duration = std::time::Duration::from_secs(600);

/// At most this many placements are remembered.
const MAX_PLACEMENTS: usize = 4096;

/// A placement seen again is written to the state store at most this often (a change of host
/// at once).
const PLACEMENT_STORED_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Where an agent of another host was last seen.
#[derive(Clone, Debug)]
struct Placed {
    party: Party,
    /// When it was seen there.
    at: std::time::Instant,
    /// When it was last written to the state store.
    stored: Option<std::time::Instant>,
}

/// A placement as the state store keeps it (so that it outlives a restart: a message sent
/// right after one, before the first beat, still finds its host).
#[derive(Serialize, Deserialize)]
struct StoredPlacement {
    fleet: String,
    host: String,
    /// When it was seen there, Unix milliseconds.
    at_ms: i64,
}

impl Courier {
    /// The courier of host `host` in `fleet` (own vhost `vhost`); loads the local agents.
    pub fn new(
        fleet: &str,
        host: &str,
        vhost: &str,
        key: Arc<HostKey>,
        state: Arc<StateStore>,
    ) -> Result<Courier, StateError> {
        Courier::open(fleet, host, vhost, Some(key), state)
    }

    /// The courier of a host without a broker: local agents, local sends, held messages and
    /// delivery records; anything that would leave the host is refused with
    /// [`CourierError::NoBroker`].
    pub fn single_host(
        fleet: &str,
        host: &str,
        state: Arc<StateStore>,
    ) -> Result<Courier, StateError> {
        Courier::open(fleet, host, "", None, state)
    }

    fn open(
        fleet: &str,
        host: &str,
        vhost: &str,
        key: Option<Arc<HostKey>>,
        state: Arc<StateStore>,
    ) -> Result<Courier, StateError> {
        let agents = Arc::new(Registry::load(Arc::clone(&state))?);
        let placements = load_placements(&state)?;
        shelve_old_held(&state)?;
        let me = Party {
            fleet: fleet.to_owned(),
            host: host.to_owned(),
        };
        Ok(Courier {
            fleet: fleet.to_owned(),
            host: host.to_owned(),
            vhost: vhost.to_owned(),
            key,
            mailbox: Arc::new(Mailbox::new(me, Arc::clone(&state))),
            state,
            agents,
            outbox_ready: Notify::new(),
            placements: std::sync::Mutex::new(placements),
            policy: std::sync::OnceLock::new(),
        })
    }

    /// Remembers that agent `agent` lives on `host`: seen there by the roster, or the sender of
    /// a verified message from there.
    /// Kept in the state store too (written when it changes, else at most once a minute).
    pub fn remember_placement(&self, agent: Uuid, host: &Party) {
        let now = std::time::Instant::now();
        let store = {
            let Ok(mut placements) = self.placements.lock() else {
                return;
            };
            if placements.len() >= MAX_PLACEMENTS && !placements.contains_key(&agent) {
                placements.retain(|_, placed| placed.at.elapsed() < PLACEMENT_TTL);
                if placements.len() >= MAX_PLACEMENTS {
                    placements.clear();
                }
            }
            let stored = placements
                .get(&agent)
                .filter(|placed| placed.party == *host)
                .and_then(|placed| placed.stored)
                .filter(|at| at.elapsed() < PLACEMENT_STORED_EVERY);
            placements.insert(
                agent,
                Placed {
                    party: host.clone(),
                    at: now,
                    stored: stored.or(Some(now)),
                },
            );
            stored.is_none()
        };
        if store {
            let record = StoredPlacement {
                fleet: host.fleet.clone(),
                host: host.host.clone(),
                at_ms: now_ms(),
            };
            if let Err(error) = self.state.placement_put(agent, &encode(&record)) {
                tracing::debug!(%error, "placement not stored");
            }
        }
    }

    /// Where agent `agent` was last placed, within ten minutes: the fallback when the roster
    /// does not list it — opened less than a beat ago (a reply to a new primary), or its host
    /// reaped during an outage (its control queue keeps the message until it is back). The
    /// roster, where each host announces only itself, wins.
    pub fn placed_at(&self, agent: Uuid) -> Option<Party> {
        let placements = self.placements.lock().ok()?;
        let placed = placements.get(&agent)?;
        (placed.at.elapsed() < PLACEMENT_TTL).then(|| placed.party.clone())
    }

    /// This host.
    pub fn me(&self) -> Party {
        Party {
            fleet: self.fleet.clone(),
            host: self.host.clone(),
        }
    }

    /// The state store.
    pub fn state(&self) -> &Arc<StateStore> {
        &self.state
    }

    /// Who is woken when a message is held for a local recipient.
    pub fn arrivals(&self) -> &Arrivals {
        self.mailbox.arrivals()
    }

    /// The host-local mailbox.
    pub fn mailbox(&self) -> &Arc<Mailbox> {
        &self.mailbox
    }

    /// The local agents (the registry's owner is the daemon; the courier only reads it).
    pub fn agents(&self) -> &Arc<Registry> {
        &self.agents
    }

    fn is_local(&self, id: Uuid) -> bool {
        self.agents.contains(id)
    }

    fn pane_of(&self, id: Uuid) -> Option<String> {
        self.agents.pane_of(id)
    }

    /// A held message was typed into its agent's pane: it leaves the held store and its sender
    /// learns it was delivered (a receipt, or this host's own record), in one transaction.
    pub fn injected(&self, id: Uuid) -> Result<bool, CourierError> {
        self.release_held(id, DeliveryState::Delivered, None)
    }

    /// Where an envelope for `dest` (agent `agent`, if it is for one) is published: anything in
    /// this fleet through `fleet.send`, with key `agent.HOST.ID` for an agent's inbox and
    /// `ctl.HOST` for a gateway; anything in another fleet through that fleet's `x.in.OWN`, to
    /// the owning gateway's control queue. An agent whose host is unknown here gets the key
    /// `agent.ID`, which no host's binding (`agent.HOST.*`, three words or more) matches: it
    /// comes back as "no such agent".
    pub fn address(&self, dest: &Party, agent: Option<Uuid>) -> Address {
        if dest.fleet == self.fleet {
            let key = match agent {
                Some(id) if dest.host.is_empty() => format!("agent.{id}"),
                Some(id) => agent_key(&dest.host, &id.to_string()),
                None => control_key(&dest.host),
            };
            Address {
                vhost: self.vhost.clone(),
                exchange: SEND_EXCHANGE.to_owned(),
                key,
            }
        } else {
            Address {
                vhost: format!("/{}", dest.fleet),
                exchange: ingress_exchange(&self.fleet),
                key: control_key(&dest.host),
            }
        }
    }

    /// Whether this host has a broker (and a key to seal with).
    pub fn has_broker(&self) -> bool {
        self.key.is_some()
    }

    /// Seals `payload` from this host to `dest`, valid for [`MESSAGE_TTL_MS`] (a spawn request
    /// for [`SPAWN_REQUEST_TTL_MS`]).
    pub fn seal(&self, dest: Party, payload: &Payload) -> Result<Sealed, CourierError> {
        let key = self.key.as_ref().ok_or(CourierError::NoBroker)?;
        let lifetime = match payload {
            Payload::SpawnRequest(_) => SPAWN_REQUEST_TTL_MS,
            _ => MESSAGE_TTL_MS,
        };
        let now = now_ms();
        let meta = Meta {
            version: wire::VERSION,
            id: Uuid::now_v7(),
            kind: payload.kind(),
            origin: self.me(),
            dest,
            key_id: String::new(),
            created_ms: now,
            expires_ms: now + lifetime,
        };
        Ok(wire::seal(meta, payload, key))
    }

    /// Queues an agent message for `to` on host `dest` (its host may be unknown in this fleet)
    /// and starts its delivery record; the pump publishes it.
    pub fn send(
        &self,
        dest: Party,
        to: Uuid,
        from: Option<Uuid>,
        text: String,
    ) -> Result<Uuid, CourierError> {
        if dest.fleet != self.fleet && dest.host.is_empty() {
            return Err(CourierError::Invalid(
                "a message to another fleet needs the owning host".to_owned(),
            ));
        }
        let payload = Payload::AgentMessage(AgentMessage {
            v: wire::VERSION,
            to,
            from,
            text,
        });
        let address = self.address(&dest, Some(to));
        let sealed = self.seal(dest.clone(), &payload)?;
        let mut record =
            OutboxRecord::new(&address.vhost, &address.exchange, &address.key, &sealed);
        record.tracked = true;
        let bytes =
            serde_json::to_vec(&record).map_err(|e| CourierError::Invalid(e.to_string()))?;
        let tracked = Tracked {
            to,
            from,
            dest,
            state: DeliveryState::Queued,
            in_broker: false,
            reason: None,
            at_ms: now_ms(),
            retrying_since_ms: None,
        };
        // Published while the disk syncs; the sender hears "accepted" only once it is durable.
        self.state
            .outbox_put_tracked(sealed.meta.id, &bytes, &tracked.encode(), &|| {
                self.outbox_ready.notify_one()
            })?;
        Ok(sealed.meta.id)
    }

    /// Answers a held spawn request: the reply goes to the requesting gateway and the request
    /// leaves the held store, in one transaction.
    pub fn answer_spawn(&self, request: &Held, reply: &SpawnReply) -> Result<(), CourierError> {
        let (id, record) =
            self.to_gateway(request.origin.clone(), &Payload::SpawnReply(reply.clone()))?;
        self.state
            .held_ack_with(request.id, Some((id, record.as_slice())), None)?;
        self.outbox_ready.notify_one();
        Ok(())
    }

    /// Sends a spawn request to gateway `dest`; returns its message id (the reply's `request`).
    pub fn request_spawn(&self, dest: Party, request: SpawnRequest) -> Result<Uuid, CourierError> {
        let (id, record) = self.to_gateway(dest, &Payload::SpawnRequest(request))?;
        self.state.outbox_put(id, &record)?;
        self.outbox_ready.notify_one();
        Ok(id)
    }

    /// Acknowledges a held message: it is not offered again, and its sender learns it was
    /// acknowledged (a receipt queued in the same transaction). `false` when it was not held —
    /// or, with `only_for`, not held for that agent (another agent's messages are not its to
    /// acknowledge, nor to learn about).
    pub fn ack(&self, id: Uuid, only_for: Option<Uuid>) -> Result<bool, CourierError> {
        self.release_held(id, DeliveryState::Acknowledged, only_for)
    }

    /// Takes message `id` out of the held store and tells its sender it reached `state`, in one
    /// transaction: this host's own delivery record moves, or an agent message from another host
    /// gets a receipt. `false` when it was not held (for agent `only_for`, when given).
    fn release_held(
        &self,
        id: Uuid,
        state: DeliveryState,
        only_for: Option<Uuid>,
    ) -> Result<bool, CourierError> {
        let Some(bytes) = self.state.held_get(id)? else {
            return Ok(false);
        };
        let held = Held::decode(&bytes);
        if only_for.is_some() && held.as_ref().and_then(|h| h.to) != only_for {
            return Ok(false);
        }
        let origin = held.as_ref().map(|h| h.origin.clone());
        if origin.as_ref() == Some(&self.me()) {
            let moved = self
                .state
                .delivery_get(id)?
                .and_then(|b| Tracked::decode(&b))
                .map(|t| t.moved(state, None, now_ms()).encode());
            return Ok(self
                .state
                .held_ack_with(id, None, moved.as_deref().map(|m| (id, m)))?);
        }
        let receipt = match (&held, origin) {
            (Some(h), Some(origin)) if h.kind() == Kind::AgentMessage => {
                Some(self.receipt(origin, id, state, None)?)
            }
            _ => None,
        };
        let released = self.state.held_ack_with(
            id,
            receipt
                .as_ref()
                .map(|(rid, bytes)| (*rid, bytes.as_slice())),
            None,
        )?;
        if receipt.is_some() {
            self.outbox_ready.notify_one();
        }
        Ok(released)
    }

    /// An outbox record carrying `payload` to the gateway `dest` (untracked).
    fn to_gateway(&self, dest: Party, payload: &Payload) -> Result<(Uuid, Vec<u8>), CourierError> {
        let address = self.address(&dest, None);
        let sealed = self.seal(dest, payload)?;
        let record = OutboxRecord::new(&address.vhost, &address.exchange, &address.key, &sealed);
        Ok((
            sealed.meta.id,
            serde_json::to_vec(&record).unwrap_or_default(),
        ))
    }

    fn receipt(
        &self,
        dest: Party,
        message: Uuid,
        state: DeliveryState,
        reason: Option<String>,
    ) -> Result<(Uuid, Vec<u8>), CourierError> {
        self.receipt_for(dest, message, Vec::new(), state, reason)
    }

    /// One receipt reporting `message` and `more` (at most [`wire::MAX_RECEIPT_MORE`]) in one
    /// state to the gateway of `dest`.
    fn receipt_for(
        &self,
        dest: Party,
        message: Uuid,
        more: Vec<Uuid>,
        state: DeliveryState,
        reason: Option<String>,
    ) -> Result<(Uuid, Vec<u8>), CourierError> {
        let payload = Payload::DeliveryReceipt(DeliveryReceipt {
            v: wire::VERSION,
            message,
            state,
            reason,
            more,
        });
        self.to_gateway(dest, &payload)
    }
}

/// Puts messages held by a fleetd from before shelves on theirs (once, at open).
fn shelve_old_held(state: &StateStore) -> Result<(), StateError> {
    loop {
        let old = state.held_unshelved(256)?;
        if old.is_empty() {
            return Ok(());
        }
        for (id, bytes) in old {
            // A record that does not decode is offered with the host's.
            let shelf = Held::decode(&bytes).map_or(Shelf::Host, |held| held.shelf());
            state.held_shelve(id, shelf)?;
        }
    }
}

/// The placements the state store kept that are still young enough to serve.
fn load_placements(state: &StateStore) -> Result<HashMap<Uuid, Placed>, StateError> {
    let now = std::time::Instant::now();
    let wall = now_ms();
    let mut out = HashMap::new();
    for (agent, bytes) in state.placements()? {
        let Ok(stored) = serde_json::from_slice::<StoredPlacement>(&bytes) else {
            continue;
        };
        let age = std::time::Duration::from_millis(
            u64::try_from(wall.saturating_sub(stored.at_ms)).unwrap_or(u64::MAX),
        );
        if age >= PLACEMENT_TTL || stored.host.is_empty() {
            continue;
        }
        let Some(at) = now.checked_sub(age) else {
            continue;
        };
        let party = Party {
            fleet: stored.fleet,
            host: stored.host,
        };
        out.insert(
            agent,
            Placed {
                party,
                at,
                stored: Some(at),
            },
        );
    }
    Ok(out)
}

/// JSON bytes of a record.
fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

#[cfg(test)]
mod tests;
