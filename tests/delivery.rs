//! Routing and delivery between running gateways on the real RabbitMQ: across fleets (through
//! ingress exchanges and control queues) and within a fleet (through agent inboxes), with
//! delivery receipts that move the sender's delivery state, held messages offered until
//! acknowledged, "no such agent" from a `mandatory` return, and local routing without the broker.
//! The fault runs are in `delivery_faults.rs` (they stop the broker: their own test binary, so
//! nothing runs beside them).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code fails loudly"
)]

mod common;

use std::time::Duration;

use common::{Fleets, Host, eventually, nonce, terminate, wait_for};

#[test]
fn messages_cross_fleets_with_receipts_and_are_held_until_acknowledged() {
    let nonce = nonce();
    let (a, b) = (format!("da{nonce}"), format!("db{nonce}"));
    let mut cleanup = Fleets::new(&[&a, &b]);
    common::fleet_grants(&a, &[&b]);
    common::fleet_grants(&b, &[&a]);
    // Each host runs with its own broker user (`FLEET.HOST`), which reaches only its own queues
    // and writes into the other fleet's ingress exchange.
    let (p_laptop, p_w1) = (format!("PwL{nonce}x"), format!("PwW{nonce}x"));
    common::host_grants(&a, "laptop", &[&b], &p_laptop);
    common::host_grants(&b, "w1", &[&a], &p_w1);
    let root = tempfile::tempdir().unwrap();
    let (mut laptop, mut worker_host) = (
        Host::new(root.path(), "laptop"),
        Host::new(root.path(), "w1"),
    );
    laptop.broker_user = Some(format!("{a}.laptop"));
    worker_host.broker_user = Some(format!("{b}.w1"));
    laptop.accept_mail_from(&[&b]);
    worker_host.accept_mail_from(&[&a]);
    let (child, laptop_log) = laptop.start(&a, &p_laptop, &[&b], &[(&worker_host, &b)]);
    cleanup.children.push(child);
    let (child, worker_log) = worker_host.start(&b, &p_w1, &[&a], &[(&laptop, &a)]);
    cleanup.children.push(child);
    let mut seen = String::new();
    wait_for(
        &laptop_log,
        &mut seen,
        &["broker connected"],
        Duration::from_secs(20),
    );
    wait_for(
        &worker_log,
        &mut seen,
        &["broker connected"],
        Duration::from_secs(20),
    );

    let primary = laptop.open_agent("primary");
    let worker = worker_host.open_agent("worker");
    laptop.wait_listed(&worker);
    worker_host.wait_listed(&primary);

    // A task to the worker: across fleets, held on w1, receipts back to the laptop.
    let (task, route) = laptop.send(&worker, &primary, "task: count the lines");
    assert_eq!(route, "foreign");
    let delivered = laptop.wait_delivery(&task, "delivered");
    assert_eq!(delivered["to"], worker.as_str());
    let inbox = worker_host.held(&worker);
    assert_eq!(inbox.len(), 1, "exactly once: {inbox:?}");
    assert_eq!(inbox[0]["id"], task.as_str());
    assert_eq!(inbox[0]["body"]["text"], "task: count the lines");
    assert_eq!(inbox[0]["origin"]["host"], "laptop");
    assert_eq!(
        worker_host.held(&worker).len(),
        1,
        "offered again until acknowledged"
    );
    assert!(
        worker_host
            .cli(&["inbox", "ack", &task])
            .contains("acknowledged")
    );
    laptop.wait_delivery(&task, "acknowledged");
    assert!(worker_host.held(&worker).is_empty());

    // The reply goes back the same way and waits for the primary.
    let (reply, _) = worker_host.send(&primary, &worker, "done: 42 lines");
    let pulled = eventually(
        "the reply held on the laptop",
        Duration::from_secs(20),
        || {
            let inbox = laptop.held(&primary);
            (!inbox.is_empty()).then_some(inbox)
        },
    );
    assert_eq!(pulled[0]["id"], reply.as_str());
    assert_eq!(pulled[0]["body"]["from"], worker.as_str());
    let text = laptop.cli(&["inbox", "pull", "--agent", &primary]);
    assert!(text.contains("done: 42 lines"), "{text}");
    laptop.cli(&["inbox", "ack", &reply]);
    worker_host.wait_delivery(&reply, "acknowledged");

    // An agent nobody has: the fleet inbox exchange returns it (mandatory): "no such agent".
    let ghost = uuid::Uuid::now_v7().to_string();
    let (lost, route) = laptop.send(&ghost, &primary, "anyone?");
    assert_eq!(route, "fleet");
    let failed = laptop.wait_delivery(&lost, "failed");
    assert!(
        failed["reason"].as_str().unwrap().contains("no such agent"),
        "{failed}"
    );
    let text = laptop.cli(&["delivery", &lost]);
    assert!(text.contains("failed: no such agent"), "{text}");

    // A local agent: no broker involved, delivered at once.
    let notes = laptop.open_agent("notes");
    let (local, route) = laptop.send(&notes, &primary, "remember this");
    assert_eq!(route, "local");
    assert_eq!(laptop.delivery(&local)["state"], "delivered");
    assert_eq!(laptop.held(&notes).len(), 1);

    // Nothing of the bodies or the passwords reached the logs; the audit chains verify.
    let mut logs = String::new();
    while let Ok(line) = laptop_log.try_recv() {
        logs.push_str(&line);
    }
    while let Ok(line) = worker_log.try_recv() {
        logs.push_str(&line);
    }
    for secret in [
        p_laptop.as_str(),
        p_w1.as_str(),
        "count the lines",
        "42 lines",
        "anyone?",
    ] {
        assert!(!logs.contains(secret), "`{secret}` was logged");
    }
    for host in [&laptop, &worker_host] {
        let audit = host.state_dir().join("audit.jsonl");
        host.cli(&["audit", "verify", "--file", audit.to_str().unwrap()]);
    }
}

