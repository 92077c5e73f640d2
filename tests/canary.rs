//! Canary secrets from each of the three sources (systemd credential, the variable named by
//! `broker.uriEnv`, the OS keyring) never appear in logs, error output, `secret check` output or
//! `/proc/<pid>/environ` of a running daemon. Real processes, real keyring.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "test code fails loudly"
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const BIN: &str = env!("CARGO_BIN_EXE_fleetd");

struct Canaries {
    credential: String,
    env: String,
    keyring: String,
    keyring_name: String,
}

impl Canaries {
    fn new() -> Self {
        let nonce = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            % 1_000_000_007;
        Canaries {
            credential: format!("CredCanary{nonce}xQ"),
            env: format!("EnvCanary{nonce}zR"),
            keyring: format!("KeyCanary{nonce}wP"),
            keyring_name: format!("test-canary-{nonce}"),
        }
    }

    #[track_caller]
    fn assert_absent(&self, what: &str, text: &str) {
        for canary in [&self.credential, &self.env, &self.keyring] {
            assert!(
                !text.contains(canary.as_str()),
                "{what} leaked a canary:\n{text}"
            );
        }
    }
}

fn fleetd(args: &[&str], dir: &Path) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env_remove("FLEETD_CONFIG")
        .env("CREDENTIALS_DIRECTORY", dir.join("credentials"))
        .env("HOME", dir)
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .env("XDG_STATE_HOME", dir.join("state"))
        .env("XDG_RUNTIME_DIR", dir.join("run"));
    command
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Stores the keyring canary; fails with what is missing when no keyring is usable.
fn store_in_keyring(canaries: &Canaries, dir: &Path) {
    let mut child = fleetd(&["secret", "set", &canaries.keyring_name], dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{}\n", canaries.keyring).as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let out = text(&output);
    canaries.assert_absent("secret set", &out);
    assert!(
        output.status.success(),
        "the OS keyring is not usable by this process: {out}\nrun the suite in a fresh session keyring \
         (`keyctl session - cargo test`, as the README's test command does; needs the keyutils package)"
    );
}

fn setup(canaries: &Canaries) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("credentials")).unwrap();
    let key = dir.path().join("credentials/host-key");
    let init = fleetd(
        &["key", "init", "--credential-file", key.to_str().unwrap()],
        dir.path(),
    )
    .output()
    .unwrap();
    assert!(init.status.success(), "key init: {}", text(&init));
    std::fs::write(
        dir.path().join("credentials/cred-canary"),
        &canaries.credential,
    )
    .unwrap();
    let config = format!(
        "host = \"laptop\"\nfleet = \"mac\"\n[broker]\nuriEnv = \"FLEETD_TEST_URI\"\n[log]\nformat = \"json\"\nlevel = \"trace\"\n\
         [secrets.cred-canary]\n[secrets.{}]\n",
        canaries.keyring_name
    );
    std::fs::write(dir.path().join("fleetd.toml"), config).unwrap();
    dir
}

fn broker_uri(canaries: &Canaries) -> String {
    format!("amqp://mac:{}@127.0.0.1:5672/mac", canaries.env)
}

#[test]
fn canaries_from_all_three_sources_never_leak() {
    let canaries = Canaries::new();
    let dir = setup(&canaries);
    let config = dir.path().join("fleetd.toml");
    let config = config.to_str().unwrap();
    store_in_keyring(&canaries, dir.path());

    // `secret check` names each source, never a value.
    let output = fleetd(&["--config", config, "secret", "check"], dir.path())
        .env("FLEETD_TEST_URI", broker_uri(&canaries))
        .output()
        .unwrap();
    let out = text(&output);
    canaries.assert_absent("secret check", &out);
    assert!(output.status.success(), "{out}");
    assert!(
        out.contains("`broker-uri` resolved from environment variable `FLEETD_TEST_URI`"),
        "{out}"
    );
    assert!(
        out.contains("`cred-canary` resolved from systemd credential"),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "`{}` resolved from os keyring",
            canaries.keyring_name
        )),
        "{out}"
    );

    // A running daemon: its environment block no longer shows the variable, its logs show no canary.
    let mut command = fleetd(&["--config", config, "run"], dir.path());
    command.env("FLEETD_TEST_URI", broker_uri(&canaries));
    let (mut child, logs) = start_daemon(command);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .unwrap();
    assert_eq!(
        core.split_whitespace().nth(4),
        Some("0"),
        "core dumps are off: {core}"
    );
    let environ = std::fs::read(format!("/proc/{}/environ", child.id())).unwrap_or_else(|error| {
        panic!("reading /proc/<pid>/environ of the non-dumpable daemon needs root: {error}")
    });
    let environ = String::from_utf8_lossy(&environ);
    canaries.assert_absent("/proc/<pid>/environ", &environ);
    assert!(
        !environ.contains("FLEETD_TEST_URI="),
        "the variable is still in the environment block"
    );
    assert!(
        environ.contains("CREDENTIALS_DIRECTORY="),
        "the rest of the environment stays"
    );
    let logs = stop(&mut child, logs);
    canaries.assert_absent("daemon logs", &logs);
    assert!(
        logs.contains("\"secret.source\""),
        "logs name the sources: {logs}"
    );
    assert!(
        logs.contains("\"process.dumpable\":false"),
        "the daemon is non-dumpable: {logs}"
    );
    assert!(
        logs.contains("fleetd stopped"),
        "logs after ready are checked too: {logs}"
    );

    let output = fleetd(&["secret", "delete", &canaries.keyring_name], dir.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output));
}

