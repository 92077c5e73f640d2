//! Roster convergence over the real broker: 200 hosts × 50 agents beat into one fleet's roster
//! exchange, and one gateway takes the beats in through its named roster queue exactly as the
//! link does (broker-attested origin, `user_id`, signature by the pinned host key, window), then
//! observes them into its roster.
//!
//! Run: `cargo bench --bench roster_broker` (needs RabbitMQ at 127.0.0.1:5672, guest/guest; uses
//! the default vhost with a uniquely named roster queue, removed afterwards).
//!
//! Worst case on purpose: all 200 hosts send their first beat at the same instant. Prints how
//! long after that burst the gateway's roster held all 200 (target: within one beat interval,
//! 5 s), and, as the baseline measured in the same run, the same for 1 host.

#![allow(
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    reason = "a benchmark reports on stdout"
)]

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleetd::broker::inbound::Inbound;
use fleetd::broker::{connect, envelope, topology};
use fleetd::roster::{HostId, Roster, RosterSettings};
use fleetd::secret::BrokerUri;
use fleetd::state::{Limits, StateStore};
use fleetd::wire::{self, AgentEntry, HostKey, Kind, Meta, Party, Payload, PinnedKeys};
use futures_lite::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicPublishOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use secrecy::SecretString;
use uuid::Uuid;

const HOSTS: usize = 200;
const AGENTS: usize = 50;
const FLEET: &str = "guest";

fn now_ms() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// Host `h`'s first beat, sealed with its key, as the link seals it.
fn beat(h: usize, key: &HostKey, run: &str) -> wire::Sealed {
    let now = now_ms();
    let agents = (0..AGENTS)
        .map(|a| AgentEntry {
            id: Uuid::now_v7(),
            name: format!("agent-{a}"),
            profile: "worker".to_owned(),
            status: "ready".to_owned(),
            since: now,
        })
        .collect();
    let meta = Meta {
        version: wire::VERSION,
        id: Uuid::now_v7(),
        kind: Kind::PresenceBeat,
        origin: Party {
            fleet: FLEET.to_owned(),
            host: format!("{run}-h{h}"),
        },
        dest: Party {
            fleet: FLEET.to_owned(),
            host: String::new(),
        },
        key_id: String::new(),
        created_ms: now,
        expires_ms: now + 15_000,
    };
    let body = wire::PresenceBeat {
        v: wire::VERSION,
        boot: Uuid::now_v7(),
        seq: 1,
        leaving: false,
        agents,
    };
    wire::seal(meta, &Payload::PresenceBeat(body), key)
}

/// Sends the first beat of `hosts` hosts at once; returns how long until the gateway's roster
/// held them all.
async fn converge(connection: &lapin::Connection, hosts: usize, run: &str) -> Duration {
    let keys: Vec<HostKey> = (0..hosts).map(|_| HostKey::generate().unwrap().0).collect();
    let mut pins = PinnedKeys::default();
    for (h, key) in keys.iter().enumerate() {
        pins.pin(FLEET, &format!("{run}-h{h}"), *key.public());
    }
    let dir = tempfile::tempdir().unwrap();
    let state = Arc::new(StateStore::open(dir.path(), Limits::default()).unwrap());
    let me = Party {
        fleet: FLEET.to_owned(),
        host: format!("{run}-gateway"),
    };
    let inbound = Inbound::new(&me, pins, 120_000, state);
    let me = HostId {
        fleet: FLEET.to_owned(),
        host: format!("{run}-gateway"),
    };
    let mut roster = Roster::new(me, RosterSettings::default());
    let queue = format!("gw.{run}.roster");
    let setup = connection.create_channel().await.unwrap();
    topology::declare_exchanges(&setup, &format!("{run}-gateway"))
        .await
        .unwrap();
    topology::declare_roster_queue(
        &setup,
        &queue,
        topology::QueueType::Classic,
        &[(topology::ROSTER_EXCHANGE.to_owned(), "roster.#".to_owned())],
    )
    .await
    .unwrap();
    let no_ack = BasicConsumeOptions {
        no_ack: true,
        ..BasicConsumeOptions::default()
    };
    let mut consumer = setup
        .basic_consume(
            queue.as_str().into(),
            "bench".into(),
            no_ack,
            FieldTable::default(),
        )
        .await
        .unwrap();
    // Seal first: the burst is the broker's and the gateway's work, not the senders'.
    let sealed: Vec<wire::Sealed> = keys
        .iter()
        .enumerate()
        .map(|(h, key)| beat(h, key, run))
        .collect();
    let publish = connection.create_channel().await.unwrap();
    let start = Instant::now();
    for (h, s) in sealed.iter().enumerate() {
        let properties = envelope::properties(s, FLEET).with_delivery_mode(1);
        publish
            .basic_publish(
                topology::ROSTER_EXCHANGE.into(),
                format!("roster.{run}-h{h}").as_str().into(),
                BasicPublishOptions::default(),
                &s.body,
                properties,
            )
            .await
            .unwrap();
    }
    while roster.view().len() < hosts + 1 {
        let delivery = tokio::time::timeout(Duration::from_secs(30), consumer.next())
            .await
            .expect("beats arrive")
            .unwrap()
            .unwrap();
        let (meta, beat) = inbound
            .beat(
                delivery.exchange.as_str(),
                &delivery.properties,
                &delivery.data,
                now_ms(),
            )
            .unwrap();
        let signer = HostId {
            fleet: meta.origin.fleet,
            host: meta.origin.host,
        };
        roster.observe(signer, beat, Instant::now());
    }
    let took = start.elapsed();
    let agents: usize = roster.view().iter().map(|row| row.agents.len()).sum();
    assert_eq!(agents, hosts * AGENTS, "every agent is in the union view");
    let _ = setup
        .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
        .await;
    took
}

/// `cargo bench` passes `--bench`; run any other way (`cargo test --benches`, which the test
/// command runs) this bench takes its short mode — every step, small — so that it cannot rot.
fn quick() -> bool {
    !std::env::args().any(|a| a == "--bench")
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
    let one = converge(&connection, 1, &format!("b1x{nonce}")).await;
    let hosts = if quick() { 10 } else { HOSTS };
    let all = converge(&connection, hosts, &format!("b200x{nonce}")).await;
    println!("roster over the broker: first beats of N hosts × {AGENTS} agents sent at once");
    println!(
        "1 host   : all in the gateway's roster after {:>8.1} ms",
        one.as_secs_f64() * 1e3
    );
    println!(
        "{hosts} hosts : all in the gateway's roster after {:>8.1} ms (target: within one beat interval, 5000 ms)",
        all.as_secs_f64() * 1e3
    );
}
