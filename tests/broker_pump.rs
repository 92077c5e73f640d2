//! The outbound pump against the real RabbitMQ: a backlog larger than one pump round is
//! published in full from a single wake-up. The pump publishes at most one round per run (the
//! link's loop stays responsive); the rest must not wait for another send, nor for the whole
//! in-flight set to settle. The vhost and user are created and removed here.

#![allow(clippy::unwrap_used, clippy::panic, reason = "test code fails loudly")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Fleets, grants, nonce};
use fleetd::broker::deliver::{Courier, Outlets, Pump};
use fleetd::broker::{confirm_channel, connect, topology};
use fleetd::secret::BrokerUri;
use fleetd::state::{Limits, StateStore};
use fleetd::wire::{HostKey, Party};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use secrecy::SecretString;
use uuid::Uuid;

/// More than two pump rounds (256 each).
const BACKLOG: usize = 600;

#[tokio::test]
async fn a_backlog_larger_than_a_round_goes_out_from_one_wake_up() {
    let nonce = nonce();
    let fleet = format!("pump{nonce}");
    let _cleanup = Fleets::new(&[&fleet]);
    let password = format!("Pw{nonce}x");
    grants(&fleet, &[], &password);
    let uri = BrokerUri::parse(&SecretString::from(format!(
        "amqp://{fleet}:{password}@127.0.0.1:5672/%2F{fleet}"
    )))
    .unwrap();
    let vhost = format!("/{fleet}");
    let connection = connect(&uri, None).await.unwrap();
    let setup = connection.create_channel().await.unwrap();
    topology::declare_exchanges(&setup).await.unwrap();

    let dir = tempfile::tempdir().unwrap();
    let state = Arc::new(StateStore::open(dir.path(), Limits::default()).unwrap());
    let key = Arc::new(HostKey::generate().unwrap().0);
    let courier = Arc::new(Courier::new(&fleet, "hosta", &vhost, key, state).unwrap());
    let worker = Uuid::now_v7();
    let inbox = topology::inbox_queue(&worker.to_string());
    topology::declare_bound_queue(
        &setup,
        &inbox,
        topology::INBOX_EXCHANGE,
        &worker.to_string(),
        topology::inbox_arguments(topology::QueueType::Classic, 10_000),
    )
    .await
    .unwrap();

    // The backlog builds up while no pump runs (as during an outage); the sends' wake-ups
    // collapse into one stored permit.
    let dest = Party {
        fleet: fleet.clone(),
        host: "hostb".to_owned(),
    };
    for n in 0..BACKLOG {
        courier
            .send(dest.clone(), worker, None, format!("message {n}"))
            .unwrap();
    }
    assert_eq!(courier.state().outbox_list().unwrap().len(), BACKLOG);

    // A pump that runs only when woken (no retry tick, no run after settling): whatever it
    // leaves behind stays there.
    let channel = confirm_channel(&connection).await.unwrap();
    let mut outlets = Outlets::new(channel, &vhost, Arc::new(uri), Arc::clone(&courier));
    let mut pump = Pump::default();
    let drained = async {
        while !courier.state().outbox_list().unwrap().is_empty() {
            tokio::select! {
                () = courier.outbox_ready.notified() => {
                    pump.run(&courier, &fleet, &mut outlets).await.unwrap();
                }
                settled = pump.settle_next(&courier), if pump.busy() => {
                    settled.unwrap().unwrap();
                }
            }
        }
    };
    let in_time = tokio::time::timeout(Duration::from_secs(60), drained).await;
    let left = courier.state().outbox_list().unwrap().len();
    assert!(
        in_time.is_ok(),
        "{left} of {BACKLOG} messages were never published after one wake-up"
    );
    let queued = setup
        .queue_declare(
            inbox.as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap()
        .message_count();
    assert_eq!(queued as usize, BACKLOG, "each message published once");
    outlets.close().await;
}