/// Fills `queue` in `fleet`'s vhost with `count` junk messages through `exchange` and `key`, as
/// the fleet's own user (its gateway is down, so nothing drains them).
fn fill(fleet: &str, password: &str, (exchange, key): (&str, &str), count: usize) {
    let uri = fleetd::secret::BrokerUri::parse(&secrecy::SecretString::from(format!(
        "amqp://{fleet}:{password}@127.0.0.1:5672/%2F{fleet}"
    )))
    .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let connection = fleetd::broker::connect(&uri, None).await.unwrap();
        let channel = fleetd::broker::confirm_channel(&connection).await.unwrap();
        let mut confirms = Vec::with_capacity(count);
        for _ in 0..count {
            let confirm = channel
                .basic_publish(
                    exchange.into(),
                    key.into(),
                    lapin::options::BasicPublishOptions::default(),
                    b"junk",
                    lapin::BasicProperties::default(),
                )
                .await
                .unwrap();
            confirms.push(confirm);
        }
        for confirm in confirms {
            assert!(
                matches!(confirm.await, Ok(lapin::Confirmation::Ack(_))),
                "the filler fits the inbox"
            );
        }
        let _ = connection.close(200, "filled".into()).await;
    });
}

#[test]
fn a_full_inbox_and_an_unknown_agent_in_one_confirm_window_are_each_named() {
    let (_, fleet, password, mut cleanup) = common::one_fleet("dw");
    let root = tempfile::tempdir().unwrap();
    let (sender, receiver) = (Host::new(root.path(), "s1"), Host::new(root.path(), "r1"));
    receiver.accept_mail_from(&[&fleet]);
    let (child, sender_log) = sender.start(&fleet, &password, &[], &[(&receiver, &fleet)]);
    cleanup.children.push(child);
    let (child, receiver_log) = receiver.start(&fleet, &password, &[], &[(&sender, &fleet)]);
    cleanup.children.push(child);
    let mut seen = String::new();
    for log in [&sender_log, &receiver_log] {
        wait_for(
            log,
            &mut seen,
            &["broker connected"],
            Duration::from_secs(20),
        );
    }
    let primary = sender.open_agent("primary");
    let worker = receiver.open_agent("worker");
    sender.wait_listed(&worker);
    // The worker's gateway goes; its inbox stays, and fills to its limit.
    cleanup.children[1].kill().unwrap();
    cleanup.children[1].wait().unwrap();
    let limit = usize::try_from(fleetd::broker::topology::DEFAULT_MAX_LENGTH).unwrap();
    fill(
        &fleet,
        &password,
        (
            fleetd::broker::topology::SEND_EXCHANGE,
            &fleetd::broker::topology::agent_key("r1", &worker),
        ),
        limit,
    );

    // Back to back, so the pump publishes them together: one is refused by the full inbox
    // (nack), the other finds no inbox bound (return + ack).
    let ghost = uuid::Uuid::now_v7().to_string();
    let (to_worker, _) = sender.send(&worker, &primary, "for a full inbox");
    let (to_ghost, _) = sender.send(&ghost, &primary, "for nobody");
    let full = sender.wait_delivery(&to_worker, "failed");
    let missing = sender.wait_delivery(&to_ghost, "failed");
    assert_eq!(full["reason"], "inbox full", "{full}");
    assert!(
        missing["reason"]
            .as_str()
            .unwrap()
            .starts_with("no such agent"),
        "{missing}"
    );
}

