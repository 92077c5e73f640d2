//! The mailbox's own operations on the state store — it is the only writer of the held store:
//! a local send held (with its delivery record) in one transaction, a window from the broker's
//! intake held (with its replay entries and receipts) in one transaction, held messages read by
//! shelf and released (with the sender's receipt, queued in the same transaction), spawn
//! requests answered, spawn replies taken, delivery records read. Every hold wakes the
//! [`Arrivals`] of its shelf once it is durable.

use std::sync::Arc;

use uuid::Uuid;

use super::{Arrivals, Held, HeldBody, Shelf};
use crate::state::{self, Incoming, StateError, StateStore, Taken};
use crate::wire::{
    self, AgentMessage, DeliveryState, Kind, Party, SpawnReply, SpawnRequest, Tracked, now_ms,
};

/// How long a local message's id is remembered against a second delivery (as long as an
/// envelope may live).
const LOCAL_TTL_MS: i64 = wire::MAX_LIFETIME_MS;

/// This host's mailbox: the held store's shelves, the delivery records, and who is woken.
pub struct Mailbox {
    state: Arc<StateStore>,
    arrivals: Arrivals,
    me: Party,
    /// Seals the receipts a release owes another host; `None` without a broker.
    receipts: Option<Arc<dyn ReceiptSealer>>,
}

/// Seals a receipt for another host's gateway as an outbox record (the broker's part: the
/// host key and the address), and wakes the outbox's pump once it is queued.
pub trait ReceiptSealer: Send + Sync {
    /// The outbox record (its id, its bytes) of a receipt telling `to`'s gateway that message
    /// `message` reached `state`.
    fn receipt(&self, to: &Party, message: Uuid, state: DeliveryState) -> (Uuid, Vec<u8>);
    /// Outbox records were queued: publish them.
    fn queued(&self);
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
    /// The mailbox of host `me` over `state`; `receipts` seals what a release owes another host
    /// (`None` in single-host mode). Messages held by a fleetd from before shelves are put on
    /// theirs.
    pub fn open(
        me: Party,
        state: Arc<StateStore>,
        receipts: Option<Arc<dyn ReceiptSealer>>,
    ) -> Result<Mailbox, StateError> {
        shelve_old_held(&state)?;
        Ok(Mailbox {
            state,
            arrivals: Arrivals::new(),
            me,
            receipts,
        })
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
        let item = Incoming {
            key_id: "local",
            id,
            expires_ms: now + LOCAL_TTL_MS,
            hold: Some((held.shelf(), &record)),
            outbox: None,
            receipt: false,
            delivery: &tracked,
        };
        match self.accept(&[item], now, &|_| Vec::new())?.first() {
            Some(Taken::New) => Ok(id),
            Some(Taken::Full) => Err(MailboxError::Full),
            Some(Taken::Duplicate) | None => Err(MailboxError::Duplicate(id)),
        }
    }

