//! The intake's receipts, without a broker: envelopes sealed by real couriers are taken in as the
//! link hands them over (exchange, properties, body).

use std::sync::Arc;

use lapin::BasicProperties;
use uuid::Uuid;

use super::Courier;
use crate::broker::envelope::{OutboxRecord, properties};
use crate::broker::inbound::Inbound;
use crate::mailbox::{Held, HeldBody};
use crate::state::{Limits, Shelf, StateStore};
use crate::wire::{AgentMessage, VERSION};
use crate::wire::{DeliveryState, HostKey, Kind, Party, Payload, PinnedKeys, Sealed};

const FLEET: &str = "f";

struct Gateway {
    courier: Courier,
    state: Arc<StateStore>,
    _dir: tempfile::TempDir,
}

fn gateway(host: &str, key: &Arc<HostKey>) -> Gateway {
    gateway_of(FLEET, host, key)
}

fn gateway_of(fleet: &str, host: &str, key: &Arc<HostKey>) -> Gateway {
    let dir = tempfile::tempdir().unwrap();
    let state = Arc::new(StateStore::open(dir.path(), Limits::default()).unwrap());
    let courier = Courier::new(fleet, host, "/f", Arc::clone(key), Arc::clone(&state)).unwrap();
    // Its mailboxes take messages from fleet `f`.
    courier.use_policy(policy(
        "[[message]]\nid = \"f-to-mailboxes\"\nfleets = [\"f\"]\nprofiles = [\"mailbox\"]\n",
    ));
    Gateway {
        courier,
        state,
        _dir: dir,
    }
}

/// A policy of one file, `text`.
fn policy(text: &str) -> crate::policy::Current {
    let (set, diagnostics) =
        crate::policy::load_sources(&[(std::path::PathBuf::from("t.toml"), text.to_owned())]);
    crate::policy::Current::new(set.unwrap_or_else(|e| panic!("{e}: {diagnostics:?}")))
}

/// Deliveries as the broker hands them over (exchange, properties, body), with the envelope.
type Deliveries = Vec<(String, BasicProperties, Vec<u8>, Sealed)>;

/// What a gateway's outbox holds, as the broker would hand it over, with the decoded envelope.
fn outbox(gateway: &Gateway) -> Deliveries {
    outbox_of(gateway, FLEET)
}

/// As [`outbox`], published with the broker user `user` (the gateway's fleet).
fn outbox_of(gateway: &Gateway, user: &str) -> Deliveries {
    gateway
        .state
        .outbox_list()
        .unwrap()
        .into_iter()
        .map(|(_, record)| {
            let record: OutboxRecord = serde_json::from_slice(&record).unwrap();
            let sealed = record.sealed().unwrap();
            let props = properties(&sealed, user);
            (record.exchange.clone(), props, sealed.body.clone(), sealed)
        })
        .collect()
}

