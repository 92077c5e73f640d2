//! The send→deliver path against raw lapin, on the machine's RabbitMQ, in one run.
//!
//! Run: `cargo bench --bench broker` (needs RabbitMQ at 127.0.0.1:5672, guest/guest; uses the
//! default vhost with a uniquely named exchange and queue, removed afterwards).
//!
//! Raw: publish with confirm, consume, ack. fleetd: seal (Ed25519), publish through the outbox
//! (redb, durable) with confirm, consume, verify origin and signature, dedupe and hold in one
//! durable transaction, ack. Prints p50/p99 round-trip latency (one message in flight) and
//! throughput (a window of 64 in flight), and the ratios. Targets (issue 4): p50 ≤ 1.5× raw,
//! throughput ≥ 0.7× raw.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "a benchmark reports on stdout"
)]

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleetd::broker::inbound::{Accepted, Inbound};
use fleetd::broker::publish::Publisher;
use fleetd::broker::{connect, topology};
use fleetd::secret::BrokerUri;
use fleetd::state::{Limits, StateStore};
use fleetd::wire::{self, AgentMessage, HostKey, Kind, Meta, Party, Payload, PinnedKeys};
use futures_lite::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions,
    QueueDeleteOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Consumer};
use secrecy::SecretString;
use uuid::Uuid;

const ROUNDS: usize = 1000;
const WINDOW: usize = 64;
const THROUGHPUT_MESSAGES: usize = 4000;

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

fn sealed(key: &HostKey) -> wire::Sealed {
    let now = now_ms();
    let meta = Meta {
        version: wire::VERSION,
        id: Uuid::now_v7(),
        kind: Kind::AgentMessage,
        origin: Party {
            fleet: "guest".to_owned(),
            host: "bench".to_owned(),
        },
        dest: Party {
            fleet: "guest".to_owned(),
            host: "bench".to_owned(),
        },
        key_id: String::new(),
        created_ms: now,
        expires_ms: now + 300_000,
    };
    let payload = Payload::AgentMessage(AgentMessage {
        v: wire::VERSION,
        to: Uuid::now_v7(),
        from: None,
        text: "x".repeat(256),
    });
    wire::seal(meta, &payload, key)
}

async fn next(consumer: &mut Consumer) -> lapin::message::Delivery {
    consumer
        .next()
        .await
        .expect("consumer open")
        .expect("delivery")
}