#[test]
fn errors_about_secrets_never_contain_them() {
    let canaries = Canaries::new();
    let dir = setup(&canaries);
    let config = dir.path().join("fleetd.toml");
    // A broker secret that is not a valid URI: the daemon refuses it without echoing it.
    let output = fleetd(&["--config", config.to_str().unwrap(), "run"], dir.path())
        .env(
            "FLEETD_TEST_URI",
            format!("http://mac:{}@broker/", canaries.env),
        )
        .output()
        .unwrap();
    let out = text(&output);
    assert!(!output.status.success());
    canaries.assert_absent("run with a bad uri", &out);
}

#[test]
fn a_config_with_a_literal_password_is_refused_without_echoing_it() {
    let canaries = Canaries::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleetd.toml");
    let cases = [
        format!(
            "[broker]\nuriEnv = \"amqp://mac:{}@broker:5672/mac\"\n",
            canaries.env
        ),
        format!("host = \"laptop\"\npassword = \"{}\"\n", canaries.env),
    ];
    for case in cases {
        std::fs::write(&path, case).unwrap();
        for command in [&["config", "check"][..], &["run"][..]] {
            let mut args = vec!["--config", path.to_str().unwrap()];
            args.extend_from_slice(command);
            let output = fleetd(&args, dir.path()).output().unwrap();
            let out = text(&output);
            assert_eq!(output.status.code(), Some(1), "{out}");
            assert!(out.contains("literal credential"), "{out}");
            assert!(
                out.contains("fleetd.toml:"),
                "diagnostic has file:line:column: {out}"
            );
            canaries.assert_absent("config error", &out);
        }
    }
}

#[test]
fn scrub_filters_a_pipe_and_flushes_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let known = dir.path().join("known");
    std::fs::write(&known, "db=Kn0wnS3cretValue\n").unwrap();
    let mut child = Command::new(BIN)
        .args(["scrub", "--known", known.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    stdin
        .write_all(b"password is Kn0wnS3cretValue; prompt> ")
        .unwrap();
    stdin.flush().unwrap();
    // No newline: only the idle flush can release it.
    let mut buf = [0u8; 256];
    let n = stdout.read(&mut buf).unwrap();
    let first = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(
        first.starts_with("password is [redacted:held-secret];"),
        "{first}"
    );
    drop(stdin);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert!(child.wait().unwrap().success());
    assert!(!format!("{first}{rest}").contains("Kn0wnS3cretValue"));
}

/// Everything the daemon writes to stderr, collected by a reader thread.
struct Logs {
    lines: std::sync::mpsc::Receiver<String>,
    seen: String,
}

impl Logs {
    fn capture(child: &mut Child) -> Logs {
        let stderr = child.stderr.take().unwrap();
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        Logs {
            lines,
            seen: String::new(),
        }
    }

    /// Waits up to 20 s for a line containing `needle`.
    fn wait_for(&mut self, child: &mut Child, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(line) = self.lines.recv_timeout(Duration::from_millis(100)) {
                self.seen.push_str(&line);
                self.seen.push('\n');
                if line.contains(needle) {
                    return;
                }
            }
        }
        let _ = child.kill();
        panic!(
            "daemon did not log `{needle}` within 20 s; it logged:\n{}",
            self.seen
        );
    }

    /// Everything logged, after the daemon exited.
    fn rest(mut self) -> String {
        while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(5)) {
            self.seen.push_str(&line);
            self.seen.push('\n');
        }
        self.seen
    }
}

/// Starts `fleetd run` and waits until it logs that it is ready.
fn start_daemon(mut command: Command) -> (Child, Logs) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut logs = Logs::capture(&mut child);
    logs.wait_for(&mut child, "fleetd ready");
    (child, logs)
}

