//! This host's envelopes: where one for another host goes (vhost, exchange, routing key) and
//! its seal (the host key). Only a host with a broker has them.

use std::sync::Arc;

use tokio::sync::Notify;
use uuid::Uuid;

use super::{Address, MESSAGE_TTL_MS, SPAWN_REQUEST_TTL_MS};
use crate::broker::envelope::OutboxRecord;
use crate::broker::topology::{SEND_EXCHANGE, agent_key, control_key, ingress_exchange};
use crate::mailbox::ReceiptSealer;
use crate::wire::{
    self, DeliveryReceipt, DeliveryState, HostKey, Meta, Party, Payload, Sealed, now_ms,
};

/// Seals and addresses what this host sends.
pub struct Envelopes {
    me: Party,
    vhost: String,
    key: Arc<HostKey>,
    /// Woken when the outbox has something to publish (the courier's).
    ready: Arc<Notify>,
}

impl Envelopes {
    /// The envelopes of host `me` (own vhost `vhost`), sealed with `key`; `ready` wakes the pump.
    pub fn new(me: Party, vhost: &str, key: Arc<HostKey>, ready: Arc<Notify>) -> Envelopes {
        Envelopes {
            me,
            vhost: vhost.to_owned(),
            key,
            ready,
        }
    }

    /// Where an envelope for `dest` (agent `agent`, if it is for one) is published: anything in
    /// this fleet through `fleet.send`, with key `agent.HOST.ID` for an agent's inbox and
    /// `ctl.HOST` for a gateway; anything in another fleet through that fleet's `x.in.OWN`, to
    /// the owning gateway's control queue. An agent whose host is unknown here gets the key
    /// `agent.ID`, which no host's binding (`agent.HOST.*`, three words or more) matches: it
    /// comes back as "no such agent".
    pub fn address(&self, dest: &Party, agent: Option<Uuid>) -> Address {
        if dest.fleet == self.me.fleet {
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
                exchange: ingress_exchange(&self.me.fleet),
                key: control_key(&dest.host),
            }
        }
    }

    /// Seals `payload` from this host to `dest`, valid for [`MESSAGE_TTL_MS`] (a spawn request
    /// for [`SPAWN_REQUEST_TTL_MS`]).
    pub fn seal(&self, dest: Party, payload: &Payload) -> Sealed {
        let lifetime = match payload {
            Payload::SpawnRequest(_) => SPAWN_REQUEST_TTL_MS,
            _ => MESSAGE_TTL_MS,
        };
        let now = now_ms();
        let meta = Meta {
            version: wire::VERSION,
            id: Uuid::now_v7(),
            kind: payload.kind(),
            origin: self.me.clone(),
            dest,
            key_id: String::new(),
            created_ms: now,
            expires_ms: now + lifetime,
        };
        wire::seal(meta, payload, &self.key)
    }

    /// An outbox record carrying `payload` to the gateway `dest` (untracked): its id and bytes.
    pub fn to_gateway(&self, dest: Party, payload: &Payload) -> (Uuid, Vec<u8>) {
        let address = self.address(&dest, None);
        let sealed = self.seal(dest, payload);
        let record = OutboxRecord::new(&address.vhost, &address.exchange, &address.key, &sealed);
        (
            sealed.meta.id,
            serde_json::to_vec(&record).unwrap_or_default(),
        )
    }

    /// One receipt reporting `message` and `more` (at most [`wire::MAX_RECEIPT_MORE`]) in one
    /// state to the gateway of `dest`.
    pub fn receipt_for(
        &self,
        dest: Party,
        message: Uuid,
        more: Vec<Uuid>,
        state: DeliveryState,
        reason: Option<String>,
    ) -> (Uuid, Vec<u8>) {
        let payload = Payload::DeliveryReceipt(DeliveryReceipt {
            v: wire::VERSION,
            message,
            state,
            reason,
            more,
        });
        self.to_gateway(dest, &payload)
    }

    /// A receipt telling `dest`'s gateway that `message` ended in `state` (failed, refused),
    /// and why.
    pub fn receipt_why(
        &self,
        dest: Party,
        message: Uuid,
        state: DeliveryState,
        reason: String,
    ) -> (Uuid, Vec<u8>) {
        self.receipt_for(dest, message, Vec::new(), state, Some(reason))
    }
}

impl ReceiptSealer for Envelopes {
    fn receipt(&self, to: &Party, message: Uuid, state: DeliveryState) -> (Uuid, Vec<u8>) {
        self.receipt_for(to.clone(), message, Vec::new(), state, None)
    }

    fn queued(&self) {
        self.ready.notify_one();
    }
}
