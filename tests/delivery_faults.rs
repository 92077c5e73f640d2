//! The fault runs of delivery on the real RabbitMQ: 1,000 messages while `rabbitmqctl stop_app` /
//! `start_app` runs mid-stream — an outage longer than the hosts' `skew_secs`, so the messages
//! queued in the outbox during it are published long after they were created — then 1,000 more
//! while the receiving gateway is killed with SIGKILL and restarted: each delivered exactly once,
//! in the sender's order, and nothing refused.
//!
//! This binary stops the broker, so it holds this one test: nothing runs beside it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code fails loudly"
)]

mod common;

use std::time::Duration;

use common::{Host, eventually, one_fleet, wait_for};
use serde_json::json;

#[test]
fn a_thousand_messages_survive_a_broker_restart_and_a_killed_receiver_exactly_once_in_order() {
    const N: usize = 1000;
    let (_, fleet, password, mut cleanup) = one_fleet("df");
    let root = tempfile::tempdir().unwrap();
    let (mut sender, mut receiver) = (Host::new(root.path(), "s1"), Host::new(root.path(), "r1"));
    // A short skew: the outage below lasts several times longer.
    const SKEW_SECS: u64 = 2;
    for host in [&mut sender, &mut receiver] {
        host.broker_lines = format!("skew_secs = {SKEW_SECS}\n");
    }
    receiver.accept_mail_from(&[&fleet]);
    let (child, sender_log) = sender.start(&fleet, &password, &[], &[(&receiver, &fleet)]);
    cleanup.children.push(child);
    let (child, receiver_log) = receiver.start(&fleet, &password, &[], &[(&sender, &fleet)]);
    cleanup.children.push(child);
    let mut seen = String::new();
    wait_for(
        &sender_log,
        &mut seen,
        &["broker connected"],
        Duration::from_secs(20),
    );
    wait_for(
        &receiver_log,
        &mut seen,
        &["broker connected"],
        Duration::from_secs(20),
    );
    let primary = sender.open_agent("primary");
    let worker = receiver.open_agent("worker");
    sender.wait_listed(&worker);

    // Run 1: the broker's app stops a third of the way in and starts again two thirds in, after
    // an outage of at least three skews.
    let guard = common::BrokerUp;
    let mut ids: Vec<String> = Vec::new();
    let mut stopped = std::time::Instant::now();
    for i in 0..N {
        if i == N / 3 {
            common::rabbitmqctl("stop_app");
            stopped = std::time::Instant::now();
        }
        if i == 2 * N / 3 {
            std::thread::sleep(
                Duration::from_secs(3 * SKEW_SECS).saturating_sub(stopped.elapsed()),
            );
            common::start_broker();
        }
        let (id, route) = sender.send(&worker, &primary, &format!("run1 #{i:04}"));
        assert_eq!(route, "fleet");
        if i == N / 3 {
            let outage = sender.delivery(&id);
            assert_eq!(
                (&outage["state"], &outage["in_broker"]),
                (&json!("queued"), &json!(false)),
                "sent while the broker is down: kept in the outbox"
            );
        }
        ids.push(id);
    }
    drop(guard);
    for id in &ids {
        sender.wait_delivery(id, "delivered");
    }
    let texts = receiver.drain(&worker);
    let expected: Vec<String> = (0..N).map(|i| format!("run1 #{i:04}")).collect();
    assert_eq!(texts.len(), N, "every message exactly once");
    assert_eq!(texts, expected, "in the sender's order");

    // Run 2: the receiving gateway is killed with SIGKILL a third in and restarted two thirds in.
    let mut ids: Vec<String> = Vec::new();
    for i in 0..N {
        if i == N / 3 {
            cleanup.children[1].kill().unwrap();
            cleanup.children[1].wait().unwrap();
        }
        if i == 2 * N / 3 {
            eventually(
                "sent while the receiver is dead: waiting in its inbox",
                Duration::from_secs(20),
                || {
                    let s = sender.delivery(&ids[N / 3]);
                    (s["state"] == "queued" && s["in_broker"] == true).then_some(())
                },
            );
            let (child, _) = receiver.start(&fleet, &password, &[], &[(&sender, &fleet)]);
            cleanup.children[1] = child;
        }
        let (id, _) = sender.send(&worker, &primary, &format!("run2 #{i:04}"));
        ids.push(id);
    }
    for id in &ids {
        sender.wait_delivery(id, "delivered");
    }
    let texts = receiver.drain(&worker);
    let expected: Vec<String> = (0..N).map(|i| format!("run2 #{i:04}")).collect();
    assert_eq!(texts.len(), N, "every message exactly once");
    assert_eq!(texts, expected, "in the sender's order");
    let audit = receiver.state_dir().join("audit.jsonl");
    receiver.cli(&["audit", "verify", "--file", audit.to_str().unwrap()]);
    let refused = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .filter(|line| line.contains("\"message.refused\""))
        .count();
    assert_eq!(refused, 0, "nothing refused as late");

    // The messages that waited in the inbox came in by the window, each window answered with
    // one `delivered` receipt per sender: fewer receipts than messages, some for several at
    // once. (Draining acknowledged every message, one `acknowledged` receipt each.)
    // (A window's audit records follow its acks, so the last ones may land a moment later.)
    let delivered_receipts = || -> Vec<u64> {
        let audit = std::fs::read_to_string(sender.state_dir().join("audit.jsonl")).unwrap();
        audit
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
            .filter(|r| r["event"] == "receipt.accepted" && r["detail"]["state"] == "delivered")
            .map(|record| 1 + record["detail"]["more"].as_array().map_or(0, Vec::len) as u64)
            .collect()
    };
    let receipts = eventually(
        "every message reported delivered once in the sender's audit log",
        Duration::from_secs(10),
        || {
            let receipts = delivered_receipts();
            (receipts.iter().sum::<u64>() >= 2 * N as u64).then_some(receipts)
        },
    );
    assert_eq!(
        receipts.iter().sum::<u64>(),
        2 * N as u64,
        "every message reported delivered once"
    );
    assert!(
        receipts.len() < 2 * N && receipts.iter().any(|n| *n > 1),
        "a window's messages share a receipt ({} receipts)",
        receipts.len()
    );
}
