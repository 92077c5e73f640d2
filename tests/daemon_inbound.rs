//! A running daemon takes messages in from another fleet through the real RabbitMQ: its control
//! queue is bound to the admitted fleet's ingress exchange, a genuine signed message is taken in
//! once, and a message signed by an unpinned host is refused and dropped — all in its logs.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code fails loudly"
)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fleetd::broker::connect;
use fleetd::broker::publish::{Publisher, SendOutcome};
use fleetd::broker::topology::ingress_exchange;
use fleetd::secret::BrokerUri;
use fleetd::state::{Limits, StateStore};
use fleetd::wire::{self, AgentMessage, HostKey, Kind, Meta, Party, Payload};
use secrecy::SecretString;
use uuid::Uuid;

const BIN: &str = env!("CARGO_BIN_EXE_fleetd");

struct Cleanup(Vec<String>, Option<Child>);

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(child) = &mut self.1 {
            let _ = child.kill();
        }
        for fleet in &self.0 {
            let _ = Command::new("rabbitmqctl")
                .args(["-q", "delete_vhost", &format!("/{fleet}")])
                .output();
            let _ = Command::new("rabbitmqctl")
                .args(["-q", "delete_user", fleet])
                .output();
        }
    }
}

fn fleetd(args: &[&str], input: Option<&str>) -> std::process::Output {
    let mut child = Command::new(BIN)
        .args(args)
        .env("FLEETD_ADMIN_URI", "amqp://guest:guest@127.0.0.1:5672/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(input) = input {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    drop(child.stdin.take());
    child.wait_with_output().unwrap()
}

fn message(fleet: &str, host: &str, dest: &str) -> (Meta, Payload) {
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
            to: Uuid::now_v7(),
            from: None,
            text: "hello".to_owned(),
        }),
    )
}

fn wait_for(lines: &mpsc::Receiver<String>, seen: &mut String, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(200)) {
            seen.push_str(&line);
            seen.push('\n');
            if line.contains(needle) {
                return;
            }
        }
    }
    panic!("no `{needle}` within 20 s; the daemon logged:\n{seen}");
}

#[tokio::test]
async fn a_daemon_takes_in_genuine_messages_and_refuses_unpinned_ones() {
    let nonce = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        % 1_000_000_000;
    let (a, b) = (format!("di-a{nonce}"), format!("di-b{nonce}"));
    let mut cleanup = Cleanup(vec![a.clone(), b.clone()], None);
    let (pa, pb) = (format!("PwA{nonce}x"), format!("PwB{nonce}x"));
    for (fleet, admit, password) in [(&a, &b, &pa), (&b, &a, &pb), (&a, &b, &pa)] {
        let out = fleetd(
            &[
                "broker", "grants", "--fleet", fleet, "--admit", admit, "--apply",
            ],
            Some(&format!("{password}\n")),
        );
        assert!(
            out.status.success(),
            "grants (is RabbitMQ running? scripts/test starts it): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    let (key_a, _) = HostKey::generate().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("credentials");
    std::fs::create_dir(&credentials).unwrap();
    let init = fleetd(
        &[
            "key",
            "init",
            "--credential-file",
            credentials.join("host-key").to_str().unwrap(),
        ],
        None,
    );
    assert!(init.status.success());
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
    let mut child = Command::new(BIN)
        .args(["--config", config.to_str().unwrap(), "run"])
        .env("CREDENTIALS_DIRECTORY", &credentials)
        .env("HOME", dir.path())
        .env("XDG_STATE_HOME", dir.path().join("state"))
        .env("XDG_RUNTIME_DIR", dir.path().join("run"))
        .env(
            "FLEETD_B_URI",
            format!("amqp://{b}:{pb}@127.0.0.1:5672/%2F{b}"),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (send, lines) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if send.send(line).is_err() {
                break;
            }
        }
    });
    cleanup.1 = Some(child);
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

    let (meta, payload) = message(&a, "hosta", &b);
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
        let mut full = vec!["--config", config.to_str().unwrap(), "inbox"];
        full.extend_from_slice(args);
        let out = Command::new(BIN)
            .args(&full)
            .env("HOME", dir.path())
            .env("XDG_RUNTIME_DIR", dir.path().join("run"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
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

    let (meta, payload) = message(&a, "intruder", &b);
    publisher
        .send(&ingress, "ctl.hostb", &wire::seal(meta, &payload, &key_a))
        .await
        .unwrap();
    wait_for(&lines, &mut seen, "message refused and dropped");
    assert!(
        seen.contains("no key is pinned for host `intruder`"),
        "{seen}"
    );
    assert!(!seen.contains("hello"), "message bodies are never logged");
    let audit_file = dir.path().join("state/fleetd/audit.jsonl");
    let audit = std::fs::read_to_string(&audit_file).unwrap();
    assert!(
        audit.contains("\"event\":\"message.accepted\"") && audit.contains(&id),
        "{audit}"
    );
    assert!(
        audit.contains("\"event\":\"message.refused\"") && audit.contains("intruder"),
        "{audit}"
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