#[test]
fn a_changed_queue_type_parks_the_link_with_a_clear_reason() {
    let (_, fleet, password, mut cleanup) = common::one_fleet("qt");
    let root = tempfile::tempdir().unwrap();
    let mut host = Host::new(root.path(), "h1");
    let (child, log) = host.start(&fleet, &password, &[], &[]);
    cleanup.children.push(child);
    let mut seen = String::new();
    wait_for(
        &log,
        &mut seen,
        &["broker connected"],
        Duration::from_secs(20),
    );
    terminate(&cleanup.children[0]);
    cleanup.children[0].wait().unwrap();
    // The same fleet, now configured for quorum queues: its classic `gw.h1.ctl` is in the way.
    host.broker_lines = "queue_type = \"quorum\"\n".to_owned();
    let (child, log) = host.start(&fleet, &password, &[], &[]);
    cleanup.children[0] = child;
    wait_for(
        &log,
        &mut seen,
        &["broker link parked: queue type mismatch"],
        Duration::from_secs(20),
    );
    let status = host.cli(&["status"]);
    for part in [
        "broker: refused since",
        "another type than broker.queue_type",
        "fleetd does not retry",
        "Changing a fleet's queue type",
    ] {
        assert!(status.contains(part), "`{part}` not in: {status}");
    }
}

/// Runs `work` on a channel opened in `fleet`'s vhost as the fleet's own user.
fn as_fleet(fleet: &str, password: &str, work: impl AsyncFnOnce(&lapin::Channel)) {
    let uri = fleetd::secret::BrokerUri::parse(&secrecy::SecretString::from(format!(
        "amqp://{fleet}:{password}@127.0.0.1:5672/%2F{fleet}"
    )))
    .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let connection = fleetd::broker::connect(&uri, None).await.unwrap();
        let channel = connection.create_channel().await.unwrap();
        work(&channel).await;
        let _ = connection.close(200, "done".into()).await;
    });
}

