//! The send→deliver path against raw lapin, on the machine's RabbitMQ, in one run.
//!
//! Run: `cargo bench --bench broker` (needs RabbitMQ at 127.0.0.1:5672, guest/guest; uses the
//! default vhost with uniquely named queues on the inbox exchange, removed afterwards).
//!
//! Raw: publish with confirm; a consumer task acks. fleetd, with the daemon's own parts:
//! `Courier::send` (seal with Ed25519, outbox commit, group disk sync) while a pump publishes
//! with confirm and settles as the link does; the receiving task runs `Courier::intake` (origin,
//! signature, window, replay + dedupe + hold + receipt in one durable transaction per window of
//! up to 32), acks, then hands the window's decisions to the audit log's writer thread and
//! takes the next window, as the link does. Each receiver runs as its own task, as the
//! receiving gateway's link does; a round trip lasts until the receiver has acked. A third side, the *floor*, is raw lapin plus
//! the least that any implementation of the requirements must add per message (an Ed25519
//! signature made and verified, one 4 KiB record made durable before the ack); it bounds from
//! below what the targets can ask of fleetd on this machine. The three sides take turns in
//! blocks so that drift on a shared machine weighs on all alike. Prints p50/p99 round-trip
//! latency (one message in flight) and throughput (a window of 64 in flight), and the ratios.
//! Targets (issue 4): p50 ≤ 1.5× raw, throughput ≥ 0.7× raw. Also prints (no targets) the
//! floor's ratios to raw, fleetd's to the floor, and the receiver's intake time for a window of
//! one.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::async_yields_async,
    reason = "a benchmark reports on stdout; `publish` hands back the confirm to await later"
)]

use std::fs::File;
use std::future::Future;
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ed25519_dalek::{Signature, Signer, SigningKey};
use fleetd::audit::{Audit, Background};
use fleetd::broker::deliver::{Courier, Outlets, Pump};
use fleetd::broker::inbound::Inbound;
use fleetd::broker::topology::{SEND_EXCHANGE, agent_key, host_exchange};
use fleetd::broker::{confirm_channel, connect, topology};
use fleetd::scrub::Scrubber;
use fleetd::secret::BrokerUri;
use fleetd::state::{Limits, StateStore};
use fleetd::wire::{HostKey, Party, PinnedKeys};
use futures_lite::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, Consumer};
use secrecy::SecretString;
use tokio::sync::watch;
use uuid::Uuid;

const ROUNDS: usize = 1200;
/// How long the receiver may fall silent before the bench reports a stall.
const STALL: Duration = Duration::from_secs(20);
const WINDOW: usize = 64;
const THROUGHPUT_MESSAGES: usize = 3840;
/// Raw, floor and fleetd take turns this many times.
const BLOCKS: usize = 6;
/// How much smaller the short mode is.
const QUICK_SHARE: usize = 20;
/// The floor's journal: pre-written, so that its durable writes allocate nothing.
const JOURNAL_PAGES: u64 = 256;

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

/// The receiving side as its own task (as the receiving gateway's link runs it): takes what is
/// waiting, up to one window of 32, `process`es it (`true`: every delivery is to be acked), acks
/// the window's deliveries together and reports the running count of acked messages.
fn receive<R: Send + 'static>(
    mut consumer: Consumer,
    mut process: impl FnMut(&[lapin::message::Delivery]) -> (bool, R) + Send + 'static,
    mut after: impl FnMut(R) + Send + 'static,
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
            let (taken, then) = process(&window);
            assert!(taken, "genuine messages are taken in");
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
            after(then);
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

/// Declares the bench's queues and their consumers.
struct Inboxes<'a> {
    setup: &'a Channel,
    consume: &'a Channel,
}

impl Inboxes<'_> {
    /// Declares `queue`, agent `id`'s inbox on `host`, bound as a gateway binds it (from
    /// `host.HOST`, which `fleet.send` feeds), and consumes it.
    async fn consumer(&self, queue: &str, (host, id): (&str, &str)) -> Consumer {
        topology::declare_bound_queue(
            self.setup,
            queue,
            &host_exchange(host),
            &agent_key(host, id),
            bench_queue_arguments(),
        )
        .await
        .unwrap();
        self.consume
            .basic_consume(
                queue.into(),
                queue.into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap()
    }
}

