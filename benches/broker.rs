//! The send→deliver path against raw lapin, on the machine's RabbitMQ, in one run.
//!
//! Run: `cargo bench --bench broker` (needs RabbitMQ at 127.0.0.1:5672, guest/guest; uses the
//! default vhost with a uniquely named exchange and queue, removed afterwards).
//!
//! Raw: publish with confirm; a consumer task acks. fleetd, with the daemon's own parts:
//! `Courier::send` (seal with Ed25519, outbox commit, group disk sync) while a pump publishes
//! with confirm and settles as the link does; the receiving task runs `Courier::intake` (origin,
//! signature, window, replay + dedupe + hold + receipt in one durable transaction per window of
//! up to 32) and acks. Each receiver runs as its own task, as the receiving gateway's link does;
//! a round trip lasts until the receiver has acked. Raw and fleetd alternate in blocks so that
//! drift on a shared machine weighs on both alike. Prints p50/p99 round-trip latency (one
//! message in flight) and throughput (a window of 64 in flight), and the ratios. Targets
//! (issue 4): p50 ≤ 1.5× raw, throughput ≥ 0.7× raw.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::async_yields_async,
    reason = "a benchmark reports on stdout; `publish` hands back the confirm to await later"
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
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, QueueDeleteOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Consumer};
use secrecy::SecretString;
use tokio::sync::watch;
use uuid::Uuid;

const ROUNDS: usize = 1000;
/// How long the receiver may fall silent before the bench reports a stall.
const STALL: Duration = Duration::from_secs(20);
const WINDOW: usize = 64;
const THROUGHPUT_MESSAGES: usize = 4000;
/// Raw and fleetd take turns this many times.
const BLOCKS: usize = 8;

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

/// The receiving side as its own task (as the receiving gateway's link runs it): takes what is
/// waiting, up to one window of 32, `process`es it (`true`: every delivery is to be acked), acks
/// the window's deliveries together and reports the running count of acked messages.
fn receive(
    mut consumer: Consumer,
    mut process: impl FnMut(&[lapin::message::Delivery]) -> bool + Send + 'static,
) -> watch::Receiver<usize> {
    let (acked, counter) = watch::channel(0);
    tokio::spawn(async move {
        let mut total = 0;
        while let Some(first) = consumer.next().await {
            let mut window = vec![first.expect("delivery")];
            while window.len() < 32 {
                match futures_lite::future::poll_once(consumer.next()).await {
                    Some(Some(Ok(d))) => window.push(d),
                    _ => break,
                }
            }
            assert!(process(&window), "genuine messages are taken in");
            let mut acks = tokio::task::JoinSet::new();
            for d in &window {
                let acker = d.acker.clone();
                acks.spawn(async move { acker.ack(BasicAckOptions::default()).await });
            }
            while let Some(sent) = acks.join_next().await {
                assert!(sent.unwrap().unwrap());
            }
            total += window.len();
            acked.send_replace(total);
        }
    });
    counter
}

