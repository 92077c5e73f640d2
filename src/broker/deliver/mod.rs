//! Delivery over the broker (DESIGN.md "Delivery"): where an envelope goes, the outbound pump
//! (outbox → publish on a confirm channel → settle on the broker's answer) and the inbound
//! intake (a window of deliveries verified, then deduplicated, held and answered with receipts
//! in **one** durable transaction — group commit — and only then acknowledged).
//!
//! The broker only feeds the host's mailbox ([`crate::mailbox`]) and drains the outbox: what
//! the intake accepts for a local agent is held through [`Mailbox::accept`]; a mailbox agent
//! (the primary) pulls and acknowledges it there, a pane agent's is typed by the daemon's
//! injector; either release queues the sender's receipt, sealed by this host's [`Envelopes`],
//! in the outbox the pump publishes.

mod admit;
mod envelopes;
mod intake;
mod lanes;
mod pump;
mod settle;

pub use envelopes::Envelopes;
pub use pump::{Outlets, Pump, PumpError};

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use uuid::Uuid;

use super::envelope::OutboxRecord;
use crate::agent::Registry;
use crate::mailbox::{Held, Mailbox, ReceiptSealer};
use crate::state::{StateError, StateStore};
use crate::wire::{
    self, AgentMessage, DeliveryState, HostKey, Party, Payload, SpawnReply, SpawnRequest, Tracked,
    now_ms,
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

/// One gateway's delivery: its identity, envelopes, state and local agents.
pub struct Courier {
    me: Party,
    vhost: String,
    /// This host's envelopes (its signing key); `None` in single-host mode, where nothing is
    /// sealed.
    envelopes: Option<Arc<Envelopes>>,
    state: Arc<StateStore>,
    agents: Arc<Registry>,
    /// Woken when the outbox has something to publish.
    pub outbox_ready: Arc<Notify>,
    /// The host-local mailbox: the intake holds into it, the gateway and the injector use it
    /// directly.
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
        let me = Party {
            fleet: fleet.to_owned(),
            host: host.to_owned(),
        };
        let outbox_ready = Arc::new(Notify::new());
        let envelopes = key.map(|key| {
            Arc::new(Envelopes::new(
                me.clone(),
                vhost,
                key,
                Arc::clone(&outbox_ready),
            ))
        });
        let sealer = envelopes
            .clone()
            .map(|envelopes| envelopes as Arc<dyn ReceiptSealer>);
        Ok(Courier {
            mailbox: Arc::new(Mailbox::open(me.clone(), Arc::clone(&state), sealer)?),
            me,
            vhost: vhost.to_owned(),
            envelopes,
            state,
            agents,
            outbox_ready,
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
        self.me.clone()
    }

    /// The state store.
    pub fn state(&self) -> &Arc<StateStore> {
        &self.state
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

    /// Whether this host has a broker (and a key to seal with).
    pub fn has_broker(&self) -> bool {
        self.envelopes.is_some()
    }

    /// This host's envelopes; without a broker, [`CourierError::NoBroker`].
    pub fn envelopes(&self) -> Result<&Envelopes, CourierError> {
        self.envelopes.as_deref().ok_or(CourierError::NoBroker)
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
        let envelopes = self.envelopes()?;
        if dest.fleet != self.me.fleet && dest.host.is_empty() {
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
        let address = envelopes.address(&dest, Some(to));
        let sealed = envelopes.seal(dest.clone(), &payload);
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
        let (id, record) = self
            .envelopes()?
            .to_gateway(request.origin.clone(), &Payload::SpawnReply(reply.clone()));
        self.mailbox.answer(request.id, (id, record.as_slice()))?;
        Ok(())
    }

    /// Sends a spawn request to gateway `dest`; returns its message id (the reply's `request`).
    pub fn request_spawn(&self, dest: Party, request: SpawnRequest) -> Result<Uuid, CourierError> {
        let (id, record) = self
            .envelopes()?
            .to_gateway(dest, &Payload::SpawnRequest(request));
        self.state.outbox_put(id, &record)?;
        self.outbox_ready.notify_one();
        Ok(id)
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
