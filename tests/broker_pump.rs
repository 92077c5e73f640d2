//! The outbound pump against the real RabbitMQ. It publishes at most one round per run (the
//! link's loop stays responsive) and keeps at most `MAX_IN_FLIGHT` publishes awaiting confirms:
//! a backlog larger than a round still goes out from a single wake-up, and a backlog larger than
//! the bound goes out as a bounded stream, each message once. Each test creates and removes its
//! own vhost and user.

#![allow(clippy::unwrap_used, clippy::panic, reason = "test code fails loudly")]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Fleets, grants, nonce};
use fleetd::broker::deliver::{Courier, MAX_IN_FLIGHT, Outlets, Pump};
use fleetd::broker::{confirm_channel, connect, topology};
use fleetd::secret::BrokerUri;
use fleetd::state::{Limits, StateStore};
use fleetd::wire::{HostKey, Party};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use secrecy::SecretString;
use uuid::Uuid;

/// One fleet's sending side: a courier with `backlog` messages in its outbox for one agent's
/// inbox, the outlets to publish them, and a channel to look at that inbox.
struct Backlog {
    fleet: String,
    courier: Arc<Courier>,
    outlets: Outlets,
    setup: Channel,
    inbox: String,
    _connection: Connection,
    _state: tempfile::TempDir,
    _cleanup: Fleets,
}

impl Backlog {
    /// The backlog builds up while no pump runs (as during an outage); the sends' wake-ups
    /// collapse into one stored permit.
    async fn new(backlog: usize) -> Backlog {
        Backlog::new_with_cap(backlog, Duration::from_secs(2)).await
    }

    /// [`Backlog::new`] whose foreign vhosts' backoff is capped at `cap`.
    async fn new_with_cap(backlog: usize, cap: Duration) -> Backlog {
        Backlog::new_with(backlog, cap, topology::DEFAULT_MAX_LENGTH).await
    }

    /// [`Backlog::new_with_cap`] whose inbox refuses publishes beyond `max_length` messages.
    async fn new_with(backlog: usize, cap: Duration, max_length: i64) -> Backlog {
        let nonce = nonce();
        let fleet = format!("pump{nonce}");
        let cleanup = Fleets::new(&[&fleet]);
        let password = format!("Pw{nonce}x");
        grants(&fleet, &[], &password);
        let uri = BrokerUri::parse(&SecretString::from(format!(
            "amqp://{fleet}:{password}@127.0.0.1:5672/%2F{fleet}"
        )))
        .unwrap();
        let vhost = format!("/{fleet}");
        let connection = connect(&uri, None).await.unwrap();
        let setup = connection.create_channel().await.unwrap();
        topology::declare_exchanges(&setup, "hostb").await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let state = Arc::new(StateStore::open(dir.path(), Limits::default()).unwrap());
        let key = Arc::new(HostKey::generate().unwrap().0);
        let courier = Arc::new(Courier::new(&fleet, "hosta", &vhost, key, state).unwrap());
        let worker = Uuid::now_v7();
        let inbox = topology::inbox_queue("hostb", &worker.to_string());
        topology::declare_bound_queue(
            &setup,
            &inbox,
            &topology::host_exchange("hostb"),
            &topology::agent_key("hostb", &worker.to_string()),
            topology::inbox_arguments(topology::QueueType::Classic, max_length),
        )
        .await
        .unwrap();
        let dest = Party {
            fleet: fleet.clone(),
            host: "hostb".to_owned(),
        };
        for n in 0..backlog {
            courier
                .send(dest.clone(), worker, None, format!("message {n}"))
                .unwrap();
        }
        assert_eq!(courier.state().outbox_list().unwrap().len(), backlog);
        let channel = confirm_channel(&connection).await.unwrap();
        let probe = connection.create_channel().await.unwrap();
        let outlets = Outlets::new(
            (channel, probe),
            &vhost,
            Arc::new(uri),
            Arc::clone(&courier),
            cap,
        );
        Backlog {
            fleet,
            courier,
            outlets,
            setup,
            inbox,
            _connection: connection,
            _state: dir,
            _cleanup: cleanup,
        }
    }

    fn left(&self) -> usize {
        self.courier.state().outbox_list().unwrap().len()
    }

