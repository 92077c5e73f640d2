//! Sending an envelope across fleets through the real RabbitMQ and taking it in: fleet A's host
//! publishes into fleet B's ingress exchange; B's gateway checks exchange ↔ user_id ↔ claimed
//! fleet, the pinned host key, the time window, and dedupes in its state store before holding
//! the message. Each refusal is a separate case. Vhosts and users are created and removed here.

#![allow(
    clippy::unwrap_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code fails loudly"
)]

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::publish::{Publisher, SendOutcome};
use common::{Fleets, grants, nonce};
use fleetd::broker::inbound::{Accepted, Inbound, InboundRefusal};
use fleetd::broker::{connect, envelope, topology};
use fleetd::secret::BrokerUri;
use fleetd::state::{Limits, StateStore};
use fleetd::wire::{self, AgentMessage, HostKey, Kind, Meta, Party, Payload, PinnedKeys, Refusal};
use futures_lite::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use secrecy::SecretString;
use uuid::Uuid;

fn uri(user: &str, password: &str) -> BrokerUri {
    BrokerUri::parse(&SecretString::from(format!(
        "amqp://{user}:{password}@127.0.0.1:5672/%2F{user}"
    )))
    .unwrap()
}

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

fn message(from: &str, host: &str, to_fleet: &str, created_ms: i64) -> (Meta, Payload) {
    let meta = Meta {
        version: wire::VERSION,
        id: Uuid::now_v7(),
        kind: Kind::AgentMessage,
        origin: Party {
            fleet: from.to_owned(),
            host: host.to_owned(),
        },
        dest: Party {
            fleet: to_fleet.to_owned(),
            host: "hostb".to_owned(),
        },
        key_id: String::new(),
        created_ms,
        expires_ms: created_ms + 60_000,
    };
    let payload = Payload::AgentMessage(AgentMessage {
        v: wire::VERSION,
        to: Uuid::now_v7(),
        from: None,
        text: "run the tests".to_owned(),
    });
    (meta, payload)
}

/// The next delivery, checked by `inbound`; accepted or refused, it is acknowledged (a foreign
/// message is never rejected with requeue=false).
async fn take(
    consumer: &mut lapin::Consumer,
    inbound: &Inbound,
) -> Result<Accepted, InboundRefusal> {
    let delivery = tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .unwrap_or_else(|_| panic!("no delivery within 10 s"))
        .unwrap()
        .unwrap();
    let result = inbound.accept(
        delivery.exchange.as_str(),
        &delivery.properties,
        &delivery.data,
        now_ms(),
    );
    assert!(delivery.ack(BasicAckOptions::default()).await.unwrap());
    result
}