#[test]
fn a_publishing_channel_the_broker_closes_is_reopened_and_the_link_stays_up() {
    // LavinMQ closes the publishing channel (406) on low disk. RabbitMQ closes it (404) on a
    // publish to a missing exchange: the same fault, made here with the real broker.
    let (_, fleet, password, mut cleanup) = common::one_fleet("pc");
    let root = tempfile::tempdir().unwrap();
    let host = Host::new(root.path(), "h1");
    let (child, log) = host.start(&fleet, &password, &[], &[]);
    cleanup.children.push(child);
    let mut seen = String::new();
    wait_for(
        &log,
        &mut seen,
        &["broker connected"],
        Duration::from_secs(20),
    );
    let primary = host.open_agent("primary");
    let connected = host.cli(&["status"]);
    let connected = connected
        .lines()
        .find(|l| l.contains("broker: connected to"))
        .unwrap()
        .to_owned();
    as_fleet(&fleet, &password, async |channel| {
        channel
            .exchange_delete(
                "fleet.send".into(),
                lapin::options::ExchangeDeleteOptions::default(),
            )
            .await
            .unwrap();
    });
    let ghost = uuid::Uuid::now_v7().to_string();
    let (lost, route) = host.send(&ghost, &primary, "into a missing exchange");
    assert_eq!(route, "fleet");
    wait_for(
        &log,
        &mut seen,
        &["the broker closed the publishing channel"],
        Duration::from_secs(20),
    );
    assert_eq!(
        host.delivery(&lost)["state"],
        "queued",
        "kept in the outbox"
    );
    as_fleet(&fleet, &password, async |channel| {
        let durable = lapin::options::ExchangeDeclareOptions {
            durable: true,
            ..lapin::options::ExchangeDeclareOptions::default()
        };
        channel
            .exchange_declare(
                "fleet.send".into(),
                lapin::ExchangeKind::Topic,
                durable,
                lapin::types::FieldTable::default(),
            )
            .await
            .unwrap();
    });
    wait_for(
        &log,
        &mut seen,
        &["publishing channel reopened"],
        Duration::from_secs(40),
    );
    let failed = host.wait_delivery(&lost, "failed");
    assert!(
        failed["reason"]
            .as_str()
            .unwrap()
            .starts_with("no such agent"),
        "published again on the new channel: {failed}"
    );
    let status = host.cli(&["status"]);
    assert!(
        status.contains(&connected),
        "the link stayed up (same node, same since): was `{connected}`, now {status}"
    );
    assert_eq!(
        seen.matches("broker connected").count(),
        1,
        "no reconnect: {seen}"
    );
}

#[test]
fn messages_the_store_cannot_take_go_back_to_the_broker_and_arrive_once_there_is_room() {
    let (_, fleet, password, mut cleanup) = common::one_fleet("mh");
    let root = tempfile::tempdir().unwrap();
    let (mut sender, mut receiver) = (Host::new(root.path(), "s1"), Host::new(root.path(), "r1"));
    sender.broker_lines = String::new();
    receiver.broker_lines = "max_held = 3\n".to_owned();
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
    let ids: Vec<String> = (0..5)
        .map(|i| sender.send(&worker, &primary, &format!("held #{i}")).0)
        .collect();
    for id in &ids[..3] {
        sender.wait_delivery(id, "delivered");
    }
    // The fourth is refused for now, handed back, redelivered, refused again: it comes back on
    // the same connection, so it is not stuck unacknowledged.
    let mut log = String::new();
    let fourth = &ids[3];
    eventually(
        "the fourth message handed back and redelivered at least twice",
        Duration::from_secs(20),
        || {
            while let Ok(line) = receiver_log.try_recv() {
                log.push_str(&line);
                log.push('\n');
            }
            let refusals = log
                .lines()
                .filter(|l| {
                    l.contains("leaving the message for redelivery") && l.contains(fourth.as_str())
                })
                .count();
            (refusals >= 2).then_some(())
        },
    );
    assert!(
        !log.contains("broker unreachable"),
        "on the same connection: {log}"
    );
    assert_eq!(sender.delivery(&ids[4])["state"], "queued");
    // Room again: the worker takes its three; the other two arrive, in order, once.
    let mut texts: Vec<String> = Vec::new();
    eventually("all five held and taken", Duration::from_secs(30), || {
        texts.extend(receiver.drain(&worker));
        (texts.len() >= 5).then_some(())
    });
    let expected: Vec<String> = (0..5).map(|i| format!("held #{i}")).collect();
    assert_eq!(texts, expected, "each once, in order");
    for id in &ids {
        sender.wait_delivery(id, "acknowledged");
    }
}