    /// Runs `pump` in a loop woken by `outbox_ready` that settles the broker's answers, until the
    /// outbox is empty; with `after_settle` the loop also runs the pump again after settling when
    /// it is idle or behind (the link's loop without its retry tick). `Ok`: the most publishes
    /// that awaited confirms at once; `Err`: how many messages were still unpublished after
    /// `within`.
    async fn drain(
        &mut self,
        pump: &mut Pump,
        after_settle: bool,
        within: Duration,
    ) -> Result<usize, usize> {
        let mut most = pump.in_flight();
        let drained = async {
            while self.left() > 0 {
                tokio::select! {
                    () = self.courier.outbox_ready.notified() => {
                        pump.run(&self.courier, &self.fleet, &mut self.outlets).await.unwrap();
                    }
                    settled = pump.settle_next(&self.courier), if pump.busy() => {
                        settled.unwrap().unwrap();
                        if after_settle && (!pump.busy() || pump.behind()) {
                            pump.run(&self.courier, &self.fleet, &mut self.outlets).await.unwrap();
                        }
                    }
                }
                most = most.max(pump.in_flight());
            }
        };
        match tokio::time::timeout(within, drained).await {
            Ok(()) => Ok(most),
            Err(_) => Err(self.left()),
        }
    }

    /// The link's loop (runs on new entries, after settling, when a refused queue may be
    /// tested, and on a 2 s tick) for `time`, then until nothing awaits a confirm.
    async fn drive(&mut self, pump: &mut Pump, time: Duration) {
        let until = tokio::time::Instant::now() + time;
        let mut retry = tokio::time::interval(Duration::from_secs(2));
        loop {
            let now = tokio::time::Instant::now();
            if now >= until && !pump.busy() {
                return;
            }
            let wake = pump.wake_at().map(tokio::time::Instant::from_std);
            tokio::select! {
                () = self.courier.outbox_ready.notified() => {}
                settled = pump.settle_next(&self.courier), if pump.busy() => {
                    settled.unwrap().unwrap();
                }
                () = tokio::time::sleep_until(wake.unwrap_or(until)), if wake.is_some() => {}
                _ = retry.tick() => {}
                () = tokio::time::sleep_until(until), if now < until => {}
            }
            pump.run(&self.courier, &self.fleet, &mut self.outlets)
                .await
                .unwrap();
        }
    }

    /// Takes every message the inbox holds: their message ids, in the queue's order.
    async fn take_all(&self) -> Vec<Uuid> {
        let mut ids = Vec::new();
        while let Some(message) = self
            .setup
            .basic_get(
                self.inbox.as_str().into(),
                lapin::options::BasicGetOptions { no_ack: true },
            )
            .await
            .unwrap()
        {
            let id = message.delivery.properties.message_id().clone().unwrap();
            ids.push(Uuid::parse_str(id.as_str()).unwrap());
        }
        ids
    }