/// Publishes `body` to `fleet.send` with `key` on confirm channel `channel` as a fleet
/// user would (persistent, `mandatory`, `user_id`, a message id); the started message is
/// finished when the broker confirms it.
async fn publish_confirmed(channel: &Channel, key: &str, body: Vec<u8>) -> Started {
    let properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_user_id(ShortString::from("guest"))
        .with_message_id(ShortString::from(Uuid::now_v7().to_string()));
    let options = BasicPublishOptions {
        mandatory: true,
        ..BasicPublishOptions::default()
    };
    let confirm = channel
        .basic_publish(SEND_EXCHANGE.into(), key.into(), options, &body, properties)
        .await
        .unwrap();
    Box::pin(async move {
        confirm.await.unwrap();
    })
}

/// An inbox's arguments, plus `x-expires`: a run that panics leaves no queue behind for long.
fn bench_queue_arguments() -> FieldTable {
    let mut arguments = topology::inbox_arguments(topology::QueueType::Classic, 1_000_000);
    arguments.insert("x-expires".into(), AMQPValue::LongInt(600_000));
    arguments
}

/// A message started: awaiting it waits for what the sender waits for (raw: the broker's
/// confirm; fleetd: `send` returning, i.e. the outbox entry durable).
type Started = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One side of the comparison: what its receiver has acked, and what it measured.
struct Side {
    name: &'static str,
    acked: watch::Receiver<usize>,
    total: usize,
    latencies: Vec<Duration>,
    busy: Duration,
}

impl Side {
    fn new(name: &'static str, acked: watch::Receiver<usize>) -> Side {
        Side {
            name,
            acked,
            total: 0,
            latencies: Vec::with_capacity(rounds()),
            busy: Duration::ZERO,
        }
    }

    /// One block: round trips one at a time (until the receiver acked), then a burst with up to
    /// [`WINDOW`] started at once, timed until the receiver acked all of it.
    async fn block<F: Future<Output = Started>>(&mut self, start: impl Fn() -> F) {
        for _ in 0..rounds() / BLOCKS {
            let t = Instant::now();
            start().await.await;
            self.total += 1;
            until(&mut self.acked, self.total, self.name).await;
            self.latencies.push(t.elapsed());
        }
        let t = Instant::now();
        let mut remaining = throughput_messages() / BLOCKS;
        while remaining > 0 {
            let batch = remaining.min(WINDOW);
            let mut started = Vec::with_capacity(batch);
            for _ in 0..batch {
                started.push(start().await);
            }
            for s in started {
                s.await;
            }
            remaining -= batch;
        }
        self.total += throughput_messages() / BLOCKS;
        until(&mut self.acked, self.total, self.name).await;
        self.busy += t.elapsed();
    }

    /// p50, p99 and messages per second.
    fn report(&mut self) -> (Duration, Duration, f64) {
        (
            percentile(&mut self.latencies, 0.5),
            percentile(&mut self.latencies, 0.99),
            throughput_messages() as f64 / self.busy.as_secs_f64(),
        )
    }
}

/// `cargo bench` passes `--bench`; run any other way (`cargo test --benches`, which the test
/// command runs) this bench takes its short mode — every step, small — so that it cannot rot.
fn quick() -> bool {
    !std::env::args().any(|a| a == "--bench")
}

/// Round trips one at a time.
fn rounds() -> usize {
    if quick() {
        ROUNDS / QUICK_SHARE
    } else {
        ROUNDS
    }
}

