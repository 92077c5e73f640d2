//! The send→deliver path against raw lapin, on the machine's RabbitMQ, in one run.
//!
//! Run: `cargo bench --bench broker` (needs RabbitMQ at 127.0.0.1:5672, guest/guest; uses the
//! default vhost with a uniquely named exchange and queue, removed afterwards).
//!
//! Raw: publish with confirm, consume, ack. fleetd, with the daemon's own parts: `Courier::send`
//! (seal with Ed25519, outbox commit, group disk sync) while a pump publishes with confirm and
//! settles; then `Courier::intake` (origin, signature, window, replay + dedupe + hold + receipt in
//! one durable transaction per window of up to 32) and ack. Prints p50/p99 round-trip latency
//! (one message in flight) and throughput (a window of 64 in flight), and the ratios. Targets
//! (issue 4): p50 ≤ 1.5× raw, throughput ≥ 0.7× raw.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "a benchmark reports on stdout"
)]

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleetd::broker::deliver::{Courier, Outlets, Pump};
use fleetd::broker::inbound::Inbound;
use fleetd::broker::{confirm_channel, connect, topology};
use fleetd::secret::BrokerUri;
use fleetd::state::{Limits, StateStore};
use fleetd::wire::{HostKey, Party, PinnedKeys};
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

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
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

    // fleetd: the daemon's own parts. The sender's `Courier::send` (seal, outbox commit, group
    // disk sync) runs on a blocking thread as the local API runs it, while a pump task publishes
    // on a confirm channel and settles on the broker's answer, as the link does. The receiver
    // takes deliveries in with `Courier::intake` (origin, signature, window, replay + dedupe +
    // hold + receipt in one durable transaction per window) and acks after it.
    let dir = tempfile::tempdir().unwrap();
    let host_key = Arc::new(HostKey::generate().unwrap().0);
    let mut pins = PinnedKeys::default();
    pins.pin("guest", "bench-s", *host_key.public());
    let store = |name: &str| {
        Arc::new(
            StateStore::open(
                &dir.path().join(name),
                Limits {
                    max_held: 1_000_000,
                    ..Limits::default()
                },
            )
            .unwrap(),
        )
    };
    let (sender_state, receiver_state) = (store("sender"), store("receiver"));
    let sender = Arc::new(
        Courier::new("guest", "bench-s", "/", Arc::clone(&host_key), sender_state).unwrap(),
    );
    let receiver = Courier::new(
        "guest",
        "bench-r",
        "/",
        Arc::clone(&host_key),
        Arc::clone(&receiver_state),
    )
    .unwrap();
    let worker = receiver.open_agent("worker", "mailbox", None).unwrap();
    let inbox = topology::inbox_queue(&worker.to_string());
    topology::declare_bound_queue(
        &setup,
        &inbox,
        exchange,
        &worker.to_string(),
        topology::inbox_arguments(topology::QueueType::Classic, 1_000_000),
    )
    .await
    .unwrap();
    let mut consumer = consume
        .basic_consume(
            inbox.as_str().into(),
            "bench-fleetd".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let inbound = Inbound::new("guest", pins, 120_000, receiver_state);
    let uri = Arc::new(uri);
    let publish = confirm_channel(&connection).await.unwrap();
    let pumping = Arc::clone(&sender);
    tokio::spawn(async move {
        let mut outlets = Outlets::new(publish, "/", uri, Arc::clone(&pumping));
        let mut pump = Pump::default();
        loop {
            tokio::select! {
                () = pumping.outbox_ready.notified() => {
                    pump.run(&pumping, "guest", &mut outlets).await.unwrap();
                }
                settled = pump.settle_next(&pumping), if pump.busy() => {
                    settled.unwrap().unwrap();
                }
            }
        }
    });
    let dest = Party {
        fleet: "guest".to_owned(),
        host: String::new(),
    };
    let send = |text: String| {
        let (sender, dest) = (Arc::clone(&sender), dest.clone());
        tokio::task::spawn_blocking(move || sender.send(dest, worker, None, text).unwrap())
    };
    // Takes in what is waiting (up to one prefetch window, as the link does) and acks it.
    let take_in = |deliveries: Vec<lapin::message::Delivery>| {
        let views: Vec<(&str, &BasicProperties, &[u8])> = deliveries
            .iter()
            .map(|d| (d.exchange.as_str(), &d.properties, d.data.as_slice()))
            .collect();
        let (acks, _) = receiver.intake(&inbound, &views);
        assert!(acks.iter().all(|a| *a), "genuine messages are taken in");
        deliveries
    };
    let text = "x".repeat(256);
    let mut ours_lat = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        send(text.clone()).await.unwrap();
        for d in take_in(vec![next(&mut consumer).await]) {
            d.ack(BasicAckOptions::default()).await.unwrap();
        }
        ours_lat.push(t.elapsed());
    }
    let t = Instant::now();
    let mut received = 0;
    let mut remaining = THROUGHPUT_MESSAGES;
    while received < THROUGHPUT_MESSAGES {
        let batch = remaining.min(WINDOW);
        let sends: Vec<_> = (0..batch).map(|_| send(text.clone())).collect();
        for s in sends {
            s.await.unwrap();
        }
        remaining -= batch;
        let mut left = batch;
        while left > 0 {
            let mut window = vec![next(&mut consumer).await];
            while window.len() < left.min(32) {
                match futures_lite::future::poll_once(consumer.next()).await {
                    Some(Some(Ok(d))) => window.push(d),
                    _ => break,
                }
            }
            left -= window.len();
            received += window.len();
            let acked = take_in(window);
            // As the link does: the window's acks go out together.
            let mut acks = tokio::task::JoinSet::new();
            for d in acked {
                let acker = d.acker.clone();
                acks.spawn(async move { acker.ack(BasicAckOptions::default()).await });
            }
            while let Some(sent) = acks.join_next().await {
                assert!(sent.unwrap().unwrap());
            }
        }
    }
    let ours_rate = THROUGHPUT_MESSAGES as f64 / t.elapsed().as_secs_f64();

    let _ = setup
        .queue_delete(inbox.as_str().into(), QueueDeleteOptions::default())
        .await;
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