/// Waits until the receiver has acked `count` messages in all; a stall is reported, not waited
/// out (`what` names the side).
async fn until(acked: &mut watch::Receiver<usize>, count: usize, what: &str) {
    let waited = tokio::time::timeout(STALL, acked.wait_for(|n| *n >= count))
        .await
        .is_ok();
    assert!(
        waited,
        "{what}: only {} of {count} messages acked after {STALL:?}",
        *acked.borrow()
    );
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

    // Raw lapin: the publisher publishes with confirm; a consumer task takes what is waiting
    // (up to a window of 32) and acks it.
    let raw = confirm_channel(&connection).await.unwrap();
    let consume = connection.create_channel().await.unwrap();
    let consumer = consume
        .basic_consume(
            queue.as_str().into(),
            "bench".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut raw_acked = receive(consumer, |_| true);
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
    let publish = || async {
        raw.basic_publish(
            exchange.into(),
            key.as_str().into(),
            options,
            &body,
            props(),
        )
        .await
        .unwrap()
    };
    // fleetd: the daemon's own parts. The sender's `Courier::send` (seal, outbox commit, group
    // disk sync) runs on a blocking thread as the local API runs it, while a pump task publishes
    // on a confirm channel and settles on the broker's answer, as the link does. The receiving
    // gateway's task takes deliveries in with `Courier::intake` (origin, signature, window,
    // replay + dedupe + hold + receipt in one durable transaction per window) and acks after it.
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
    let consumer = consume
        .basic_consume(
            inbox.as_str().into(),
            "bench-fleetd".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let inbound = Inbound::new("guest", pins, 120_000, receiver_state);
    let mut ours_acked = receive(consumer, move |window| {
        let views: Vec<(&str, &BasicProperties, &[u8])> = window
            .iter()
            .map(|d| (d.exchange.as_str(), &d.properties, d.data.as_slice()))
            .collect();
        let (acks, _) = receiver.intake(&inbound, &views);
        acks.iter().all(|a| *a)
    });
    let uri = Arc::new(uri);
    let pump_channel = confirm_channel(&connection).await.unwrap();
    let pumping = Arc::clone(&sender);
    tokio::spawn(async move {
        let mut outlets = Outlets::new(pump_channel, "/", uri, Arc::clone(&pumping));
        let mut pump = Pump::default();
        // The link's loop: woken by new entries, runs again once idle after settling, and
        // every 2 s.
        let mut retry = tokio::time::interval(Duration::from_secs(2));
        loop {
            tokio::select! {
                () = pumping.outbox_ready.notified() => {
                    pump.run(&pumping, "guest", &mut outlets).await.unwrap();
                }
                settled = pump.settle_next(&pumping), if pump.busy() => {
                    settled.unwrap().unwrap();
                    if !pump.busy() {
                        pump.run(&pumping, "guest", &mut outlets).await.unwrap();
                    }
                }
                _ = retry.tick() => {
                    pump.run(&pumping, "guest", &mut outlets).await.unwrap();
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
    let text = "x".repeat(256);

    // Raw and fleetd alternate in blocks (the first side alternating too), so that drift on a
    // shared machine weighs on both alike; latencies and burst times are pooled per side.
    let (mut raw_lat, mut ours_lat) = (Vec::new(), Vec::new());
    let (mut raw_busy, mut ours_busy) = (Duration::ZERO, Duration::ZERO);
    let (mut raw_total, mut ours_total) = (0, 0);
    for block in 0..BLOCKS {
        for side in [block % 2, 1 - block % 2] {
            if side == 0 {
                for _ in 0..ROUNDS / BLOCKS {
                    let t = Instant::now();
                    publish().await.await.unwrap();
                    raw_total += 1;
                    until(&mut raw_acked, raw_total, "raw").await;
                    raw_lat.push(t.elapsed());
                }
                let t = Instant::now();
                let mut sent = 0;
                while sent < THROUGHPUT_MESSAGES / BLOCKS {
                    let mut confirms = Vec::new();
                    while sent < THROUGHPUT_MESSAGES / BLOCKS && confirms.len() < WINDOW {
                        confirms.push(publish().await);
                        sent += 1;
                    }
                    for c in confirms {
                        c.await.unwrap();
                    }
                }
                raw_total += sent;
                until(&mut raw_acked, raw_total, "raw").await;
                raw_busy += t.elapsed();
            } else {
                for _ in 0..ROUNDS / BLOCKS {
                    let t = Instant::now();
                    send(text.clone()).await.unwrap();
                    ours_total += 1;
                    until(&mut ours_acked, ours_total, "fleetd").await;
                    ours_lat.push(t.elapsed());
                }
                let t = Instant::now();
                let mut remaining = THROUGHPUT_MESSAGES / BLOCKS;
                while remaining > 0 {
                    let batch = remaining.min(WINDOW);
                    let sends: Vec<_> = (0..batch).map(|_| send(text.clone())).collect();
                    for s in sends {
                        s.await.unwrap();
                    }
                    remaining -= batch;
                    ours_total += batch;
                }
                until(&mut ours_acked, ours_total, "fleetd").await;
                ours_busy += t.elapsed();
            }
        }
    }
    let raw_rate = THROUGHPUT_MESSAGES as f64 / raw_busy.as_secs_f64();
    let ours_rate = THROUGHPUT_MESSAGES as f64 / ours_busy.as_secs_f64();

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
        "broker bench: {ROUNDS} round trips one at a time; {THROUGHPUT_MESSAGES} messages, {WINDOW} in flight; raw and fleetd alternating in {BLOCKS} blocks"
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