    /// Takes a window in, in one durable transaction: each new item's replay entry, held
    /// record, outbox entry and delivery records, and the window's `receipts`
    /// ([`StateStore::accept_batch`]); then wakes the shelf of each new hold.
    pub fn accept(
        &self,
        items: &[Incoming<'_>],
        now: i64,
        receipts: &state::Receipts<'_>,
    ) -> Result<Vec<Taken>, StateError> {
        let taken = self.state.accept_batch(items, now, receipts)?;
        for (item, taken) in items.iter().zip(&taken) {
            if let (Some((shelf, _)), Taken::New) = (item.hold, taken) {
                self.arrivals.arrived(shelf);
            }
        }
        Ok(taken)
    }

    /// A held message was typed into its agent's pane: it leaves the held store and its sender
    /// learns it was delivered, in one transaction (see [`Mailbox::release`]).
    pub fn typed(&self, id: Uuid) -> Result<bool, StateError> {
        self.release(id, DeliveryState::Delivered, None)
    }

    /// Acknowledges a held message: it is not offered again, and its sender learns it was
    /// acknowledged. `false` when it was not held — or, with `only_for`, not held for that
    /// agent (another agent's messages are not its to acknowledge, nor to learn about).
    pub fn ack(&self, id: Uuid, only_for: Option<Uuid>) -> Result<bool, StateError> {
        self.release(id, DeliveryState::Acknowledged, only_for)
    }

    /// Takes message `id` out of the held store and tells its sender it reached `state`, in one
    /// transaction: this host's own delivery record moves, or an agent message from another
    /// host gets a receipt (queued in the outbox; without a broker there is nobody to send it
    /// to, and the release goes ahead without). `false` when it was not held (for agent
    /// `only_for`, when given).
    fn release(
        &self,
        id: Uuid,
        state: DeliveryState,
        only_for: Option<Uuid>,
    ) -> Result<bool, StateError> {
        let Some(bytes) = self.state.held_get(id)? else {
            return Ok(false);
        };
        let held = Held::decode(&bytes);
        if only_for.is_some() && held.as_ref().and_then(|h| h.to) != only_for {
            return Ok(false);
        }
        let Some(held) = held else {
            // Never written so; released, with nobody to tell.
            return self.state.held_ack_with(id, None, None);
        };
        if held.origin == self.me {
            let moved = self
                .delivery(id)?
                .map(|t| t.moved(state, None, now_ms()).encode());
            return self
                .state
                .held_ack_with(id, None, moved.as_deref().map(|m| (id, m)));
        }
        let receipt = match (&self.receipts, held.kind()) {
            (Some(sealer), Kind::AgentMessage) => Some(sealer.receipt(&held.origin, id, state)),
            (None, Kind::AgentMessage) => {
                tracing::debug!(msg.id = %id, "no broker: the sender on another host is not told");
                None
            }
            _ => None,
        };
        let released = self.state.held_ack_with(
            id,
            receipt.as_ref().map(|(rid, b)| (*rid, b.as_slice())),
            None,
        )?;
        if let (Some(sealer), Some(_)) = (&self.receipts, &receipt) {
            sealer.queued();
        }
        Ok(released)
    }

    /// Answers a held spawn request: `reply` (an outbox record for the requesting gateway) is
    /// queued and the request leaves the held store, in one transaction. `false` when it was
    /// not held (answered already).
    pub fn answer(&self, request: Uuid, reply: (Uuid, &[u8])) -> Result<bool, StateError> {
        let answered = self.state.held_ack_with(request, Some(reply), None)?;
        if let Some(sealer) = &self.receipts {
            sealer.queued();
        }
        Ok(answered)
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

/// Puts messages held by a fleetd from before shelves on theirs.
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

/// The held records of `entries` (one that does not decode is left out: never written so).
fn decoded(entries: Vec<(Uuid, Vec<u8>)>) -> Vec<Held> {
    entries
        .into_iter()
        .filter_map(|(_, bytes)| Held::decode(&bytes))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code fails loudly")]

    use std::sync::Mutex;

    use super::*;
    use crate::state::Limits;

    /// Stands in for the broker's [`ReceiptSealer`] (the host key and the address are
    /// `broker::`'s, which `mailbox` may not import): these tests are about what the mailbox
    /// writes in one transaction, not about sealing, which the broker's tests cover.
    #[derive(Default)]
    struct Recorded {
        owed: Mutex<Vec<(Party, Uuid, DeliveryState)>>,
        woken: Mutex<usize>,
    }

    impl ReceiptSealer for Recorded {
        fn receipt(&self, to: &Party, message: Uuid, state: DeliveryState) -> (Uuid, Vec<u8>) {
            self.owed.lock().unwrap().push((to.clone(), message, state));
            (
                Uuid::now_v7(),
                format!("receipt for {message}").into_bytes(),
            )
        }

        fn queued(&self) {
            *self.woken.lock().unwrap() += 1;
        }
    }

    fn party(host: &str) -> Party {
        Party {
            fleet: "f".to_owned(),
            host: host.to_owned(),
        }
    }

    /// Holds `held` as the intake would: a message from another host.
    fn take_in(mailbox: &Mailbox, held: &Held) {
        let record = held.encode();
        let item = Incoming {
            key_id: "k",
            id: held.id,
            expires_ms: now_ms() + 60_000,
            hold: Some((held.shelf(), &record)),
            outbox: None,
            receipt: false,
            delivery: &[],
        };
        let taken = mailbox.accept(&[item], now_ms(), &|_| Vec::new()).unwrap();
        assert_eq!(taken, vec![Taken::New]);
    }

    fn from_afar(to: Uuid) -> Held {
        Held {
            id: Uuid::now_v7(),
            origin: party("b"),
            to: Some(to),
            created_ms: now_ms(),
            body: HeldBody::Message(AgentMessage {
                v: wire::VERSION,
                to,
                from: None,
                text: "from b".to_owned(),
            }),
        }
    }

    #[test]
    fn a_release_tells_the_sender_in_the_same_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(StateStore::open(dir.path(), Limits::default()).unwrap());
        let sealer = Arc::new(Recorded::default());
        let mailbox = Mailbox::open(
            party("a"),
            Arc::clone(&state),
            Some(Arc::clone(&sealer) as Arc<dyn ReceiptSealer>),
        )
        .unwrap();
        let (agent, other) = (Uuid::now_v7(), Uuid::now_v7());

        // A local message: acknowledged, its own delivery record moves; nothing is owed.
        let local = mailbox
            .send(LocalSend {
                to: agent,
                from: None,
                text: "hi".to_owned(),
                typed_later: false,
            })
            .unwrap();
        assert_eq!(mailbox.held(10, Some(agent)).unwrap().len(), 1);
        assert!(!mailbox.ack(local, Some(other)).unwrap(), "another agent's");
        assert!(mailbox.ack(local, Some(agent)).unwrap());
        assert!(
            !mailbox.ack(local, Some(agent)).unwrap(),
            "acknowledged once"
        );
        let record = mailbox.delivery(local).unwrap().unwrap();
        assert_eq!(record.state, DeliveryState::Acknowledged);
        assert!(sealer.owed.lock().unwrap().is_empty());
        assert!(state.outbox_list().unwrap().is_empty());

        // A message from another host, typed: it leaves the held store and its receipt is in
        // the outbox, both or neither; the pump is woken.
        let held = from_afar(agent);
        take_in(&mailbox, &held);
        assert!(mailbox.typed(held.id).unwrap());
        assert!(mailbox.held(10, Some(agent)).unwrap().is_empty());
        assert_eq!(
            *sealer.owed.lock().unwrap(),
            vec![(party("b"), held.id, DeliveryState::Delivered)]
        );
        let outbox = state.outbox_list().unwrap();
        assert_eq!(outbox.len(), 1);
        assert_eq!(outbox[0].1, format!("receipt for {}", held.id).into_bytes());
        assert_eq!(*sealer.woken.lock().unwrap(), 1);
    }

    #[test]
    fn without_a_broker_a_release_owes_nobody() {
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(StateStore::open(dir.path(), Limits::default()).unwrap());
        let mailbox = Mailbox::open(party("a"), Arc::clone(&state), None).unwrap();
        let agent = Uuid::now_v7();
        // Held by a fleetd that had a broker; this one has none: released, nothing queued.
        let held = from_afar(agent);
        take_in(&mailbox, &held);
        assert!(mailbox.ack(held.id, Some(agent)).unwrap());
        assert!(mailbox.held(10, None).unwrap().is_empty());
        assert!(state.outbox_list().unwrap().is_empty());
    }
}
