//! The inbound intake: a window of deliveries verified, then deduplicated, held and answered with
//! receipts in one durable transaction (group commit); only then acknowledged.

use lapin::BasicProperties;
use serde_json::{Value, json};
use uuid::Uuid;

use super::{Courier, now_ms};
use crate::broker::inbound::{Inbound, InboundRefusal, bounded};
use crate::mailbox::{Held, HeldBody};
use crate::policy::{Decision, Effect};
use crate::state::{Incoming, Shelf, Taken};
use crate::wire::{
    self, AgentMessage, DeliveryState, Kind, MAX_RECEIPT_MORE, Meta, Party, Payload, Refusal,
    SpawnOutcome, SpawnReply,
};

impl Courier {
    /// Takes a window of deliveries in: each is verified; the accepted ones are recorded, held and
    /// answered in one durable transaction. Returns, per delivery, whether to acknowledge it,
    /// and the audit records (in order).
    pub fn intake(
        &self,
        inbound: &Inbound,
        deliveries: &[(&str, &BasicProperties, &[u8])],
    ) -> (Vec<bool>, Vec<(&'static str, Value)>) {
        let now = now_ms();
        let mut audit = Vec::new();
        let mut plans: Vec<Option<Plan>> = Vec::with_capacity(deliveries.len());
        for (exchange, props, body) in deliveries {
            match inbound.authentic(exchange, props, body, now) {
                Ok((meta, payload)) => plans.push(Some(self.plan(meta, payload, exchange))),
                Err(InboundRefusal::Signed { meta, refusal }) if answered(meta.kind) => {
                    plans.push(Some(self.refusal_plan(*meta, &refusal, exchange, now)));
                }
                Err(refusal) => {
                    audit.push(refused(exchange, props, &refusal));
                    plans.push(None);
                }
            }
        }
        let accepted: Vec<&Plan> = plans.iter().flatten().collect();
        let items: Vec<Incoming<'_>> = accepted
            .iter()
            .map(|p| Incoming {
                key_id: &p.meta.key_id,
                id: p.meta.id,
                expires_ms: p
                    .remember_until
                    .unwrap_or(p.meta.expires_ms)
                    .saturating_add(inbound.skew_ms()),
                hold: p
                    .hold
                    .as_ref()
                    .map(|(shelf, record)| (*shelf, record.as_slice())),
                outbox: p.outbox.as_ref().map(|(id, b)| (*id, b.as_slice())),
                receipt: p.receipt,
                delivery: &p.delivery,
            })
            .collect();
        // Built inside the transaction, once the new messages are known: one `delivered`
        // receipt per sending gateway for the whole window.
        let receipts = |positions: &[usize]| self.window_receipts(&accepted, positions);
        let taken = match self.mailbox.accept(&items, now, &receipts) {
            Ok(taken) => taken,
            Err(error) => {
                tracing::warn!(%error, "cannot record inbound messages; leaving them for redelivery");
                let acks = plans.iter().map(Option::is_none).collect();
                return (acks, audit);
            }
        };
        let mut taken = taken.into_iter();
        let mut queued = false;
        let acks = plans
            .iter()
            .map(|plan| {
                let Some(plan) = plan else { return true };
                match taken.next() {
                    Some(Taken::New) if plan.event == REFUSED => {
                        let reason = plan.detail.get("reason").and_then(Value::as_str).unwrap_or_default();
                        tracing::warn!(msg.id = %plan.meta.id, msg.kind = plan.meta.kind.as_str(), origin.fleet = %plan.meta.origin.fleet, origin.host = %plan.meta.origin.host, %reason, "message refused; its sender is told why");
                        queued = true;
                        audit.push((plan.event, plan.detail.clone()));
                        true
                    }
                    Some(Taken::New) => {
                        tracing::info!(msg.id = %plan.meta.id, msg.kind = plan.meta.kind.as_str(), origin.fleet = %plan.meta.origin.fleet, origin.host = %plan.meta.origin.host, event = plan.event, "message taken in");
                        queued |= plan.outbox.is_some() || plan.receipt;
                        audit.push((plan.event, plan.detail.clone()));
                        true
                    }
                    Some(Taken::Duplicate) => {
                        // A redelivery after a crash, a republish after a lost confirm, or a
                        // replay: dropped either way, and on record.
                        tracing::debug!(msg.id = %plan.meta.id, "duplicate message dropped");
                        let mut detail = plan.detail.clone();
                        if let Some(fields) = detail.as_object_mut() {
                            fields.insert("reason".to_owned(), json!("seen before (redelivery, republish or replay)"));
                        }
                        audit.push(("message.duplicate", detail));
                        true
                    }
                    Some(Taken::Full) | None => {
                        tracing::warn!(msg.id = %plan.meta.id, "held store or outbox full; leaving the message for redelivery");
                        false
                    }
                }
            })
            .collect();
        if queued {
            self.outbox_ready.notify_one();
        }
        (acks, audit)
    }

    /// The `delivered` receipts for the new messages at `positions` of `accepted`: one per
    /// sending gateway (and per [`MAX_RECEIPT_MORE`] + 1 messages), listing them in order.
    fn window_receipts(&self, accepted: &[&Plan], positions: &[usize]) -> Vec<(Uuid, Vec<u8>)> {
        let mut senders: Vec<(&Party, Vec<Uuid>)> = Vec::new();
        for plan in positions.iter().filter_map(|p| accepted.get(*p)) {
            let origin = &plan.meta.origin;
            match senders.iter_mut().find(|(o, _)| *o == origin) {
                Some((_, ids)) => ids.push(plan.meta.id),
                None => senders.push((origin, vec![plan.meta.id])),
            }
        }
        senders
            .into_iter()
            .flat_map(|(origin, ids)| {
                ids.chunks(MAX_RECEIPT_MORE + 1)
                    .filter_map(|chunk| {
                        let (first, more) = chunk.split_first()?;
                        // INVARIANT: the intake runs only with a broker, so there is a key.
                        let envelopes = self.envelopes().ok()?;
                        Some(envelopes.receipt_for(
                            origin.clone(),
                            *first,
                            more.to_vec(),
                            DeliveryState::Delivered,
                            None,
                        ))
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// What refusing an authentic envelope changes: its sender is told why — a `failed` receipt
    /// for an agent message, a `failed` reply for a spawn request — durably, in the same
    /// transaction that records it as seen (a redelivery is not answered twice). Never silence:
    /// otherwise the sender would show `queued (in the broker)` for good.
    fn refusal_plan(&self, meta: Meta, refusal: &Refusal, exchange: &str, now: i64) -> Plan {
        let reason = format!("refused by host {}: {refusal}", self.me.host);
        // INVARIANT: the intake runs only with a broker, so there are envelopes.
        let answer = self.envelopes().map(|envelopes| match meta.kind {
            Kind::SpawnRequest => envelopes.to_gateway(
                meta.origin.clone(),
                &Payload::SpawnReply(SpawnReply {
                    v: wire::VERSION,
                    request: meta.id,
                    outcome: SpawnOutcome::Failed,
                    agent: None,
                    reasons: vec![reason.clone()],
                }),
            ),
            _ => envelopes.receipt_why(
                meta.origin.clone(),
                meta.id,
                DeliveryState::Failed,
                reason.clone(),
            ),
        });
        Plan {
            detail: json!({
                "msg_id": meta.id.to_string(), "kind": meta.kind.as_str(),
                "origin": {"fleet": meta.origin.fleet, "host": meta.origin.host},
                "exchange": exchange, "reason": refusal.to_string(), "answered": true,
            }),
            event: REFUSED,
            hold: None,
            outbox: answer.ok(),
            receipt: false,
            delivery: Vec::new(),
            // Remembered briefly: a redelivery in that time is not answered again.
            remember_until: Some(now),
            meta,
        }
    }

    /// What refusing a verified agent message by policy changes: nothing is held; its sender
    /// gets a `refused` receipt with the reasons (durably, with the replay entry: a redelivery or
    /// a replay is not answered twice), and the audit record names the deciding rules.
    fn policy_refusal(&self, mut plan: Plan, message: &AgentMessage, decision: &Decision) -> Plan {
        let reason = format!(
            "refused by host {}: {}",
            self.me.host,
            decision.reasons.join("; ")
        );
        plan.event = REFUSED;
        plan.note("to", json!(message.to.to_string()));
        plan.note("from", json!(message.from.map(|f| f.to_string())));
        plan.note("rules", json!(decision.rules));
        plan.note("answered", json!(true));
        self.answer(&mut plan, DeliveryState::Refused, reason);
        plan
    }

    /// Answers `plan`'s message with a receipt in `state` for `reason` (noted in its audit
    /// record too).
    fn answer(&self, plan: &mut Plan, state: DeliveryState, reason: String) {
        plan.note("reason", json!(reason));
        // INVARIANT: the intake runs only with a broker, so there is a key.
        plan.outbox = self.envelopes().ok().map(|envelopes| {
            envelopes.receipt_why(plan.meta.origin.clone(), plan.meta.id, state, reason)
        });
    }

    /// What taking in one verified envelope changes.
    fn plan(&self, meta: Meta, payload: Payload, exchange: &str) -> Plan {
        let mut plan = Plan {
            detail: json!({
                "msg_id": meta.id.to_string(), "kind": meta.kind.as_str(),
                "origin": {"fleet": meta.origin.fleet, "host": meta.origin.host},
                "exchange": exchange,
            }),
            event: "message.accepted",
            hold: None,
            outbox: None,
            receipt: false,
            delivery: Vec::new(),
            remember_until: None,
            meta,
        };
        let from_me = plan.meta.origin == self.me;
        match payload {
            Payload::AgentMessage(m) if self.is_local(m.to) => {
                if !from_me {
                    // Text from another host reaches a local agent only as its policy says.
                    let decision = self.admit_message(&plan.meta.origin, &m);
                    if decision.effect == Effect::Deny {
                        return self.policy_refusal(plan, &m, &decision);
                    }
                    plan.note("rules", json!(decision.rules));
                    if let Some(sender) = m.from {
                        self.remember_placement(sender, &plan.meta.origin);
                    }
                }
                // A pane agent's message is delivered when it is typed (the injector's receipt);
                // a mailbox's now, in the window's receipt.
                plan.receipt = !from_me && self.pane_of(m.to).is_none();
                plan.hold = Some(held_record(&plan.meta, Some(m.to), HeldBody::Message(m)));
            }
            Payload::AgentMessage(m) => {
                plan.event = "message.undeliverable";
                let reason = format!("no such agent {} on host {}", m.to, self.me.host);
                self.answer(&mut plan, DeliveryState::Failed, reason);
            }
            Payload::DeliveryReceipt(r) => {
                plan.event = "receipt.accepted";
                plan.note("message", json!(r.message.to_string()));
                if !r.more.is_empty() {
                    let more: Vec<String> = r.more.iter().map(Uuid::to_string).collect();
                    plan.note("more", json!(more));
                }
                plan.note("state", json!(r.state));
                // Only the fleet a message went to may report on it.
                let now = now_ms();
                plan.delivery = r
                    .messages()
                    .filter_map(|id| {
                        let tracked = self.mailbox.delivery(id).ok()??;
                        (tracked.dest.fleet == plan.meta.origin.fleet)
                            .then(|| (id, tracked.moved(r.state, r.reason.clone(), now).encode()))
                    })
                    .collect();
                if plan.delivery.is_empty() {
                    plan.event = "receipt.ignored";
                }
            }
            Payload::SpawnRequest(r) => {
                // Held durably for the daemon's spawn worker, which runs the pipeline with the
                // authenticated origin and replies.
                plan.event = "spawn.received";
                plan.note("profile", json!(r.profile));
                plan.hold = Some(held_record(&plan.meta, None, HeldBody::SpawnRequest(r)));
            }
            Payload::SpawnReply(r) => {
                plan.hold = Some(held_record(&plan.meta, None, HeldBody::SpawnReply(r)));
            }
            Payload::PresenceBeat(_) => {
                plan.event = "message.ignored";
                plan.note("reason", json!("a presence beat outside the roster queue"));
            }
        }
        plan
    }
}

/// The audit event of a refused delivery.
const REFUSED: &str = "message.refused";

/// Whether a refused envelope of `kind` is answered (a receipt or a reply would be answered by
/// nothing: no loops).
fn answered(kind: Kind) -> bool {
    matches!(kind, Kind::AgentMessage | Kind::SpawnRequest)
}

/// The held-store record of an envelope (for local agent `to`, if any) with `body`.
fn held_record(meta: &Meta, to: Option<Uuid>, body: HeldBody) -> (Shelf, Vec<u8>) {
    let held = Held {
        id: meta.id,
        origin: meta.origin.clone(),
        to,
        created_ms: meta.created_ms,
        body,
    };
    (held.shelf(), held.encode())
}

/// What taking in one envelope changes, decided before the transaction.
struct Plan {
    meta: Meta,
    event: &'static str,
    detail: Value,
    hold: Option<(Shelf, Vec<u8>)>,
    /// A failure receipt for the sender.
    outbox: Option<(Uuid, Vec<u8>)>,
    /// To be reported `delivered` in the window's receipt to its sender.
    receipt: bool,
    delivery: Vec<(Uuid, Vec<u8>)>,
    /// Until when its replay entry is kept (plus the skew); `None`: until it expires.
    remember_until: Option<i64>,
}

impl Plan {
    /// Adds a field to the audit detail.
    fn note(&mut self, field: &str, value: Value) {
        if let Some(detail) = self.detail.as_object_mut() {
            detail.insert(field.to_owned(), value);
        }
    }
}

/// The audit record of a refused delivery: ids and reasons, never body content.
fn refused(
    exchange: &str,
    properties: &BasicProperties,
    refusal: &InboundRefusal,
) -> (&'static str, Value) {
    // Everything here may come from the wire before any check: bounded and escaped.
    let short = |s: &str| bounded(s, 64);
    let reason = bounded(&refusal.to_string(), 512);
    tracing::warn!(%reason, %exchange, "message refused and dropped");
    (
        REFUSED,
        json!({
            "msg_id": properties.message_id().as_ref().map(|id| short(id.as_str())),
            "reason": reason,
            "exchange": exchange,
            "user_id": properties.user_id().as_ref().map(|u| short(u.as_str())),
        }),
    )
}