#[tokio::main]
async fn main() {
    let uri =
        BrokerUri::parse(&SecretString::from("amqp://guest:guest@127.0.0.1:5672/%2F")).unwrap();
    let connection = connect(&uri, None)
        .await
        .expect("RabbitMQ at 127.0.0.1:5672 (guest/guest) is needed: scripts/test starts it");
    let nonce = format!(
        "{:x}",
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    let exchange = "fleet.inbox";
    let queue = format!("agent.bench-{nonce}.inbox");
    let key = format!("bench-{nonce}");
    let setup = connection.create_channel().await.unwrap();
    topology::declare_exchanges(&setup).await.unwrap();
    topology::declare_bound_queue(
        &setup,
        &queue,
        exchange,
        &key,
        topology::inbox_arguments(topology::QueueType::Classic, 1_000_000),
    )
    .await
    .unwrap();

    // Raw lapin.
    let raw = connection.create_channel().await.unwrap();
    raw.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let consume = connection.create_channel().await.unwrap();
    let mut consumer = consume
        .basic_consume(
            queue.as_str().into(),
            "bench".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let body = vec![b'x'; 400];
    let props = || {
        BasicProperties::default()
            .with_delivery_mode(2)
            .with_user_id(ShortString::from("guest"))
            .with_message_id(ShortString::from(Uuid::now_v7().to_string()))
    };
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let mut raw_lat = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        raw.basic_publish(
            exchange.into(),
            key.as_str().into(),
            options,
            &body,
            props(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
        let d = next(&mut consumer).await;
        d.ack(BasicAckOptions::default()).await.unwrap();
        raw_lat.push(t.elapsed());
    }
    let t = Instant::now();
    let mut sent = 0;
    let mut received = 0;
    while received < THROUGHPUT_MESSAGES {
        let mut confirms = Vec::new();
        while sent < THROUGHPUT_MESSAGES && confirms.len() < WINDOW {
            confirms.push(
                raw.basic_publish(
                    exchange.into(),
                    key.as_str().into(),
                    options,
                    &body,
                    props(),
                )
                .await
                .unwrap(),
            );
            sent += 1;
        }
        let batch = confirms.len();
        for c in confirms {
            c.await.unwrap();
        }
        for _ in 0..batch {
            next(&mut consumer)
                .await
                .ack(BasicAckOptions::default())
                .await
                .unwrap();
            received += 1;
        }
    }
    let raw_rate = THROUGHPUT_MESSAGES as f64 / t.elapsed().as_secs_f64();

    // fleetd.
    let dir = tempfile::tempdir().unwrap();
    let host_key = HostKey::generate().unwrap().0;
    let mut pins = PinnedKeys::default();
    pins.pin("guest", "bench", *host_key.public());
    let sender_state = Arc::new(
        StateStore::open(
            &dir.path().join("sender"),
            Limits {
                max_held: 1_000_000,
                ..Limits::default()
            },
        )
        .unwrap(),
    );
    let receiver_state = Arc::new(
        StateStore::open(
            &dir.path().join("receiver"),
            Limits {
                max_held: 1_000_000,
                ..Limits::default()
            },
        )
        .unwrap(),
    );
    let publisher = Arc::new(
        Publisher::open(&connection, "/", "guest", sender_state)
            .await
            .unwrap(),
    );
    let inbound = Inbound::new("guest", pins, 120_000, receiver_state);
    let take = |d: &lapin::message::Delivery| {
        matches!(
            inbound.accept(d.exchange.as_str(), &d.properties, &d.data, now_ms()),
            Ok(Accepted::New(_))
        )
    };
    let mut ours_lat = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let envelope = sealed(&host_key);
        publisher.send(exchange, &key, &envelope).await.unwrap();
        let d = next(&mut consumer).await;
        assert!(take(&d), "a genuine message is taken in");
        d.ack(BasicAckOptions::default()).await.unwrap();
        ours_lat.push(t.elapsed());
    }
    // Throughput: each send waits for its own confirm (it leaves the outbox then), so a window
    // of sends runs concurrently.
    let t = Instant::now();
    let mut received = 0;
    let mut remaining = THROUGHPUT_MESSAGES;
    while received < THROUGHPUT_MESSAGES {
        let batch = remaining.min(WINDOW);
        let mut sends = tokio::task::JoinSet::new();
        for _ in 0..batch {
            let (publisher, envelope, key) =
                (Arc::clone(&publisher), sealed(&host_key), key.clone());
            sends.spawn(async move { publisher.send(exchange, &key, &envelope).await.map(|_| ()) });
        }
        while let Some(outcome) = sends.join_next().await {
            outcome.unwrap().unwrap();
        }
        remaining -= batch;
        for _ in 0..batch {
            let d = next(&mut consumer).await;
            assert!(take(&d));
            d.ack(BasicAckOptions::default()).await.unwrap();
            received += 1;
        }
    }
    let ours_rate = THROUGHPUT_MESSAGES as f64 / t.elapsed().as_secs_f64();

    let _ = setup
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    let (rp50, rp99) = (
        percentile(&mut raw_lat, 0.5),
        percentile(&mut raw_lat, 0.99),
    );
    let (op50, op99) = (
        percentile(&mut ours_lat, 0.5),
        percentile(&mut ours_lat, 0.99),
    );
    println!(
        "broker bench: {ROUNDS} round trips one at a time; {THROUGHPUT_MESSAGES} messages, {WINDOW} in flight"
    );
    println!(
        "raw lapin : p50 {:>7.3} ms  p99 {:>7.3} ms  throughput {:>8.0} msg/s",
        rp50.as_secs_f64() * 1e3,
        rp99.as_secs_f64() * 1e3,
        raw_rate
    );
    println!(
        "fleetd    : p50 {:>7.3} ms  p99 {:>7.3} ms  throughput {:>8.0} msg/s",
        op50.as_secs_f64() * 1e3,
        op99.as_secs_f64() * 1e3,
        ours_rate
    );
    println!(
        "ratios    : p50 {:.2}x raw (target <= 1.5x), throughput {:.2}x raw (target >= 0.7x)",
        op50.as_secs_f64() / rp50.as_secs_f64(),
        ours_rate / raw_rate
    );
}
