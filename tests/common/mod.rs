//! Helpers shared by the tests that talk to the machine's RabbitMQ and run daemons: broker
//! grants, clean-up of test fleets, and reading a daemon's log lines.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::panic,
    reason = "shared test helpers; each includer uses part"
)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub const BIN: &str = env!("CARGO_BIN_EXE_fleetd");

/// A number unique to this run, for vhost and user names.
pub fn nonce() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        % 1_000_000_000
}

/// Applies `fleetd broker grants --apply` for `fleet`, admitting `admits`, with `password` on stdin.
pub fn grants(fleet: &str, admits: &[&str], password: &str) {
    let mut args = vec!["broker", "grants", "--fleet", fleet, "--apply"];
    for origin in admits {
        args.extend_from_slice(&["--admit", origin]);
    }
    let mut child = Command::new(BIN)
        .args(&args)
        .env("FLEETD_ADMIN_URI", "amqp://guest:guest@127.0.0.1:5672/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{password}\n").as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "grants for {fleet} (is RabbitMQ running and rabbitmqctl usable? scripts/test starts it): {text}"
    );
    assert!(
        !text.contains(password),
        "the password leaked into the grants output: {text}"
    );
}

/// Removes test fleets' vhosts and users and kills their daemons, even when a test fails.
pub struct Fleets {
    pub names: Vec<String>,
    pub children: Vec<Child>,
}

impl Fleets {
    pub fn new(names: &[&str]) -> Fleets {
        Fleets {
            names: names.iter().map(|n| (*n).to_owned()).collect(),
            children: Vec::new(),
        }
    }
}

impl Drop for Fleets {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for fleet in &self.names {
            let _ = Command::new("rabbitmqctl")
                .args(["-q", "delete_vhost", &format!("/{fleet}")])
                .output();
            let _ = Command::new("rabbitmqctl")
                .args(["-q", "delete_user", fleet])
                .output();
        }
    }
}

/// Spawns `command` with stderr piped to a channel of lines.
pub fn spawn_logged(mut command: Command) -> (Child, mpsc::Receiver<String>) {
    let mut child = command
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
    (child, lines)
}

/// Waits for a line containing every needle; returns how long it took. Lines before it are
/// appended to `seen` (for the failure message and later checks).
pub fn wait_for(
    lines: &mpsc::Receiver<String>,
    seen: &mut String,
    needles: &[&str],
    within: Duration,
) -> Duration {
    let start = Instant::now();
    while start.elapsed() < within {
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(100)) {
            seen.push_str(&line);
            seen.push('\n');
            if needles.iter().all(|n| line.contains(n)) {
                return start.elapsed();
            }
        }
    }
    panic!("no line with {needles:?} within {within:?}; logged:\n{seen}");
}

/// Sends SIGTERM to `child`.
pub fn terminate(child: &Child) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
}
