//! sd_notify and the watchdog, without systemd as PID 1: the test plays the service manager.
//! It owns the notify socket, sets `WATCHDOG_USEC` as systemd does, sees `READY=1` with a
//! `STATUS=` once the local API serves, `WATCHDOG=1` pings from the main loop, and, when the
//! process is frozen (SIGSTOP: its main loop stops turning), the pings stop; it then does what
//! systemd's `WatchdogSec=` + `Restart=on-failure` do — SIGABRT (no core file is left) and a
//! restart, which comes up ready again. SIGTERM brings `STOPPING=1` and a clean exit.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code: a failed step is a failed test"
)]

mod common;

use std::os::unix::net::UnixDatagram;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::BIN;

/// The watchdog timeout the "service manager" sets: pings every 300 ms.
const WATCHDOG_USEC: &str = "600000";

fn start(dir: &Path, socket: &Path) -> Child {
    Command::new(BIN)
        .args(["--config", dir.join("fleetd.toml").to_str().unwrap(), "run"])
        .current_dir(dir.join("cwd"))
        .env("HOME", dir)
        .env("NOTIFY_SOCKET", socket)
        .env("WATCHDOG_USEC", WATCHDOG_USEC)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Datagrams received within `within`, until one contains `until` (if given).
fn receive(socket: &UnixDatagram, within: Duration, until: Option<&str>) -> Vec<String> {
    let start = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while start.elapsed() < within {
        socket
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        if let Ok(n) = socket.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            let done = until.is_some_and(|u| text.contains(u));
            got.push(text);
            if done {
                break;
            }
        }
    }
    got
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name}");
}

#[test]
fn ready_watchdog_restart_and_stopping() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    common::solo_config(dir, "notified", "");
    std::fs::create_dir_all(dir.join("cwd")).unwrap();
    let path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();

    let mut child = start(dir, &path);
    let first = receive(&socket, Duration::from_secs(20), Some("READY=1"));
    let ready = first.last().cloned().unwrap_or_default();
    assert!(
        ready.contains("READY=1"),
        "no READY=1 within 20 s: {first:?}"
    );
    assert!(
        ready.contains("STATUS=broker: not configured; roster: 1 hosts; sandbox: full"),
        "{ready}"
    );
    assert!(
        ready.contains(&format!("MAINPID={}", child.id())),
        "{ready}"
    );
    // READY=1 means the local API serves.
    let (ok, stdout, stderr) = common::fleetd_at(&dir.join("fleetd.toml"), dir, &["status"]);
    assert!(ok, "status right after READY=1: {stdout}{stderr}");

    let pings = receive(&socket, Duration::from_secs(2), None);
    let count = pings.iter().filter(|p| p.contains("WATCHDOG=1")).count();
    assert!(
        count >= 3,
        "expected a ping every 300 ms, got {count} in 2 s: {pings:?}"
    );

    // A main loop that no longer turns: no ping for well over the watchdog timeout.
    signal(&child, "STOP");
    let _ = receive(&socket, Duration::from_millis(100), None); // one may be in flight
    let silent = receive(&socket, Duration::from_millis(1500), None);
    assert!(
        !silent.iter().any(|p| p.contains("WATCHDOG=1")),
        "a frozen process kept pinging: {silent:?}"
    );
    // What systemd does on a missed watchdog: SIGABRT, then restart (Restart=on-failure).
    signal(&child, "ABRT");
    signal(&child, "CONT");
    let status = child.wait().unwrap();
    assert_eq!(status.signal(), Some(6), "killed by SIGABRT: {status:?}");
    assert!(!status.core_dumped(), "a core was dumped");
    let cores: Vec<_> = std::fs::read_dir(dir.join("cwd"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name())
        .collect();
    assert!(
        cores.is_empty(),
        "files left in the working directory: {cores:?}"
    );

    let mut child = start(dir, &path);
    let again = receive(&socket, Duration::from_secs(20), Some("READY=1"));
    assert!(
        again.iter().any(|m| m.contains("READY=1")),
        "the restarted daemon never became ready: {again:?}"
    );
    signal(&child, "TERM");
    let last = receive(&socket, Duration::from_secs(10), Some("STOPPING=1"));
    assert!(last.iter().any(|m| m.contains("STOPPING=1")), "{last:?}");
    assert!(child.wait().unwrap().success());
}
