//! A running daemon takes messages in from another fleet through the real RabbitMQ: its control
//! queue is bound to the admitted fleet's ingress exchange, a genuine signed message is taken in
//! once, and a message signed by an unpinned host is refused and dropped — all in its logs.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code fails loudly"
)]

mod common;

use std::process::Command;
use std::sync::{Arc, mpsc};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{BIN, Fleets, eventually, grants, nonce, spawn_logged};

use common::publish::{Publisher, SendOutcome};
use fleetd::broker::connect;
use fleetd::broker::topology::ingress_exchange;
use fleetd::secret::BrokerUri;
use fleetd::state::{Limits, StateStore};
use fleetd::wire::{self, AgentMessage, HostKey, Kind, Meta, Party, Payload};
use secrecy::SecretString;
use uuid::Uuid;

fn key_init(path: &std::path::Path) {
    let init = Command::new(BIN)
        .args(["key", "init", "--credential-file", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        init.status.success(),
        "key init: {}",
        String::from_utf8_lossy(&init.stderr)
    );
}

fn message(fleet: &str, host: &str, dest: &str, to: Uuid) -> (Meta, Payload) {
    let now = i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let meta = Meta {
        version: wire::VERSION,
        id: Uuid::now_v7(),
        kind: Kind::AgentMessage,
        origin: Party {
            fleet: fleet.to_owned(),
            host: host.to_owned(),
        },
        dest: Party {
            fleet: dest.to_owned(),
            host: "hostb".to_owned(),
        },
        key_id: String::new(),
        created_ms: now,
        expires_ms: now + 60_000,
    };
    (
        meta,
        Payload::AgentMessage(AgentMessage {
            v: wire::VERSION,
            to,
            from: None,
            text: "hello".to_owned(),
        }),
    )
}

fn wait_for(lines: &mpsc::Receiver<String>, seen: &mut String, needle: &str) {
    common::wait_for(lines, seen, &[needle], Duration::from_secs(20));
}

#[tokio::test]
async fn a_daemon_takes_in_genuine_messages_and_refuses_unpinned_ones() {
    let nonce = nonce();
    let (a, b) = (format!("di-a{nonce}"), format!("di-b{nonce}"));
    let mut cleanup = Fleets::new(&[&a, &b]);
    let (pa, pb) = (format!("PwA{nonce}x"), format!("PwB{nonce}x"));
    grants(&a, &[&b], &pa);
    grants(&b, &[&a], &pb);
    grants(&a, &[&b], &pa);

    let (key_a, _) = HostKey::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("credentials");
    std::fs::create_dir(&credentials).unwrap();
    key_init(&credentials.join("host-key"));
    let config = dir.path().join("fleetd.toml");
    std::fs::write(
        &config,
        format!(
            "host = \"hostb\"\nfleet = \"{b}\"\n[broker]\nuriEnv = \"FLEETD_B_URI\"\nadmit = [\"{a}\"]\n[log]\nformat = \"json\"\n\
             [[peer]]\nfleet = \"{a}\"\nhost = \"hosta\"\npubkey = \"{}\"\n",
            key_a.public()
        ),
    )
    .unwrap();
    // hostb's mailboxes take messages from fleet a (its message policy).
    let policy = dir.path().join(".config/fleetd/policy");
    std::fs::create_dir_all(&policy).unwrap();
    std::fs::write(
        policy.join("50-mailboxes.toml"),
        format!(
            "[[message]]\nid = \"a-to-mailboxes\"\nfleets = [\"{a}\"]\nprofiles = [\"mailbox\"]\n"
        ),
    )
    .unwrap();
    let mut command = Command::new(BIN);
    command
        .args(["--config", config.to_str().unwrap(), "run"])
        .env("CREDENTIALS_DIRECTORY", &credentials)
        .env("HOME", dir.path())
        .env("XDG_STATE_HOME", dir.path().join("state"))
        .env("XDG_RUNTIME_DIR", dir.path().join("run"))
        .env(
            "FLEETD_B_URI",
            format!("amqp://{b}:{pb}@127.0.0.1:5672/%2F{b}"),
        );
    let (child, lines) = spawn_logged(command);
    cleanup.children.push(child);
    let mut seen = String::new();
    wait_for(&lines, &mut seen, "broker connected");

    let uri = BrokerUri::parse(&SecretString::from(format!(
        "amqp://{a}:{pa}@127.0.0.1:5672/%2F{a}"
    )))
    .unwrap();
    let connection = connect(&uri, Some(&format!("/{b}"))).await.unwrap();
    let state = Arc::new(StateStore::open(&dir.path().join("sender"), Limits::default()).unwrap());
    let publisher = Publisher::open(&connection, &format!("/{b}"), &a, state)
        .await
        .unwrap();
    let ingress = ingress_exchange(&a);
    let cli = |args: &[&str]| {
        let (ok, stdout, stderr) = common::fleetd_at(&config, dir.path(), args);
        assert!(ok, "fleetd {args:?}: {stderr}");
        stdout
    };
    let primary = Uuid::parse_str(cli(&["agent", "open", "primary"]).trim()).unwrap();
    assert_eq!(
        cli(&["agent", "open", "primary"]).trim(),
        primary.to_string(),
        "an agent name keeps its global id"
    );

    let (meta, payload) = message(&a, "hosta", &b, primary);
    let genuine = wire::seal(meta, &payload, &key_a);
    assert_eq!(
        publisher
            .send(&ingress, "ctl.hostb", &genuine)
            .await
            .unwrap(),
        SendOutcome::Queued
    );
    wait_for(
        &lines,
        &mut seen,
        &format!("\"msg.id\":\"{}\"", genuine.meta.id),
    );
    assert!(seen.contains("message taken in"), "{seen}");

    let inbox = |args: &[&str]| {
        let mut full = vec!["inbox"];
        full.extend_from_slice(args);
        cli(&full)
    };
    let id = genuine.meta.id.to_string();
    assert!(
        inbox(&["pull", "--json"]).contains(&id),
        "the message is held for the primary"
    );
    assert!(
        inbox(&["pull"]).contains(&id),
        "and offered again until acknowledged"
    );
    assert!(inbox(&["ack", &id]).contains("acknowledged"));
    assert!(
        !inbox(&["pull", "--json"]).contains(&id),
        "acknowledged messages are not offered again"
    );

    let (meta, payload) = message(&a, "intruder", &b, primary);
    publisher
        .send(&ingress, "ctl.hostb", &wire::seal(meta, &payload, &key_a))
        .await
        .unwrap();
    wait_for(&lines, &mut seen, "message refused and dropped");
    assert!(
        seen.contains("no key is pinned for host `intruder`"),
        "{seen}"
    );
    // A replay of the genuine envelope (same id) and an expired one: dropped, each on record.
    publisher
        .send(&ingress, "ctl.hostb", &genuine)
        .await
        .unwrap();
    let (mut meta, payload) = message(&a, "hosta", &b, primary);
    // Created within the allowed skew, but its life is over.
    meta.expires_ms = meta.created_ms - 1_000;
    meta.created_ms -= 60_000;
    let expired = wire::seal(meta, &payload, &key_a);
    publisher
        .send(&ingress, "ctl.hostb", &expired)
        .await
        .unwrap();
    wait_for(&lines, &mut seen, "the envelope has expired");
    assert!(!seen.contains("hello"), "message bodies are never logged");
    assert!(
        !seen.contains("Server returned us a message"),
        "lapin's return warning (it carries the body) is held back"
    );
    let audit_file = dir.path().join("state/fleetd/audit.jsonl");
    // The log line comes first; the audit record follows in the same intake round.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let audit = loop {
        let audit = std::fs::read_to_string(&audit_file).unwrap();
        if (audit.contains("message.duplicate") && audit.contains("expired"))
            || std::time::Instant::now() > deadline
        {
            break audit;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        audit.contains("\"event\":\"message.accepted\"") && audit.contains(&id),
        "{audit}"
    );
    assert!(
        audit.contains("\"event\":\"message.refused\"") && audit.contains("intruder"),
        "{audit}"
    );
    assert!(
        audit.contains("\"event\":\"message.duplicate\""),
        "the replay is on record: {audit}"
    );
    assert!(
        audit.contains(&expired.meta.id.to_string()) && audit.contains("expired"),
        "the expired envelope is on record: {audit}"
    );
    assert!(
        !cli(&["inbox", "pull", "--json"]).contains(&expired.meta.id.to_string()),
        "nothing refused is delivered"
    );
    // A 100 KB, escape-laden origin host, before any signature check: one short line and one
    // short audit record, the value in neither.
    let hostile = format!("{}\u{1b}[2J\nINFO fleetd: all good", "h".repeat(100_000));
    let (meta, payload) = message(&a, &hostile, &b, primary);
    publisher
        .send(&ingress, "ctl.hostb", &wire::seal(meta, &payload, &key_a))
        .await
        .unwrap();
    let before = seen.len();
    wait_for(&lines, &mut seen, "fleetd-origin-host");
    let logged = &seen[before..];
    assert!(
        logged.lines().all(|l| l.len() < 2_000) && !logged.contains("all good"),
        "bounded, the value nowhere: {} bytes",
        logged.len()
    );
    let record = eventually("the audit record", Duration::from_secs(10), || {
        std::fs::read_to_string(&audit_file)
            .unwrap()
            .lines()
            .rfind(|l| l.contains("fleetd-origin-host"))
            .map(str::to_owned)
    });
    assert!(
        record.len() < 2_000
            && !record.contains("hhhhhhhhhhhhhhhh")
            && !record.contains("all good"),
        "{} bytes",
        record.len()
    );
    let verify = Command::new(BIN)
        .args(["audit", "verify", "--file", audit_file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    assert!(String::from_utf8_lossy(&verify.stdout).contains("chain intact"));
    assert!(!seen.contains(&pb), "the broker password reached the log");
}
