//! The broker link against the real RabbitMQ: started while the broker is down, the daemon stays
//! up and serves (degraded), then connects within its backoff cap once the broker starts, and
//! declares its topology (the control queue with single active consumer, reject-publish).

#![allow(clippy::unwrap_used, clippy::panic, reason = "test code fails loudly")]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const BIN: &str = env!("CARGO_BIN_EXE_fleetd");

/// Restarts the broker app and removes the test fleet, even when the test fails.
struct Cleanup {
    fleet: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = Command::new("rabbitmqctl")
            .args(["-q", "start_app"])
            .output();
        let _ = Command::new("rabbitmqctl")
            .args(["-q", "await_startup"])
            .output();
        let _ = Command::new("rabbitmqctl")
            .args(["-q", "delete_vhost", &format!("/{}", self.fleet)])
            .output();
        let _ = Command::new("rabbitmqctl")
            .args(["-q", "delete_user", &self.fleet])
            .output();
    }
}

fn ctl(args: &[&str]) -> String {
    let output = Command::new("rabbitmqctl").args(args).output().unwrap();
    assert!(
        output.status.success(),
        "rabbitmqctl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn wait_for(
    lines: &mpsc::Receiver<String>,
    seen: &mut String,
    needle: &str,
    within: Duration,
    child: &mut Child,
) {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(200)) {
            seen.push_str(&line);
            seen.push('\n');
            if line.contains(needle) {
                return;
            }
        }
    }
    let _ = child.kill();
    panic!("no `{needle}` within {within:?}; the daemon logged:\n{seen}");
}

#[test]
fn a_daemon_started_while_the_broker_is_down_connects_when_it_comes_back() {
    let nonce = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        % 1_000_000_000;
    let fleet = format!("lk{nonce}");
    let password = format!("PwL{nonce}x");
    let _cleanup = Cleanup {
        fleet: fleet.clone(),
    };
    let mut grants = Command::new(BIN)
        .args(["broker", "grants", "--fleet", &fleet, "--apply"])
        .env("FLEETD_ADMIN_URI", "amqp://guest:guest@127.0.0.1:5672/")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    grants
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{password}\n").as_bytes())
        .unwrap();
    assert!(
        grants.wait().unwrap().success(),
        "grants (is RabbitMQ running? scripts/test starts it)"
    );

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
    ctl(&["-q", "stop_app"]);
    let mut child = Command::new(BIN)
        .args(["--config", config.to_str().unwrap(), "run"])
        .env("CREDENTIALS_DIRECTORY", &credentials)
        .env("HOME", dir.path())
        .env("XDG_CONFIG_HOME", dir.path().join("config"))
        .env("XDG_STATE_HOME", dir.path().join("state"))
        .env("XDG_RUNTIME_DIR", dir.path().join("run"))
        .env(
            "FLEETD_LINK_URI",
            format!("amqp://{fleet}:{password}@127.0.0.1:5672/%2F{fleet}"),
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
    let mut seen = String::new();
    wait_for(
        &lines,
        &mut seen,
        "fleetd ready",
        Duration::from_secs(20),
        &mut child,
    );
    wait_for(
        &lines,
        &mut seen,
        "broker unreachable",
        Duration::from_secs(20),
        &mut child,
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "the daemon stays up without a broker"
    );

    ctl(&["-q", "start_app"]);
    ctl(&["-q", "await_startup"]);
    let started = Instant::now();
    wait_for(
        &lines,
        &mut seen,
        "broker connected",
        Duration::from_secs(30),
        &mut child,
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "connected {:?} after the broker was up (cap 2 s)",
        started.elapsed()
    );

    let status = Command::new(BIN)
        .args(["--config", config.to_str().unwrap(), "status"])
        .env("HOME", dir.path())
        .env("XDG_RUNTIME_DIR", dir.path().join("run"))
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&status.stdout).contains("broker: connected since"),
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

    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    assert!(child.wait().unwrap().success());
    assert!(
        !seen.contains(&password),
        "the broker password reached the log"
    );
}