/// `gateway` takes `window` in, as its link would; the acks and the audit records.
fn take_in(
    gateway: &Gateway,
    inbound: &Inbound,
    window: &Deliveries,
) -> (Vec<bool>, Vec<(&'static str, serde_json::Value)>) {
    let views: Vec<(&str, &BasicProperties, &[u8])> = window
        .iter()
        .map(|(exchange, props, body, _)| (exchange.as_str(), props, body.as_slice()))
        .collect();
    gateway.courier.intake(inbound, &views)
}

#[test]
fn a_window_is_answered_with_one_receipt_per_sending_gateway() {
    let keys: Vec<Arc<HostKey>> = (0..3)
        .map(|_| Arc::new(HostKey::generate().unwrap().0))
        .collect();
    let (a, b, r) = (
        gateway("a", &keys[0]),
        gateway("b", &keys[1]),
        gateway("r", &keys[2]),
    );
    let mut pins = PinnedKeys::default();
    pins.pin(FLEET, "a", *keys[0].public());
    pins.pin(FLEET, "b", *keys[1].public());
    let inbound = Inbound::new(&at(FLEET, "r"), pins, 120_000, Arc::clone(&r.state));
    let worker = r.courier.agents().open_mailbox("worker").unwrap();
    let dest = Party {
        fleet: FLEET.to_owned(),
        host: "r".to_owned(),
    };
    for (sender, n) in [(&a, 3), (&b, 2)] {
        for i in 0..n {
            sender
                .courier
                .send(dest.clone(), worker, None, format!("task {i}"))
                .unwrap();
        }
    }
    // One window with all five, interleaved as two senders' messages arrive.
    let mut window = outbox(&a);
    window.extend(outbox(&b));
    window.swap(1, 3);
    let (acks, _) = take_in(&r, &inbound, &window);
    assert_eq!(acks, vec![true; 5]);

    let receipts: Vec<(String, Vec<Uuid>)> = outbox(&r)
        .into_iter()
        .map(|(_, _, body, sealed)| {
            let Ok(Payload::DeliveryReceipt(receipt)) =
                Payload::decode(Kind::DeliveryReceipt, &body)
            else {
                panic!("only receipts are queued");
            };
            (sealed.meta.dest.host, receipt.messages().collect())
        })
        .collect();
    let reported = |host: &str| -> Vec<Uuid> {
        window
            .iter()
            .filter(|(_, _, _, s)| s.meta.origin.host == host)
            .map(|(_, _, _, s)| s.meta.id)
            .collect()
    };
    assert_eq!(
        receipts,
        vec![
            ("a".to_owned(), reported("a")),
            ("b".to_owned(), reported("b"))
        ],
        "one receipt per sending gateway, listing its messages in the order taken in"
    );

    // The same window again (a redelivery): nothing new, so nothing reported.
    let (acks, _) = take_in(&r, &inbound, &window);
    assert_eq!(acks, vec![true; 5]);
    assert_eq!(outbox(&r).len(), 2, "duplicates are never reported");
}

#[test]
fn a_receipt_moves_only_the_messages_sent_to_the_fleet_it_comes_from() {
    let keys: Vec<Arc<HostKey>> = (0..3)
        .map(|_| Arc::new(HostKey::generate().unwrap().0))
        .collect();
    let (a, r) = (gateway("a", &keys[0]), gateway("r", &keys[1]));
    // A host of another fleet, admitted and pinned: it may send, but not report on messages
    // that never went to its fleet.
    let x = gateway_of("g", "x", &keys[2]);
    let mut pins = PinnedKeys::default();
    pins.pin(FLEET, "a", *keys[0].public());
    let at_r = Inbound::new(&at(FLEET, "r"), pins.clone(), 120_000, Arc::clone(&r.state));
    pins.pin(FLEET, "r", *keys[1].public());
    pins.pin("g", "x", *keys[2].public());
    let at_a = Inbound::new(&at(FLEET, "a"), pins, 120_000, Arc::clone(&a.state));
    let worker = r.courier.agents().open_mailbox("worker").unwrap();
    let dest = Party {
        fleet: FLEET.to_owned(),
        host: "r".to_owned(),
    };
    let ids: Vec<Uuid> = (0..2)
        .map(|i| {
            a.courier
                .send(dest.clone(), worker, None, format!("task {i}"))
                .unwrap()
        })
        .collect();
    let state = |id| a.courier.mailbox().delivery(id).unwrap().unwrap().state;
    let (acks, _) = take_in(&r, &at_r, &outbox(&a));
    assert_eq!(acks, vec![true; 2]);

    // The forged report names both messages.
    let (id, record) = x.courier.envelopes().unwrap().receipt_for(
        a.courier.me(),
        ids[0],
        vec![ids[1]],
        DeliveryState::Failed,
        Some("forged".to_owned()),
    );
    x.state.outbox_put(id, &record).unwrap();
    let forged: Deliveries = outbox_of(&x, "g")
        .into_iter()
        .filter(|(_, _, _, sealed)| sealed.meta.id == id)
        .collect();
    assert!(
        forged[0].0.starts_with("x.in."),
        "it comes through its fleet's ingress"
    );
    let (acks, audit) = take_in(&a, &at_a, &forged);
    assert_eq!(acks, vec![true], "acknowledged and dropped");
    assert_eq!(audit[0].0, "receipt.ignored");
    assert_eq!(
        (state(ids[0]), state(ids[1])),
        (DeliveryState::Queued, DeliveryState::Queued),
        "nothing moved"
    );

    // The genuine one, from the fleet the messages went to, moves both.
    let (acks, audit) = take_in(&a, &at_a, &outbox(&r));
    assert_eq!(acks, vec![true]);
    assert_eq!(audit[0].0, "receipt.accepted");
    assert_eq!(
        (state(ids[0]), state(ids[1])),
        (DeliveryState::Delivered, DeliveryState::Delivered)
    );
}

#[test]
fn a_refused_authentic_message_is_answered_with_a_failed_receipt_once() {
    let keys: Vec<Arc<HostKey>> = (0..2)
        .map(|_| Arc::new(HostKey::generate().unwrap().0))
        .collect();
    let (a, r) = (gateway("a", &keys[0]), gateway("r", &keys[1]));
    let mut pins = PinnedKeys::default();
    pins.pin(FLEET, "a", *keys[0].public());
    let at_r = Inbound::new(&at(FLEET, "r"), pins.clone(), 120_000, Arc::clone(&r.state));
    pins.pin(FLEET, "r", *keys[1].public());
    let at_a = Inbound::new(&at(FLEET, "a"), pins, 120_000, Arc::clone(&a.state));
    let worker = r.courier.agents().open_mailbox("worker").unwrap();
    let dest = Party {
        fleet: FLEET.to_owned(),
        host: "r".to_owned(),
    };
    let id = a
        .courier
        .send(dest, worker, None, "late".to_owned())
        .unwrap();
    // The same message, signed by a's real key, but expired an hour ago.
    let (exchange, _, body, sealed) = outbox(&a).remove(0);
    let mut meta = sealed.meta.clone();
    meta.created_ms -= 26 * 3600 * 1000;
    meta.expires_ms = meta.created_ms + 25 * 3600 * 1000 - 3600 * 1000;
    let payload = Payload::decode(Kind::AgentMessage, &body).unwrap();
    let expired = crate::wire::seal(meta, &payload, &keys[0]);
    let delivery = (
        exchange,
        properties(&expired, FLEET),
        expired.body.clone(),
        expired,
    );
    let window: Deliveries = vec![delivery.clone(), delivery];
    let (acks, audit) = take_in(&r, &at_r, &window);
    assert_eq!(acks, vec![true, true], "acknowledged, never rejected");
    let events: Vec<&str> = audit.iter().map(|(e, _)| *e).collect();
    assert_eq!(events, ["message.refused", "message.duplicate"]);
    assert!(
        r.courier.mailbox().held(10, None).unwrap().is_empty(),
        "nothing held"
    );

    let answers = outbox(&r);
    assert_eq!(answers.len(), 1, "answered once: {answers:?}");
    let (acks, _) = take_in(&a, &at_a, &answers);
    assert_eq!(acks, vec![true]);
    let tracked = a.courier.mailbox().delivery(id).unwrap().unwrap();
    assert_eq!(tracked.state, DeliveryState::Failed);
    let reason = tracked.reason.unwrap();
    assert!(
        reason.contains("refused by host r") && reason.contains("expired"),
        "{reason}"
    );
}

/// Gateway `host` of `fleet`.
fn at(fleet: &str, host: &str) -> Party {
    Party {
        fleet: fleet.to_owned(),
        host: host.to_owned(),
    }
}

/// Registers a pane agent `name` of `profile` on `gateway`, registered by `owner`.
fn pane_agent(gateway: &Gateway, name: &str, profile: &str, owner: crate::agent::Owner) -> Uuid {
    let agents = gateway.courier.agents();
    let id = agents.reserve(Some(name), &owner).unwrap();
    agents
        .register(crate::agent::Registration {
            id,
            name: name.to_owned(),
            profile: profile.to_owned(),
            pane: format!("%{name}"),
            owner,
            token: None,
            process: None,
            grant: None,
        })
        .unwrap()
}

#[test]
fn messages_from_other_hosts_reach_an_agent_only_as_the_message_policy_says_and_refusals_are_answered()
 {
    let keys: Vec<Arc<HostKey>> = (0..4)
        .map(|_| Arc::new(HostKey::generate().unwrap().0))
        .collect();
    let (a, b, c) = (
        gateway("a", &keys[0]),
        gateway("b", &keys[1]),
        gateway("c", &keys[2]),
    );
    // The receiving host, with its own policy: host a may message workers; nobody else may
    // message anyone without being a spawner; `shell` never receives remote text.
    let dir = tempfile::tempdir().unwrap();
    let state = Arc::new(StateStore::open(dir.path(), Limits::default()).unwrap());
    let courier = Courier::new(FLEET, "r", "/f", Arc::clone(&keys[3]), Arc::clone(&state)).unwrap();
    courier.use_policy(policy(
        "[profile.worker]\nargv = [\"/usr/bin/worker\"]\nroots = [\"/tmp\"]\n\n\
         [profile.shell]\nargv = [\"/bin/bash\", \"--noprofile\", \"--norc\"]\nroots = [\"/tmp\"]\n\n\
         [[message]]\nid = \"a-to-workers\"\nfleets = [\"f\"]\nhosts = [\"a\"]\nprofiles = [\"worker\"]\n",
    ));
    let r = Gateway {
        courier,
        state,
        _dir: dir,
    };
    let mut pins = PinnedKeys::default();
    for (host, key) in ["a", "b", "c"].iter().zip(&keys) {
        pins.pin(FLEET, host, *key.public());
    }
    let inbound = Inbound::new(&at(FLEET, "r"), pins.clone(), 120_000, Arc::clone(&r.state));
    pins.pin(FLEET, "r", *keys[3].public());
    let at_b = Inbound::new(&at(FLEET, "b"), pins, 120_000, Arc::clone(&b.state));

    let (b_lead, b_other) = (Uuid::now_v7(), Uuid::now_v7());
    let peer = |host: &str, agent| crate::agent::Owner::Peer {
        fleet: FLEET.to_owned(),
        host: host.to_owned(),
        agent,
    };
    let w1 = pane_agent(&r, "w1", "worker", crate::agent::Owner::Operator);
    let w2 = pane_agent(&r, "w2", "worker", peer("b", Some(b_lead)));
    let sh = pane_agent(&r, "sh", "shell", peer("a", None));
    let mailbox = r.courier.agents().open_mailbox("primary").unwrap();
    // The primary asked host c for an agent, which c started as `c_worker`.
    let c_worker = Uuid::now_v7();
    r.courier
        .remember_spawned(c_worker, &at(FLEET, "c"), mailbox);

    let dest = at(FLEET, "r");
    let send = |from: &Gateway, to, sender, text: &str| {
        from.courier
            .send(dest.clone(), to, sender, text.to_owned())
            .unwrap()
    };
    let cases = [
        (send(&a, w1, None, "granted"), Some("a-to-workers")),
        (send(&b, w1, None, "no rule for b"), None),
        (
            send(&b, w2, Some(b_lead), "from its spawner"),
            Some("spawner"),
        ),
        (send(&b, w2, Some(b_other), "another agent of b"), None),
        (send(&a, sh, None, "; id > /tmp/x; #"), None),
        (send(&c, mailbox, Some(Uuid::now_v7()), "a stranger"), None),
        (send(&c, mailbox, Some(c_worker), "done"), Some("spawned")),
    ];
    let mut window = outbox(&a);
    window.extend(outbox(&b));
    window.extend(outbox(&c));
    let (acks, audit) = take_in(&r, &inbound, &window);
    assert_eq!(acks, vec![true; cases.len()], "every one acknowledged");

    let held: Vec<Uuid> = r
        .courier
        .mailbox()
        .held(100, None)
        .unwrap()
        .iter()
        .map(|h| h.id)
        .collect();
    for (id, allowed_by) in &cases {
        let record = audit
            .iter()
            .find(|(_, d)| d["msg_id"] == id.to_string())
            .unwrap_or_else(|| panic!("no audit record for {id}: {audit:?}"));
        match allowed_by {
            Some(rule) => {
                assert_eq!(record.0, "message.accepted", "{record:?}");
                assert_eq!(record.1["rules"], serde_json::json!([rule]), "{record:?}");
                assert!(held.contains(id), "held for its agent");
            }
            None => {
                assert_eq!(record.0, "message.refused", "{record:?}");
                assert!(!held.contains(id), "nothing held: {record:?}");
            }
        }
    }
    let rules = |id: Uuid| {
        audit
            .iter()
            .find(|(_, d)| d["msg_id"] == id.to_string())
            .map(|(_, d)| d["rules"].clone())
            .unwrap()
    };
    assert_eq!(rules(cases[1].0), serde_json::json!(["default-deny"]));
    assert_eq!(
        rules(cases[4].0),
        serde_json::json!(["no-remote-text"]),
        "a shell never, not even from its spawner"
    );
    let texts: String = audit.iter().map(|(_, d)| d.to_string()).collect();
    assert!(
        !texts.contains("id > /tmp/x"),
        "no text in the audit: {texts}"
    );

    // b hears `refused` for its two refused messages, with the reason; its allowed one is not
    // reported yet (a pane agent's message is delivered when typed).
    let answers: Deliveries = outbox(&r)
        .into_iter()
        .filter(|(_, _, _, s)| s.meta.dest.host == "b")
        .collect();
    let (acks, _) = take_in(&b, &at_b, &answers);
    assert!(acks.iter().all(|a| *a));
    let state_at_b = |id| b.courier.mailbox().delivery(id).unwrap().unwrap();
    for refused in [cases[1].0, cases[3].0] {
        let tracked = state_at_b(refused);
        assert_eq!(tracked.state, DeliveryState::Refused);
        let reason = tracked.reason.unwrap();
        assert!(reason.starts_with("refused by host r: "), "{reason}");
    }
    assert!(
        state_at_b(cases[3].0)
            .reason
            .unwrap()
            .contains("no message rule admits `f/b`")
    );
    assert_eq!(state_at_b(cases[2].0).state, DeliveryState::Queued);

    // A replay of the refused shell message is a duplicate: not answered twice.
    let before = outbox(&r).len();
    let replay: Deliveries = window
        .iter()
        .filter(|(_, _, _, s)| s.meta.id == cases[4].0)
        .cloned()
        .collect();
    let (_, audit) = take_in(&r, &inbound, &replay);
    assert_eq!(audit[0].0, "message.duplicate");
    assert_eq!(outbox(&r).len(), before);
}

#[test]
fn a_host_users_envelopes_must_claim_its_own_host() {
    let keys: Vec<Arc<HostKey>> = (0..2)
        .map(|_| Arc::new(HostKey::generate().unwrap().0))
        .collect();
    let (a, r) = (gateway("a", &keys[0]), gateway("r", &keys[1]));
    let mut pins = PinnedKeys::default();
    pins.pin(FLEET, "a", *keys[0].public());
    let at_r = Inbound::new(&at(FLEET, "r"), pins, 120_000, Arc::clone(&r.state));
    let mailbox = r.courier.agents().open_mailbox("primary").unwrap();
    for i in 0..2 {
        a.courier
            .send(at(FLEET, "r"), mailbox, None, format!("m{i}"))
            .unwrap();
    }
    // Host a's envelopes, the first published with host b's user, the second with a's own.
    let mut window = outbox_of(&a, "f.b");
    window.truncate(1);
    window.extend(outbox_of(&a, "f.a").into_iter().skip(1));
    let (acks, audit) = take_in(&r, &at_r, &window);
    assert_eq!(acks, vec![true, true]);
    assert_eq!(audit[0].0, "message.refused", "{audit:?}");
    let reason = audit[0].1["reason"].as_str().unwrap();
    assert!(
        reason.contains("user_id `f.b` belongs to host `b`; the envelope claims host `a`"),
        "{reason}"
    );
    assert_eq!(audit[1].0, "message.accepted", "{audit:?}");
}

#[test]
fn where_a_remote_agent_was_seen_outlives_a_restart() {
    let key = Arc::new(HostKey::generate().unwrap().0);
    let g = gateway("a1", &key);
    let (seen, moved) = (Uuid::now_v7(), Uuid::now_v7());
    let b1 = Party {
        fleet: "other".to_owned(),
        host: "b1".to_owned(),
    };
    let b2 = Party {
        fleet: "other".to_owned(),
        host: "b2".to_owned(),
    };
    g.courier.remember_placement(seen, &b1);
    g.courier.remember_placement(moved, &b1);
    g.courier.remember_placement(moved, &b2);
    assert_eq!(g.courier.placed_at(seen), Some(b1.clone()));
    // A restart: a new courier on the same state store, before any beat.
    let again = Courier::new(FLEET, "a1", "/f", Arc::clone(&key), Arc::clone(&g.state)).unwrap();
    assert_eq!(
        again.placed_at(seen),
        Some(b1),
        "known at once after a restart"
    );
    assert_eq!(again.placed_at(moved), Some(b2), "where it was seen last");
    assert_eq!(again.placed_at(Uuid::now_v7()), None, "never seen: unknown");
}

#[test]
fn messages_held_before_shelves_are_put_on_theirs_when_the_courier_opens() {
    let dir = tempfile::tempdir().unwrap();
    let state = Arc::new(StateStore::open(dir.path(), Limits::default()).unwrap());
    let agent = Uuid::now_v7();
    let held = |body: HeldBody, to: Option<Uuid>| {
        let id = Uuid::now_v7();
        let record = Held {
            id,
            origin: at(FLEET, "b1"),
            to,
            created_ms: 1,
            body,
        };
        state.held_put_unshelved(id, &record.encode()).unwrap();
        id
    };
    let message = held(
        HeldBody::Message(AgentMessage {
            v: VERSION,
            to: agent,
            from: None,
            text: "hi".to_owned(),
        }),
        Some(agent),
    );
    let request = held(
        HeldBody::SpawnRequest(crate::wire::SpawnRequest {
            v: VERSION,
            profile: "p".to_owned(),
            env: std::collections::BTreeMap::new(),
            cwd: None,
            label: None,
            by: None,
        }),
        None,
    );
    let reply = held(
        HeldBody::SpawnReply(crate::wire::SpawnReply {
            v: VERSION,
            request: Uuid::now_v7(),
            outcome: crate::wire::SpawnOutcome::Started,
            agent: None,
            reasons: Vec::new(),
        }),
        None,
    );
    assert_eq!(state.held_unshelved(10).unwrap().len(), 3);

    let _courier = Courier::single_host(FLEET, "a1", Arc::clone(&state)).unwrap();
    let on = |shelf| -> Vec<Uuid> {
        state
            .held_on(shelf, 10)
            .unwrap()
            .into_iter()
            .map(|(id, _)| id)
            .collect()
    };
    assert_eq!(on(Shelf::Agent(agent)), vec![message]);
    assert_eq!(on(Shelf::Spawn), vec![request]);
    assert_eq!(on(Shelf::Host), vec![reply]);
    assert!(state.held_unshelved(10).unwrap().is_empty());
}
