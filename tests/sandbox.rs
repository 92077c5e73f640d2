//! The Landlock self-sandbox on this machine's kernel (ABI 7): `fleetd sandbox probe` applies
//! exactly the plan `fleetd run` applies and proves a forbidden read, write, connect and exec
//! fail while the daemon's own accesses work; the running daemon reports the level it reached.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code: a failed step is a failed test"
)]

mod common;

use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{BIN, Host};

/// Writes a broker host's config (`sandbox = "required"`, `extra` at the top) and returns it.
fn config(host: &Host, extra: &str) -> std::path::PathBuf {
    let dir = &host.dir;
    std::fs::create_dir_all(dir.join("policy")).unwrap();
    let path = dir.join("fleetd.toml");
    std::fs::write(
        &path,
        format!(
            "sandbox = \"required\"\n{extra}host = \"{}\"\nfleet = \"probe\"\n[broker]\nuriEnv = \"FLEETD_T_URI\"\n\
             [paths]\npolicy = \"{}\"\nstate = \"{}\"\nruntime = \"{}\"\n",
            host.name,
            dir.join("policy").display(),
            dir.join("state").display(),
            dir.join("run").display(),
        ),
    )
    .unwrap();
    path
}

/// Runs `fleetd sandbox probe ARGS` for `host` with its broker URI naming `nodes`
/// (`HOST:PORT,…`); its lines.
fn probe(host: &Host, config: &Path, nodes: &str, args: &[String]) -> Vec<String> {
    let output = Command::new(BIN)
        .args(["--config", config.to_str().unwrap(), "sandbox", "probe"])
        .args(args)
        .env("CREDENTIALS_DIRECTORY", host.dir.join("credentials"))
        .env("HOME", &host.dir)
        .env(
            "FLEETD_T_URI",
            format!("amqp://probe:canary-pw-7f3a@{nodes}/%2Fprobe"),
        )
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "fleetd sandbox probe failed (does this kernel have Landlock ABI >= 6?): {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // First, what agents get on this host (bubblewrap installed, user namespaces on: the test
    // command installs it); then fleetd's own sandbox and each access.
    let mut lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
    assert!(
        lines
            .first()
            .is_some_and(|l| l.starts_with("agents: sandboxed by /usr/bin/bwrap")),
        "{stdout}"
    );
    lines.remove(0);
    lines
}

fn arg(flag: &str, value: impl std::fmt::Display) -> [String; 2] {
    [format!("--{flag}"), value.to_string()]
}

#[test]
fn forbidden_reads_writes_connects_and_execs_fail_under_the_sandbox() {
    let root = tempfile::tempdir().unwrap();
    let host = Host::new(root.path(), "probe");
    // Two broker nodes in the URI: both may be connected to, nothing else.
    let broker = TcpListener::bind("127.0.0.1:0").unwrap();
    let second = TcpListener::bind("127.0.0.1:0").unwrap();
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let broker_port = broker.local_addr().unwrap().port();
    let second_port = second.local_addr().unwrap().port();
    let nodes = format!(
        "{},{}",
        broker.local_addr().unwrap(),
        second.local_addr().unwrap()
    );
    let config = config(&host, "");
    let outside = root.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret.txt"), "not for fleetd").unwrap();
    let state = host.dir.join("state");
    let cases: Vec<(&str, String, &str)> = vec![
        ("read", config.display().to_string(), "allowed"),
        (
            "read",
            host.dir.join("policy").display().to_string(),
            "allowed",
        ),
        (
            "read",
            host.dir.join("credentials/host-key").display().to_string(),
            "allowed",
        ),
        (
            "read",
            outside.join("secret.txt").display().to_string(),
            "refused",
        ),
        ("read", "/etc/hostname".to_owned(), "refused"),
        (
            "write",
            state.join("probe-file").display().to_string(),
            "allowed",
        ),
        (
            "write",
            host.dir.join("policy/planted.toml").display().to_string(),
            "refused",
        ),
        (
            "write",
            outside.join("new.txt").display().to_string(),
            "refused",
        ),
        (
            "connect",
            broker.local_addr().unwrap().to_string(),
            "allowed",
        ),
        (
            "connect",
            second.local_addr().unwrap().to_string(),
            "allowed",
        ),
        (
            "connect",
            other.local_addr().unwrap().to_string(),
            "refused",
        ),
        // fleetd speaks tmux's client protocol itself: not even the `tmux` binary runs.
        ("exec", "/usr/bin/tmux".to_owned(), "refused"),
        ("exec", "/bin/sh".to_owned(), "refused"),
    ];
    let args: Vec<String> = cases
        .iter()
        .flat_map(|(flag, value, _)| arg(flag, value))
        .collect();
    let lines = probe(&host, &config, &nodes, &args);
    let (low, high) = (broker_port.min(second_port), broker_port.max(second_port));
    assert!(
        lines[0].starts_with("sandbox: landlock fully enforced (abi ")
            && lines[0].contains(&format!("tcp connect {low},{high},53")),
        "{lines:?}"
    );
    for ((what, target, verdict), line) in cases.iter().zip(&lines[1..]) {
        assert!(
            line.starts_with(&format!("{verdict} {what} {target}")),
            "expected {what} {target} {verdict}, got {line}"
        );
        if *verdict == "refused" {
            assert!(
                line.contains("os error 13"),
                "not a Landlock EACCES: {line}"
            );
        }
    }
    assert_eq!(lines.len(), cases.len() + 1, "{lines:?}");
    assert!(!outside.join("new.txt").exists());
    assert!(!host.dir.join("policy/planted.toml").exists());
}

#[test]
fn over_herdr_fleetd_executes_nothing() {
    let root = tempfile::tempdir().unwrap();
    let host = Host::new(root.path(), "herdr");
    let config = config(&host, "multiplexer = \"herdr\"\n");
    let args: Vec<String> = ["/usr/bin/tmux", "/bin/sh"]
        .iter()
        .flat_map(|p| arg("exec", p))
        .collect();
    let lines = probe(&host, &config, "127.0.0.1:5672", &args);
    assert!(
        lines[1].starts_with("refused exec /usr/bin/tmux"),
        "{lines:?}"
    );
    assert!(lines[2].starts_with("refused exec /bin/sh"), "{lines:?}");
}

#[test]
fn sandbox_off_is_reported_as_off() {
    let root = tempfile::tempdir().unwrap();
    let host = Host::new(root.path(), "off");
    let config = config(&host, "");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("sandbox = \"required\"", "sandbox = \"off\"");
    std::fs::write(&config, text).unwrap();
    let secret = root.path().join("readable.txt");
    std::fs::write(&secret, "x").unwrap();
    let lines = probe(
        &host,
        &config,
        "127.0.0.1:5672",
        &arg("read", secret.display()),
    );
    assert!(lines[0].starts_with("sandbox: off"), "{lines:?}");
    assert!(lines[1].starts_with("allowed read"), "{lines:?}");
}

#[test]
fn the_running_daemon_reports_the_enforced_level() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let config = common::solo_config(dir, "solo", "sandbox = \"required\"\n");
    let (mut child, _lines) = common::start_solo(&config, dir);
    let status = common::eventually("fleetd status", Duration::from_secs(10), || {
        let (ok, stdout, _) = common::fleetd_at(&config, dir, &["status"]);
        ok.then_some(stdout)
    });
    common::terminate(&child);
    let _ = child.wait();
    assert!(
        status.contains("sandbox: landlock fully enforced (abi "),
        "fleetd status: {status}"
    );
}
