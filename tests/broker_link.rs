//! The broker link against the real RabbitMQ: started while the broker is down, the daemon stays
//! up and serves (degraded) — local routing works and messages for elsewhere wait in the outbox —
//! then connects within its backoff cap once the broker starts, declares its topology (the
//! control queue with single active consumer, reject-publish) and publishes what waited.

#![allow(clippy::unwrap_used, clippy::panic, reason = "test code fails loudly")]

mod common;

use std::process::Command;
use std::time::Duration;

use common::{BIN, Fleets, grants, nonce, spawn_logged, terminate, wait_for};

fn ctl(args: &[&str]) -> String {
    let output = Command::new("rabbitmqctl").args(args).output().unwrap();
    assert!(
        output.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn a_daemon_started_while_the_broker_is_down_connects_when_it_comes_back() {
    let nonce = nonce();
    let fleet = format!("lk{nonce}");
    let password = format!("PwL{nonce}x");
    let mut cleanup = Fleets::new(&[&fleet]);
    grants(&fleet, &[], &password);

    let dir = tempfile::tempdir().unwrap();
    let credentials = dir.path().join("credentials");
    std::fs::create_dir(&credentials).unwrap();
    let key = Command::new(BIN)
        .args([
            "key",
            "init",
            "--credential-file",
            credentials.join("host-key").to_str().unwrap(),
        ])
        .env("HOME", dir.path())
        .env("XDG_CONFIG_HOME", dir.path().join("config"))
        .output()
        .unwrap();
    assert!(
        key.status.success(),
        "key init: {}",
        String::from_utf8_lossy(&key.stderr)
    );
    let config = dir.path().join("fleetd.toml");
    std::fs::write(
        &config,
        format!("host = \"h{nonce}\"\nfleet = \"{fleet}\"\n[broker]\nuriEnv = \"FLEETD_LINK_URI\"\nbackoff_cap_secs = 2\n[log]\nformat = \"json\"\n"),
    )
    .unwrap();
    let _broker_up = common::BrokerUp;
    common::rabbitmqctl("stop_app");
    let mut command = Command::new(BIN);
    command
        .args(["--config", config.to_str().unwrap(), "run"])
        .env("CREDENTIALS_DIRECTORY", &credentials)
        .env("HOME", dir.path())
        .env("XDG_CONFIG_HOME", dir.path().join("config"))
        .env("XDG_STATE_HOME", dir.path().join("state"))
        .env("XDG_RUNTIME_DIR", dir.path().join("run"))
        .env(
            "FLEETD_LINK_URI",
            format!("amqp://{fleet}:{password}@127.0.0.1:5672/%2F{fleet}"),
        );
    let (child, lines) = spawn_logged(command);
    cleanup.children.push(child);
    let mut seen = String::new();
    wait_for(
        &lines,
        &mut seen,
        &["fleetd ready"],
        Duration::from_secs(20),
    );
    // The link's first attempt runs beside the start-up: its warning may come before `ready`.
    if !seen.contains("broker unreachable") {
        wait_for(
            &lines,
            &mut seen,
            &["broker unreachable"],
            Duration::from_secs(20),
        );
    }
    assert!(
        cleanup.children[0].try_wait().unwrap().is_none(),
        "the daemon stays up without a broker"
    );
    let cli = |args: &[&str]| {
        let (ok, stdout, stderr) = common::fleetd_at(&config, dir.path(), args);
        assert!(ok, "fleetd {args:?}: {stderr}");
        stdout
    };
    assert!(cli(&["status"]).contains("broker: unreachable since"));
    // Local routing works without the broker; a message for elsewhere waits in the outbox.
    let primary = cli(&["agent", "open", "primary"]).trim().to_owned();
    let notes = cli(&["agent", "open", "notes"]).trim().to_owned();
    let local = cli(&["send", &notes, "kept locally", "--from", &primary]);
    assert!(local.contains("route: local"), "{local}");
    let local_id = local.split_whitespace().next().unwrap().to_owned();
    assert_eq!(cli(&["delivery", &local_id]).trim(), "delivered");
    assert!(cli(&["inbox", "pull", "--agent", &notes]).contains("kept locally"));
    let ghost = uuid::Uuid::now_v7().to_string();
    let waiting = cli(&["send", &ghost, "for later"]);
    let waiting_id = waiting.split_whitespace().next().unwrap().to_owned();
    assert!(
        cli(&["delivery", &waiting_id]).contains("in the outbox, waiting for the broker"),
        "a message sent during the outage is kept"
    );

    common::start_broker();
    let connected = wait_for(
        &lines,
        &mut seen,
        &["broker connected"],
        Duration::from_secs(30),
    );
    assert!(
        connected < Duration::from_secs(10),
        "connected {connected:?} after the broker was up (cap 2 s)"
    );

    // The outbox is published once connected: nobody has that agent, the broker says so.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let state = cli(&["delivery", &waiting_id]);
        if state.contains("failed: no such agent") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still: {state}");
        std::thread::sleep(Duration::from_millis(200));
    }

    let status = Command::new(BIN)
        .args(["--config", config.to_str().unwrap(), "status"])
        .env("HOME", dir.path())
        .env("XDG_RUNTIME_DIR", dir.path().join("run"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&status.stdout)
            .contains("broker: connected to 127.0.0.1:5672 since"),
        "{status:?}"
    );
    let queues = ctl(&[
        "-q",
        "list_queues",
        "-p",
        &format!("/{fleet}"),
        "name",
        "arguments",
    ]);
    let control = queues
        .lines()
        .find(|l| l.starts_with(&format!("gw.h{nonce}.ctl")))
        .unwrap_or_else(|| panic!("no control queue in {queues}"));
    assert!(
        control.contains("x-single-active-consumer") && control.contains("reject-publish"),
        "{control}"
    );

    terminate(&cleanup.children[0]);
    assert!(cleanup.children[0].wait().unwrap().success());
    assert!(
        !seen.contains(&password),
        "the broker password reached the log"
    );
}

/// A broker that accepts the TCP connection and then says nothing (booting, stopping, a proxy in
/// front of a dead node): lapin's own `connection_timeout` covers only the TCP connect, so
/// without fleetd's bound the attempt — and the link loop awaiting it — would wait forever.
#[test]
fn a_broker_that_accepts_and_never_answers_the_handshake_is_reported_unreachable() {
    use fleetd::broker::{ConnectError, connect};
    use fleetd::secret::BrokerUri;
    use secrecy::SecretString;

    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        // Accept and hold the socket open without writing a byte.
        let (socket, _) = silent.accept().unwrap();
        std::thread::sleep(Duration::from_secs(30));
        drop(socket);
    });
    let uri = BrokerUri::parse(&SecretString::from(format!(
        "amqp://u:silent-pw@127.0.0.1:{port}/v"
    )))
    .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let outcome = runtime.block_on(async {
        tokio::time::timeout(Duration::from_secs(25), connect(&uri, None)).await
    });
    let error = match outcome {
        Err(_) => panic!("connect() did not return within 25 s: the handshake is unbounded"),
        Ok(Ok(_)) => panic!("a silent listener cannot complete an AMQP handshake"),
        Ok(Err(error)) => error,
    };
    assert!(
        matches!(&error, ConnectError::Unreachable { reason, .. } if reason.contains("handshake")),
        "{error:?}"
    );
    assert!(!format!("{error:?}").contains("silent-pw"), "{error:?}");
    drop(held);
}