/// Messages sent with a window in flight.
fn throughput_messages() -> usize {
    if quick() {
        THROUGHPUT_MESSAGES / QUICK_SHARE
    } else {
        THROUGHPUT_MESSAGES
    }
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
    let setup = connection.create_channel().await.unwrap();
    for host in ["bench", "bench-r"] {
        topology::declare_exchanges(&setup, host).await.unwrap();
    }
    let consume = connection.create_channel().await.unwrap();
    let inboxes = Inboxes {
        setup: &setup,
        consume: &consume,
    };

    // Raw lapin: the publisher publishes with confirm; a consumer task takes what is waiting
    // (up to a window of 32) and acks it.
    let raw = confirm_channel(&connection).await.unwrap();
    let queue = format!("agent.bench-{nonce}.inbox");
    let id = format!("bench-{nonce}");
    let key = agent_key("bench", &id);
    let raw_acked = receive(
        inboxes.consumer(&queue, ("bench", &id)).await,
        |_| (true, ()),
        |()| (),
    );
    let body = vec![b'x'; 400];
    // The floor: raw lapin plus the least any implementation of the requirements must do per
    // message on the path — the sender signs (Ed25519), the receiver verifies (`verify_strict`)
    // and makes one 4 KiB record durable (`pwrite` + `fdatasync` into a pre-written journal in
    // the state directory's file system) before it acks. Lower than any real implementation: no
    // envelope, no replay or dedupe lookup, no outbox write on the sender.
    let floor_queue = format!("agent.bench-{nonce}-floor.inbox");
    let floor_id = format!("bench-{nonce}-floor");
    let floor_key = agent_key("bench", &floor_id);
    let floor_consumer = inboxes.consumer(&floor_queue, ("bench", &floor_id)).await;
    let dir = tempfile::tempdir().unwrap();
    let signing = Arc::new(SigningKey::from_bytes(&[7; 32]));
    let verifying = signing.verifying_key();
    let journal = File::create_new(dir.path().join("floor.journal")).unwrap();
    for page in 0..JOURNAL_PAGES {
        journal.write_all_at(&[0; 4096], page * 4096).unwrap();
    }
    journal.sync_all().unwrap();
    let mut next_page = 0;
    let floor_acked = receive(
        floor_consumer,
        move |window| {
            let mut page = [0u8; 4096];
            for (d, slot) in window.iter().zip(page.chunks_mut(64)) {
                let (signature, body) = d.data.split_at(64);
                let signature = Signature::from_slice(signature).unwrap();
                verifying.verify_strict(body, &signature).unwrap();
                slot.copy_from_slice(&d.data[..64]);
            }
            journal.write_all_at(&page, next_page * 4096).unwrap();
            journal.sync_data().unwrap();
            next_page = (next_page + 1) % JOURNAL_PAGES;
            (true, ())
        },
        |()| (),
    );
    // fleetd: the daemon's own parts. The sender's `Courier::send` (seal, outbox commit, group
    // disk sync) runs on a blocking thread as the local API runs it, while a pump task publishes
    // on a confirm channel and settles on the broker's answer, as the link does. The receiving
    // gateway's task takes deliveries in with `Courier::intake` (origin, signature, window,
    // replay + dedupe + hold + receipt in one durable transaction per window) and acks after it.
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
    let worker = receiver.agents().open_mailbox("worker").unwrap();
    let inbox = topology::inbox_queue("bench-r", &worker.to_string());
    let consumer = inboxes
        .consumer(&inbox, ("bench-r", &worker.to_string()))
        .await;
    let me = Party {
        fleet: "guest".to_owned(),
        host: "bench-r".to_owned(),
    };
    let inbound = Inbound::new(&me, pins, 120_000, receiver_state);
    // The intake of a window of one (the latency phase), timed: the part of a round trip that
    // only fleetd has (checks, and the durable hand-off before the ack).
    let intakes = Arc::new(std::sync::Mutex::new(Vec::with_capacity(rounds())));
    let timed = Arc::clone(&intakes);
    // After the acks, the window's decisions go to the audit log's background writer, as the
    // link records them.
    let audit = Arc::new(Audit::open(&dir.path().join("receiver"), Scrubber::new()).unwrap());
    let audit_failed = Arc::new(std::sync::Mutex::new(None));
    let failed = Arc::clone(&audit_failed);
    let record = fleetd::daemon::background_recorder(Arc::new(
        Background::start(audit, move |error| {
            failed.lock().unwrap().get_or_insert(error.to_string());
        })
        .unwrap(),
    ));
    let ours_acked = receive(
        consumer,
        move |window| {
            let views: Vec<(&str, &BasicProperties, &[u8])> = window
                .iter()
                .map(|d| (d.exchange.as_str(), &d.properties, d.data.as_slice()))
                .collect();
            let t = Instant::now();
            let (acks, audit) = receiver.intake(&inbound, &views);
            if window.len() == 1 {
                timed.lock().unwrap().push(t.elapsed());
            }
            (acks.iter().all(|a| *a), audit)
        },
        move |audit| record(audit),
    );
    let uri = Arc::new(uri);
    let pump_channel = confirm_channel(&connection).await.unwrap();
    let probe_channel = connection.create_channel().await.unwrap();
    let pumping = Arc::clone(&sender);
    tokio::spawn(async move {
        let mut outlets = Outlets::new(
            (pump_channel, probe_channel),
            "/",
            uri,
            Arc::clone(&pumping),
            Duration::from_secs(2),
        );
        let mut pump = Pump::new(Duration::from_secs(2));
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
                    if !pump.busy() || pump.behind() {
                        pump.run(&pumping, "guest", &mut outlets).await.unwrap();
                    }
                }
                _ = retry.tick() => {
                    pump.run(&pumping, "guest", &mut outlets).await.unwrap();
                }
            }
        }
    });
    // Agent messages name their host (the key is `agent.HOST.ID`).
    let dest = Party {
        fleet: "guest".to_owned(),
        host: "bench-r".to_owned(),
    };
    let send = |text: String| {
        let (sender, dest) = (Arc::clone(&sender), dest.clone());
        tokio::task::spawn_blocking(move || sender.send(dest, worker, None, text).unwrap())
    };
    let text = "x".repeat(256);

    // The sides take turns in blocks, so that drift on a shared machine weighs on all alike;
    // latencies and burst times are pooled per side.
    let raw_start = || publish_confirmed(&raw, &key, body.clone());
    let ours_start = || {
        let sent = send(text.clone());
        async move {
            Box::pin(async move {
                sent.await.unwrap();
            }) as Started
        }
    };
    let floor_start = || {
        let mut signed = signing.sign(&body).to_bytes().to_vec();
        signed.extend_from_slice(&body);
        publish_confirmed(&raw, &floor_key, signed)
    };
    let mut raw = Side::new("raw", raw_acked);
    let mut floor = Side::new("floor", floor_acked);
    let mut ours = Side::new("fleetd", ours_acked);
    for block in 0..BLOCKS {
        // Each side goes first, second and third equally often.
        for turn in 0..3 {
            match (block + turn) % 3 {
                0 => raw.block(raw_start).await,
                1 => floor.block(floor_start).await,
                _ => ours.block(ours_start).await,
            }
        }
    }

    for name in [&inbox, &queue, &floor_queue] {
        let _ = setup
            .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
            .await;
    }
    let failed = audit_failed.lock().unwrap().take();
    assert!(
        failed.is_none(),
        "the receiver's audit log failed: {failed:?}"
    );
    let (rp50, rp99, raw_rate) = raw.report();
    let (fp50, fp99, floor_rate) = floor.report();
    let (op50, op99, ours_rate) = ours.report();
    println!(
        "broker bench{}: {} round trips one at a time; {} messages, {WINDOW} in flight; raw, floor and fleetd taking turns in {BLOCKS} blocks",
        if quick() {
            " (short mode: no figures to keep)"
        } else {
            ""
        },
        rounds(),
        throughput_messages()
    );
    let line = |name: &str, p50: Duration, p99: Duration, rate: f64| {
        println!(
            "{name:<10}: p50 {:>7.3} ms  p99 {:>7.3} ms  throughput {:>8.0} msg/s",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3,
            rate
        );
    };
    line("raw lapin", rp50, rp99, raw_rate);
    line("floor", fp50, fp99, floor_rate);
    line("fleetd", op50, op99, ours_rate);
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "ratios    : p50 {:.2}x raw (target <= 1.5x), throughput {:.2}x raw (target >= 0.7x)",
        ratio(op50, rp50),
        ours_rate / raw_rate
    );
    // Not targets: what the requirements alone cost over raw (the floor), and fleetd over that.
    println!(
        "floor     : p50 {:.2}x raw, throughput {:.2}x raw; fleetd over the floor: p50 {:.2}x, throughput {:.2}x",
        ratio(fp50, rp50),
        floor_rate / raw_rate,
        ratio(op50, fp50),
        ours_rate / floor_rate
    );
    // Not a target: how much of fleetd's p50 the receiver's intake (checks and the durable
    // hand-off it must finish before acking) accounts for.
    let intake50 = percentile(&mut intakes.lock().unwrap(), 0.5);
    println!(
        "intake    : p50 {:>7.3} ms for a window of one (verify, replay + dedupe + hold + receipt, durable commit); fleetd p50 less it = {:.2}x raw",
        intake50.as_secs_f64() * 1e3,
        ratio(op50.saturating_sub(intake50), rp50)
    );
}