/// SIGTERM, then everything the daemon wrote to stdout and stderr.
fn stop(child: &mut Child, logs: Logs) -> String {
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "daemon exit after SIGTERM: {status}");
    let mut all = logs.rest();
    if let Some(mut stdout) = child.stdout.take() {
        stdout.read_to_string(&mut all).unwrap();
    }
    all
}

#[test]
fn run_without_any_config_starts_in_single_host_mode() {
    let dir = tempfile::tempdir().unwrap();
    assert!(
        !Path::new("/etc/fleetd/fleetd.toml").exists(),
        "/etc/fleetd/fleetd.toml exists on this machine; the default-mode test needs it absent"
    );
    let mut command = fleetd(&["run"], dir.path());
    command.env_remove("CREDENTIALS_DIRECTORY");
    let (mut child, logs) = start_daemon(command);
    let status = fleetd(&["status"], dir.path())
        .env_remove("CREDENTIALS_DIRECTORY")
        .output()
        .unwrap();
    assert!(
        text(&status).contains("broker: not configured"),
        "{}",
        text(&status)
    );
    let logs = stop(&mut child, logs);
    assert!(logs.contains("single-host mode"), "{logs}");
    assert!(logs.contains("embedded defaults"), "{logs}");
}

#[test]
fn an_invalid_policy_stops_start_up_and_a_bad_reload_keeps_the_last_good_one() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy");
    std::fs::create_dir(&policy).unwrap();
    let good = "[profile.w]\nargv = [\"/bin/true\"]\nroots = [\"/tmp\"]\n";
    std::fs::write(
        policy.join("p.toml"),
        "[profile.w]\nargv = [\"/bin/true\"]\nroots = [\"/tmp\"]\nalow = 1\n",
    )
    .unwrap();
    let config = dir.path().join("fleetd.toml");
    std::fs::write(
        &config,
        format!(
            "[paths]\npolicy = \"{}\"\n[log]\nformat = \"json\"\n",
            policy.display()
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();

    let refused = fleetd(&["--config", config, "run"], dir.path())
        .output()
        .unwrap();
    let out = text(&refused);
    assert_eq!(refused.status.code(), Some(3), "{out}");
    assert!(
        out.contains("p.toml:4:1: error: unknown key `profile.w.alow`"),
        "{out}"
    );

    std::fs::write(policy.join("p.toml"), good).unwrap();
    let (mut child, mut logs) = start_daemon(fleetd(&["--config", config, "run"], dir.path()));
    assert!(logs.seen.contains("policy loaded"), "{}", logs.seen);
    let secret = "Zx9pQ2rT7vLmReload";
    std::fs::write(
        policy.join("p.toml"),
        format!("{good}env = {{ DB_PASSWORD = \"{secret}\" }}\n"),
    )
    .unwrap();
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    logs.wait_for(&mut child, "keeping the last good policy");
    std::fs::write(policy.join("p.toml"), good).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
    logs.wait_for(&mut child, "policy reloaded");
    let all = stop(&mut child, logs);
    assert!(
        all.contains("\"policy.line\":4"),
        "the failure names file and line: {all}"
    );
    assert!(
        !all.contains(secret),
        "a refused value never reaches the log: {all}"
    );
}

/// Secret *names* are not secrets: `config check` and `secret check` print them readably, even
/// names that say `token`, `password` or `key` (the scrubber once took them for values).
#[test]
fn secret_names_stay_readable_in_config_and_secret_check() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("fleetd.toml");
    std::fs::write(
        &config,
        "host = \"h\"\nfleet = \"f\"\n[secrets.github-token]\nenv = \"GITHUB_TOKEN\"\n\
         [secrets.db-password]\nenv = \"DB_PASSWORD\"\n[secrets.api_key]\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let checked = text(
        &fleetd(&["--config", config, "config", "check"], dir.path())
            .output()
            .unwrap(),
    );
    let resolved = text(
        &fleetd(&["--config", config, "secret", "check"], dir.path())
            .env("GITHUB_TOKEN", "ghp_not-a-real-token-but-long-enough-0123")
            .output()
            .unwrap(),
    );
    for name in ["github-token", "db-password", "api_key"] {
        assert!(checked.contains(&format!("`{name}`")), "{checked}");
        assert!(resolved.contains(&format!("`{name}`")), "{resolved}");
    }
    assert!(
        !checked.contains("[redacted") && !resolved.contains("[redacted"),
        "{checked}{resolved}"
    );
    assert!(
        resolved.contains("`github-token` resolved from environment variable `GITHUB_TOKEN`"),
        "{resolved}"
    );
    assert!(resolved.contains("`api_key` unresolved"), "{resolved}");
}
