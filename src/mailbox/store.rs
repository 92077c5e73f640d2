//! The mailbox's own operations on the state store: a local send held (with its delivery
//! record) in one transaction, held messages read by shelf, spawn requests and replies found,
//! delivery records read. The broker's intake holds what comes from other hosts in the same
//! store; it wakes the same [`Arrivals`].

use std::sync::Arc;

use uuid::Uuid;

use super::{Arrivals, Held, HeldBody, Shelf};
use crate::state::{Incoming, StateError, StateStore, Taken};
use crate::wire::{
    self, AgentMessage, DeliveryState, Party, SpawnReply, SpawnRequest, Tracked, now_ms,
};

/// How long a local message's id is remembered against a second delivery (as long as an
/// envelope may live).
const LOCAL_TTL_MS: i64 = wire::MAX_LIFETIME_MS;

/// This host's mailbox: the held store's shelves, the delivery records, and who is woken.
pub struct Mailbox {
    state: Arc<StateStore>,
    arrivals: Arrivals,
    me: Party,
}

/// Why a message could not be held.
#[derive(Debug, thiserror::Error)]
pub enum MailboxError {
    /// The state store refused (full, or failing).
    #[error(transparent)]
    State(#[from] StateError),
    /// The held store is full: nothing was held.
    #[error("the held store is full: the message was not held")]
    Full,
    /// The same id was held already (a local id is new each time: never expected).
    #[error("message {0} was held already")]
    Duplicate(Uuid),
}

/// A local send: to an agent of this host, from one (or from the operator).
#[derive(Debug)]
pub struct LocalSend {
    /// The addressee.
    pub to: Uuid,
    /// The sending agent, if any.
    pub from: Option<Uuid>,
    /// The text (scrubbed by the caller).
    pub text: String,
    /// The addressee is a pane agent: its message is delivered when typed, not now.
    pub typed_later: bool,
}

impl Mailbox {
    /// The mailbox of host `me` over `state`.
    pub fn new(me: Party, state: Arc<StateStore>) -> Mailbox {
        Mailbox {
            state,
            arrivals: Arrivals::new(),
            me,
        }
    }

    /// Who is woken when a message is held.
    pub fn arrivals(&self) -> &Arrivals {
        &self.arrivals
    }

    /// Holds a message for a local agent, with its delivery record (`delivered` for a mailbox,
    /// `queued` until typed for a pane agent), in one transaction; wakes the agent's shelf.
    pub fn send(&self, send: LocalSend) -> Result<Uuid, MailboxError> {
        let id = Uuid::now_v7();
        let now = now_ms();
        let held = Held {
            id,
            origin: self.me.clone(),
            to: Some(send.to),
            created_ms: now,
            body: HeldBody::Message(AgentMessage {
                v: wire::VERSION,
                to: send.to,
                from: send.from,
                text: send.text,
            }),
        };
        let tracked = Tracked {
            to: send.to,
            from: send.from,
            dest: self.me.clone(),
            state: if send.typed_later {
                DeliveryState::Queued
            } else {
                DeliveryState::Delivered
            },
            in_broker: false,
            reason: None,
            at_ms: now,
            retrying_since_ms: None,
        };
        let record = held.encode();
        let tracked = [(id, tracked.encode())];
        let shelf = held.shelf();
        let item = Incoming {
            key_id: "local",
            id,
            expires_ms: now + LOCAL_TTL_MS,
            hold: Some((shelf, &record)),
            outbox: None,
            receipt: false,
            delivery: &tracked,
        };
        match self
            .state
            .accept_batch(&[item], now, &|_| Vec::new())?
            .first()
        {
            Some(Taken::New) => {
                self.arrivals.arrived(shelf);
                Ok(id)
            }
            Some(Taken::Full) => Err(MailboxError::Full),
            Some(Taken::Duplicate) | None => Err(MailboxError::Duplicate(id)),
        }
    }

    /// Up to `limit` held messages, oldest first: for agent `to` (its shelf alone), or every
    /// one but spawn requests.
    pub fn held(&self, limit: usize, to: Option<Uuid>) -> Result<Vec<Held>, StateError> {
        let Some(to) = to else {
            return Ok(decoded(self.state.held_list(limit)?)
                .into_iter()
                .filter(|h| !matches!(h.body, HeldBody::SpawnRequest(_)))
                .collect());
        };
        Ok(decoded(self.state.held_on(Shelf::Agent(to), limit)?))
    }

    /// Spawn requests from other hosts waiting for the spawn worker, oldest first.
    pub fn spawn_requests(&self) -> Result<Vec<(Held, SpawnRequest)>, StateError> {
        Ok(decoded(self.state.held_on(Shelf::Spawn, usize::MAX)?)
            .into_iter()
            .filter_map(|h| match &h.body {
                HeldBody::SpawnRequest(request) => {
                    let request = request.clone();
                    Some((h, request))
                }
                _ => None,
            })
            .collect())
    }

    /// The held reply to spawn request `request`, taken out of the held store.
    pub fn take_spawn_reply(
        &self,
        request: Uuid,
    ) -> Result<Option<(Held, SpawnReply)>, StateError> {
        for held in decoded(self.state.held_on(Shelf::Host, usize::MAX)?) {
            let HeldBody::SpawnReply(reply) = &held.body else {
                continue;
            };
            if reply.request == request {
                let reply = reply.clone();
                self.state.held_ack_with(held.id, None, None)?;
                return Ok(Some((held, reply)));
            }
        }
        Ok(None)
    }

    /// A message's delivery record, if this host sent it.
    pub fn delivery(&self, id: Uuid) -> Result<Option<Tracked>, StateError> {
        Ok(self
            .state
            .delivery_get(id)?
            .and_then(|b| Tracked::decode(&b)))
    }
}

/// The held records of `entries` (one that does not decode is left out: never written so).
fn decoded(entries: Vec<(Uuid, Vec<u8>)>) -> Vec<Held> {
    entries
        .into_iter()
        .filter_map(|(_, bytes)| Held::decode(&bytes))
        .collect()
}