    /// How many messages the inbox holds.
    async fn queued(&self) -> usize {
        let declared = self
            .setup
            .queue_declare(
                self.inbox.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        declared.message_count() as usize
    }
}

#[tokio::test]
async fn a_backlog_larger_than_a_round_goes_out_from_one_wake_up() {
    const BACKLOG: usize = 600; // more than two rounds of 256, less than the in-flight bound
    let mut b = Backlog::new(BACKLOG).await;
    // A pump that runs only when woken (no retry tick, no run after settling): whatever it
    // leaves behind stays there.
    let drained = b
        .drain(
            &mut Pump::new(Duration::from_secs(2)),
            false,
            Duration::from_secs(60),
        )
        .await;
    if let Err(left) = drained {
        panic!("{left} of {BACKLOG} messages were never published after one wake-up");
    }
    assert_eq!(b.queued().await, BACKLOG, "each message published once");
    b.outlets.close().await;
}

#[tokio::test]
async fn a_backlog_larger_than_the_in_flight_bound_goes_out_as_a_bounded_stream() {
    const BACKLOG: usize = MAX_IN_FLIGHT + 500;
    let mut b = Backlog::new(BACKLOG).await;
    let mut pump = Pump::new(Duration::from_secs(2));
    // Runs with nothing settled between them stop at the bound, and say they are behind.
    loop {
        let before = pump.in_flight();
        pump.run(&b.courier, &b.fleet, &mut b.outlets)
            .await
            .unwrap();
        if pump.in_flight() == before {
            break;
        }
    }
    assert_eq!(pump.in_flight(), MAX_IN_FLIGHT, "published up to the bound");
    assert!(pump.behind(), "at the bound with entries waiting");
    // Then the link's loop without its retry tick.
    let most = match b.drain(&mut pump, true, Duration::from_secs(90)).await {
        Ok(most) => most,
        Err(left) => panic!("{left} of {BACKLOG} messages were never published"),
    };
    assert!(
        most <= MAX_IN_FLIGHT,
        "{most} publishes awaited confirms at once (bound {MAX_IN_FLIGHT})"
    );
    assert_eq!(b.queued().await, BACKLOG, "each message published once");
    b.outlets.close().await;
}

/// A foreign vhost the broker refuses every time (here: one that does not exist) is retried
/// with growing rests — 2 s, 4 s, 8 s … up to the cap — not on every round, and the message
/// stays in the outbox (it expires there, logged once, rather than being retried for a day).
#[tokio::test]
async fn a_foreign_vhost_that_keeps_refusing_is_retried_with_growing_rests() {
    let mut b = Backlog::new_with_cap(0, Duration::from_secs(30)).await;
    let missing = format!("nofleet{}", nonce());
    b.courier
        .send(
            Party {
                fleet: missing.clone(),
                host: "hostz".to_owned(),
            },
            Uuid::now_v7(),
            None,
            "for nobody".to_owned(),
        )
        .unwrap();
    let mut pump = Pump::new(Duration::from_secs(2));
    // The link's loop runs the pump at least every second (its retry tick): 15 rounds here.
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_secs(15) {
        pump.run(&b.courier, &b.fleet, &mut b.outlets)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let failures = b.outlets.failures(&format!("/{missing}"));
    // Attempts at 0, 2, 6 and 14 s: four (a fixed 2 s rest would have made eight).
    assert!((2..=4).contains(&failures), "{failures} attempts in 15 s");
    assert_eq!(b.left(), 1, "the message waits in the outbox");
    b.outlets.close().await;
}

/// A bare nack (no return) is not a failure: RabbitMQ nacks for a full `reject-publish` queue,
/// but also while a quorum queue changes leader, for seconds, with the queue empty. Here a real
/// queue shorter than the fleet's inbox limit refuses: its depth (asked with a passive declare)
/// is below the limit, so what it refused stays in the outbox, marked retrying since the first
/// refusal; the queue rests and is tested with the oldest entry, and each time it takes
/// messages again they go on in the sender's order — every message arrives once, in order, and
/// every record ends in the broker.
#[tokio::test]
async fn a_bare_nack_below_the_inbox_limit_is_retried_in_order_until_the_queue_takes_it() {
    const BACKLOG: usize = 40;
    const ROOM: usize = 10;
    let mut b = Backlog::new_with(BACKLOG, Duration::from_secs(2), ROOM as i64).await;
    let mut sent: Vec<Uuid> = b
        .courier
        .state()
        .outbox_list()
        .unwrap()
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    sent.sort();
    let mut pump = Pump::new(Duration::from_secs(2));
    b.drive(&mut pump, Duration::from_secs(2)).await;
    assert_eq!(b.queued().await, ROOM, "the queue holds its limit");
    assert_eq!(
        b.left(),
        BACKLOG - ROOM,
        "what it refused waits in the outbox"
    );
    for id in &sent[ROOM..] {
        let record = b.courier.mailbox().delivery(*id).unwrap().unwrap();
        assert_eq!(record.state, fleetd::wire::DeliveryState::Queued);
        assert!(!record.in_broker, "{record:?}");
        assert!(record.retrying_since_ms.is_some(), "{record:?}");
        let reason = record.reason.unwrap();
        assert!(
            reason.starts_with("unknown since ") && reason.contains(", retrying: "),
            "{reason}"
        );
    }
    // The queue is emptied while the pump rests (as a leader comes back); each time, what
    // waited goes on, oldest first.
    let mut received = Vec::new();
    for _ in 0..BACKLOG {
        received.extend(b.take_all().await);
        if received.len() >= BACKLOG {
            break;
        }
        b.drive(&mut pump, Duration::from_secs(3)).await;
    }
    assert_eq!(received, sent, "every message once, in the sender's order");
    assert_eq!(b.left(), 0);
    for id in &sent {
        let record = b.courier.mailbox().delivery(*id).unwrap().unwrap();
        assert!(
            record.in_broker && record.reason.is_none() && record.retrying_since_ms.is_none(),
            "{record:?}"
        );
    }
    b.outlets.close().await;
}