#[tokio::test]
async fn envelopes_cross_fleets_once_and_every_forgery_is_refused() {
    let nonce = nonce();
    let (a, b) = (format!("rt-a{nonce}"), format!("rt-b{nonce}"));
    let _cleanup = Fleets::new(&[&a, &b]);
    let (pa, pb) = (format!("PwA{nonce}x"), format!("PwB{nonce}x"));
    grants(&a, &[&b], &pa);
    grants(&b, &[&a], &pb);
    grants(&a, &[&b], &pa);

    let key_a = HostKey::generate().unwrap().0;
    let mut pins = PinnedKeys::default();
    pins.pin(&a, "hosta", *key_a.public());
    pins.pin(&b, "hosta", *key_a.public()); // lets the origin-mismatch case get past the pin
    let dir = tempfile::tempdir().unwrap();
    let state_a = Arc::new(StateStore::open(&dir.path().join("a"), Limits::default()).unwrap());
    let state_b = Arc::new(StateStore::open(&dir.path().join("b"), Limits::default()).unwrap());
    let me = Party {
        fleet: b.clone(),
        host: "hostb".to_owned(),
    };
    let inbound = Inbound::new(&me, pins, 120_000, Arc::clone(&state_b));

    // B declares its control queue bound from its own exchange; what A sends into its ingress
    // exchange reaches it through `fleet.send` (bound by the admin in B's grants).
    let conn_b = connect(&uri(&b, &pb), None).await.unwrap();
    let channel_b = conn_b.create_channel().await.unwrap();
    topology::declare_exchanges(&channel_b, "hostb")
        .await
        .unwrap();
    let ingress = topology::ingress_exchange(&a);
    topology::declare_bound_queue(
        &channel_b,
        "gw.hostb.ctl",
        &topology::host_exchange("hostb"),
        "ctl.hostb",
        topology::inbox_arguments(topology::QueueType::Classic, 1000),
    )
    .await
    .unwrap();
    let mut consumer = channel_b
        .basic_consume(
            "gw.hostb.ctl".into(),
            "test".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();

    // A publishes into B's vhost, through its ingress exchange only.
    let conn_a = connect(&uri(&a, &pa), Some(&format!("/{b}")))
        .await
        .unwrap();
    let publisher = Publisher::open(&conn_a, &format!("/{b}"), &a, Arc::clone(&state_a))
        .await
        .unwrap();

    let (meta, payload) = message(&a, "hosta", &b, now_ms());
    let sealed = wire::seal(meta, &payload, &key_a);
    assert_eq!(
        publisher
            .send(&ingress, "ctl.hostb", &sealed)
            .await
            .unwrap(),
        SendOutcome::Queued
    );
    assert!(
        state_a.outbox_list().unwrap().is_empty(),
        "a confirmed message leaves the outbox"
    );
    match take(&mut consumer, &inbound).await {
        Ok(Accepted::New(accepted)) => {
            let (meta, got) = *accepted;
            assert_eq!(meta.id, sealed.meta.id);
            assert_eq!(got, payload);
        }
        other => panic!("the genuine message: {other:?}"),
    }
    assert_eq!(
        state_b.held_list(10).unwrap().len(),
        1,
        "held durably before the ack"
    );

    // The same envelope again (a republish after a lost confirm, or a replay): dropped once seen.
    assert_eq!(
        publisher
            .send(&ingress, "ctl.hostb", &sealed)
            .await
            .unwrap(),
        SendOutcome::Queued
    );
    assert!(
        matches!(take(&mut consumer, &inbound).await, Ok(Accepted::Duplicate(id)) if id == sealed.meta.id)
    );

    // No queue for the key: "no such agent".
    let (meta, payload) = message(&a, "hosta", &b, now_ms());
    assert_eq!(
        publisher
            .send(&ingress, "ctl.nobody", &wire::seal(meta, &payload, &key_a))
            .await
            .unwrap(),
        SendOutcome::NoRoute
    );

    // Signed by a host whose key B has not pinned.
    let (meta, payload) = message(&a, "intruder", &b, now_ms());
    publisher
        .send(&ingress, "ctl.hostb", &wire::seal(meta, &payload, &key_a))
        .await
        .unwrap();
    assert!(matches!(
        take(&mut consumer, &inbound).await,
        Err(InboundRefusal::Envelope(Refusal::UnpinnedHost { .. }))
    ));

    // Expired (ten minutes old, valid for one).
    let (meta, payload) = message(&a, "hosta", &b, now_ms() - 600_000);
    publisher
        .send(&ingress, "ctl.hostb", &wire::seal(meta, &payload, &key_a))
        .await
        .unwrap();
    assert!(matches!(
        take(&mut consumer, &inbound).await,
        Err(InboundRefusal::Signed {
            refusal: Refusal::Expired,
            ..
        })
    ));

    // Genuine and pinned, but addressed elsewhere (the destination is signed): to another host
    // of B, to another fleet, and to no host at all (only beats and same-fleet messages may
    // leave the host out). Each is refused before anything acts on it.
    for (fleet, host) in [
        (b.as_str(), "somewhere-else"),
        ("otherfleet", "hostb"),
        (b.as_str(), ""),
    ] {
        let (mut meta, payload) = message(&a, "hosta", &b, now_ms());
        meta.dest = Party {
            fleet: fleet.to_owned(),
            host: host.to_owned(),
        };
        publisher
            .send(&ingress, "ctl.hostb", &wire::seal(meta, &payload, &key_a))
            .await
            .unwrap();
        let taken = take(&mut consumer, &inbound).await;
        assert!(
            matches!(&taken, Err(InboundRefusal::Misaddressed { dest, .. }) if dest.fleet == fleet && dest.host == host),
            "{fleet}/{host}: {taken:?}"
        );
    }

    // Claims to come from fleet B while the broker attests A.
    let (meta, payload) = message(&b, "hosta", &b, now_ms());
    publisher
        .send(&ingress, "ctl.hostb", &wire::seal(meta, &payload, &key_a))
        .await
        .unwrap();
    assert!(matches!(
        take(&mut consumer, &inbound).await,
        Err(InboundRefusal::OriginMismatch { .. })
    ));

    // Published without user_id: nothing was validated, so it is refused.
    let raw = conn_a.create_channel().await.unwrap();
    raw.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let (meta, payload) = message(&a, "hosta", &b, now_ms());
    let forged = wire::seal(meta, &payload, &key_a);
    let mut properties = envelope::properties(&forged, &a);
    properties = lapin::BasicProperties::default()
        .with_message_id(properties.message_id().clone().unwrap())
        .with_type(properties.kind().clone().unwrap())
        .with_headers(properties.headers().clone().unwrap());
    raw.basic_publish(
        ingress.as_str().into(),
        "ctl.hostb".into(),
        BasicPublishOptions::default(),
        &forged.body,
        properties,
    )
    .await
    .unwrap()
    .await
    .unwrap();
    assert!(matches!(
        take(&mut consumer, &inbound).await,
        Err(InboundRefusal::NoUserId)
    ));

    // A forged user_id never reaches B: the broker refuses the publish.
    let mut forged_props = envelope::properties(&forged, &b);
    forged_props = forged_props.with_delivery_mode(2);
    let refused = raw
        .basic_publish(
            ingress.as_str().into(),
            "ctl.hostb".into(),
            BasicPublishOptions::default(),
            &forged.body,
            forged_props,
        )
        .await;
    let confirmed = match refused {
        Ok(confirm) => confirm.await,
        Err(e) => Err(e),
    };
    assert!(
        !matches!(confirmed, Ok(lapin::Confirmation::Ack(_))),
        "the broker accepted a forged user_id"
    );
    assert_eq!(
        state_b.held_list(10).unwrap().len(),
        1,
        "only the genuine message is held"
    );
}
