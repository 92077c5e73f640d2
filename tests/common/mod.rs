//! Helpers shared by the tests that talk to the machine's RabbitMQ and run daemons: broker
//! grants, clean-up of test fleets, and reading a daemon's log lines.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "shared test helpers; each includer uses part"
)]

pub mod fake_tmux;
pub mod herdr;
pub mod identities;
pub mod mcp;
pub mod netns;
pub mod publish;
pub mod syscalls;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub const BIN: &str = env!("CARGO_BIN_EXE_fleetd");

/// The overall exposure `systemd-analyze security` printed in `stdout` (`… for NAME.service: 0.9
/// SAFE …`), shown on stderr; panics naming `stderr` when there is none.
#[expect(
    clippy::print_stderr,
    reason = "the score is shown in the test's output"
)]
pub fn overall_exposure(stdout: &str, stderr: &str) -> f64 {
    let line = stdout
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| {
            panic!("no overall exposure in systemd-analyze's output: {stdout}{stderr}")
        });
    eprintln!("{line}");
    // After the unit's name: the face after the score may hold a colon (`:-}` without UTF-8).
    line.split_once(".service:")
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("cannot read the score in {line:?}"))
}

/// A number unique to this run, for vhost and user names.
pub fn nonce() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        % 1_000_000_000
}

/// Applies `fleetd broker grants --shared-user --apply` for `fleet`, admitting `admits`: the
/// vhost, its exchanges and the shared fleet user `FLEET` with `password` (on stdin).
pub fn grants(fleet: &str, admits: &[&str], password: &str) {
    grants_on(None, fleet, admits, password);
}

/// Applies `fleetd broker grants --apply` for `fleet`, admitting `admits`: the vhost and its
/// exchanges, no user (each host gets its own with [`host_grants`]).
pub fn fleet_grants(fleet: &str, admits: &[&str]) {
    let mut args = vec!["broker", "grants", "--fleet", fleet, "--apply"];
    for origin in admits {
        args.extend_from_slice(&["--admit", origin]);
    }
    run_grants(
        &args,
        Some("amqp://guest:guest@127.0.0.1:5672/"),
        None,
        &format!("grants for {fleet}"),
    );
}

/// Applies `fleetd broker grants --fleet FLEET --host HOST --apply` (the host user
/// `FLEET.HOST`, writing into the ingress exchanges of `into`), with `password` on stdin. The
/// fleet's own grants must have run.
pub fn host_grants(fleet: &str, host: &str, into: &[&str], password: &str) {
    let mut args = vec![
        "broker", "grants", "--fleet", fleet, "--host", host, "--apply",
    ];
    for target in into {
        args.extend_from_slice(&["--into", target]);
    }
    run_grants(
        &args,
        Some("amqp://guest:guest@127.0.0.1:5672/"),
        Some(password),
        &format!("host grants for {fleet}.{host}"),
    );
}

/// Runs `fleetd ARGS` (a `broker grants --apply`) with `password`, if any, on stdin and the
/// admin URI `admin`, if any; panics naming `what` unless it succeeds without echoing the
/// password.
fn run_grants(args: &[&str], admin: Option<&str>, password: Option<&str>, what: &str) {
    let mut command = Command::new(BIN);
    command.args(args);
    if let Some(admin) = admin {
        command.env("FLEETD_ADMIN_URI", admin);
    }
    let mut child = command
        .stdin(if password.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(password) = password {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(format!("{password}\n").as_bytes())
            .unwrap();
    }
    let output = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "{what} (is RabbitMQ running and rabbitmqctl usable? scripts/test starts it): {text}"
    );
    assert!(
        password.is_none_or(|p| !text.contains(p)),
        "the password leaked into the grants output: {text}"
    );
}

/// [`grants`] on the default node, or with `Some((node, admin_uri))` through
/// `rabbitmqctl -n NODE` and that admin URI (a cluster).
pub fn grants_on(on: Option<(&str, &str)>, fleet: &str, admits: &[&str], password: &str) {
    let mut args = vec![
        "broker",
        "grants",
        "--fleet",
        fleet,
        "--shared-user",
        "--apply",
    ];
    for origin in admits {
        args.extend_from_slice(&["--admit", origin]);
    }
    let admin = match on {
        Some((node, admin)) => {
            args.extend_from_slice(&["--node", node]);
            admin
        }
        None => "amqp://guest:guest@127.0.0.1:5672/",
    };
    run_grants(
        &args,
        Some(admin),
        Some(password),
        &format!("grants for {fleet}"),
    );
}

/// `scripts/cluster ARGS` (the 3-node test cluster); its stdout, or a panic naming what is
/// missing.
pub fn cluster(args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/cluster");
    let out = Command::new(script).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "scripts/cluster {args:?} failed — the 3-node test cluster must run (scripts/test \
         starts it with `scripts/cluster start`, as root): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Two running hosts of two fleets with an agent each (see [`start_pair`]).
pub struct Pair {
    /// The first host's log lines.
    pub a_log: mpsc::Receiver<String>,
    /// The second host's.
    pub b_log: mpsc::Receiver<String>,
    /// Agent `primary` on the first host.
    pub primary: String,
    /// Agent `worker` on the second.
    pub worker: String,
    /// What the waits read of the logs.
    pub seen: String,
}

/// Starts host `a` in fleet `fa` (password `pa`) and `b` in `fb`, each taking mail from and
/// pinning the other (their daemons in `cleanup`); waits until both are connected, opens
/// `primary` on `a` and `worker` on `b`, and waits until each roster lists the other's agent.
pub fn start_pair(
    (a, fa, pa): (&Host, &str, &str),
    (b, fb, pb): (&Host, &str, &str),
    cleanup: &mut Fleets,
) -> Pair {
    a.accept_mail_from(&[fb]);
    b.accept_mail_from(&[fa]);
    let (child, a_log) = a.start(fa, pa, &[fb], &[(b, fb)]);
    cleanup.children.push(child);
    let (child, b_log) = b.start(fb, pb, &[fa], &[(a, fa)]);
    cleanup.children.push(child);
    let mut seen = String::new();
    for log in [&a_log, &b_log] {
        wait_for(
            log,
            &mut seen,
            &["broker connected"],
            Duration::from_secs(30),
        );
    }
    let primary = a.open_agent("primary");
    let worker = b.open_agent("worker");
    a.wait_listed(&worker);
    b.wait_listed(&primary);
    Pair {
        a_log,
        b_log,
        primary,
        worker,
        seen,
    }
}

/// Removes test fleets' vhosts and users and kills their daemons, even when a test fails.
pub struct Fleets {
    pub names: Vec<String>,
    pub children: Vec<Child>,
    /// The node their vhosts and users live on (`rabbitmqctl -n`); the default node if `None`.
    pub node: Option<String>,
}

impl Fleets {
    pub fn new(names: &[&str]) -> Fleets {
        Fleets {
            names: names.iter().map(|n| (*n).to_owned()).collect(),
            children: Vec::new(),
            node: None,
        }
    }
}

impl Drop for Fleets {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let node: Vec<&str> = self.node.iter().flat_map(|n| ["-n", n]).collect();
        // Host users `FLEET.HOST` go with their fleet.
        let users = Command::new("rabbitmqctl")
            .args(&node)
            .args(["-q", "list_users"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for user in users.lines().filter_map(|l| l.split('\t').next()) {
            if self.names.iter().any(|f| {
                user.strip_prefix(f.as_str())
                    .is_some_and(|r| r.starts_with('.'))
            }) {
                let _ = Command::new("rabbitmqctl")
                    .args(&node)
                    .args(["-q", "delete_user", user])
                    .output();
            }
        }
        for fleet in &self.names {
            let _ = Command::new("rabbitmqctl")
                .args(&node)
                .args(["-q", "delete_vhost", &format!("/{fleet}")])
                .output();
            let _ = Command::new("rabbitmqctl")
                .args(&node)
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

/// One request on the local API socket `socket`, written as raw JSON the way any client (a
/// process in a pane) could write it; the reply.
pub fn raw_request(socket: &std::path::Path, line: &serde_json::Value) -> serde_json::Value {
    let mut stream = std::os::unix::net::UnixStream::connect(socket).unwrap();
    stream.write_all(format!("{line}\n").as_bytes()).unwrap();
    let mut reply = String::new();
    BufReader::new(stream).read_line(&mut reply).unwrap();
    serde_json::from_str(&reply).unwrap()
}

/// The message with text `text` in a pull's reply (`{"messages": [...]}`), if there is one.
pub fn held_with_text(pulled: &serde_json::Value, text: &str) -> Option<serde_json::Value> {
    pulled["messages"]
        .as_array()
        .unwrap_or_else(|| panic!("not a pull reply: {pulled}"))
        .iter()
        .find(|m| m["body"]["text"] == text)
        .cloned()
}

/// Sends SIGTERM to `child`.
pub fn terminate(child: &Child) {
    let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
}

/// A test host: its directory (config, credentials, state, runtime) and its public key.
pub struct Host {
    pub name: String,
    pub dir: std::path::PathBuf,
    pub pubkey: String,
    /// Extra lines for the config's `[broker]` table (e.g. `skew_secs = 2`).
    pub broker_lines: String,
    /// The broker addresses (`HOST:PORT`, comma-separated) its URI names; the default node.
    pub broker_nodes: String,
    /// The broker user in its URI (the fleet's user when `None`; a host user `FLEET.HOST`).
    pub broker_user: Option<String>,
}

impl Host {
    /// Creates the host's directory and host key (`fleetd key init` into a credential file).
    pub fn new(root: &std::path::Path, name: &str) -> Host {
        let dir = root.join(name);
        std::fs::create_dir_all(dir.join("credentials")).unwrap();
        let key = dir.join("credentials/host-key");
        let init = Command::new(BIN)
            .args(["key", "init", "--credential-file", key.to_str().unwrap()])
            .env("HOME", &dir)
            .output()
            .unwrap();
        assert!(init.status.success());
        let text = String::from_utf8_lossy(&init.stdout).into_owned();
        let pubkey = text
            .lines()
            .find_map(|l| l.strip_prefix("pubkey = "))
            .unwrap()
            .trim_matches('"')
            .to_owned();
        Host {
            name: name.to_owned(),
            dir,
            pubkey,
            broker_lines: String::new(),
            broker_nodes: "127.0.0.1:5672".to_owned(),
            broker_user: None,
        }
    }

    /// Starts the host's daemon in `fleet` with `password`, taking in `admit`, pinning `peers`
    /// (host, fleet); beats every second, suspect after 3 s, reaped after 6 s; backoff cap 2 s.
    pub fn start(
        &self,
        fleet: &str,
        password: &str,
        admit: &[&str],
        peers: &[(&Host, &str)],
    ) -> (Child, mpsc::Receiver<String>) {
        self.start_with(fleet, password, admit, peers, "", "")
    }

    /// [`Host::start`] with `top` prepended to the config (top-level keys) and `tail` appended
    /// (tables such as `[[lead]]`).
    pub fn start_with(
        &self,
        fleet: &str,
        password: &str,
        admit: &[&str],
        peers: &[(&Host, &str)],
        top: &str,
        tail: &str,
    ) -> (Child, mpsc::Receiver<String>) {
        self.start_with_env(fleet, password, admit, peers, (top, tail), &[])
    }

    /// [`Host::start_with`] with extra environment variables for the daemon.
    pub fn start_with_env(
        &self,
        fleet: &str,
        password: &str,
        admit: &[&str],
        peers: &[(&Host, &str)],
        extra: (&str, &str),
        env: &[(&str, &str)],
    ) -> (Child, mpsc::Receiver<String>) {
        spawn_logged(self.command(fleet, password, admit, peers, extra, env))
    }

    /// Writes the config [`Host::start_with_env`] uses and returns the daemon's command.
    pub fn command(
        &self,
        fleet: &str,
        password: &str,
        admit: &[&str],
        peers: &[(&Host, &str)],
        (top, tail): (&str, &str),
        env: &[(&str, &str)],
    ) -> Command {
        let admit: Vec<String> = admit.iter().map(|f| format!("\"{f}\"")).collect();
        let pins: String = peers
            .iter()
            .map(|(peer, peer_fleet)| {
                format!(
                    "[[peer]]\nfleet = \"{peer_fleet}\"\nhost = \"{}\"\npubkey = \"{}\"\n",
                    peer.name, peer.pubkey
                )
            })
            .collect();
        let config = self.dir.join("fleetd.toml");
        std::fs::write(
            &config,
            format!(
                "{top}host = \"{}\"\nfleet = \"{fleet}\"\n[broker]\nuriEnv = \"FLEETD_T_URI\"\nbackoff_cap_secs = 2\nadmit = [{}]\n{}\
                 [roster]\nbeat_secs = 1\nsuspect_secs = 3\nreap_secs = 6\n[log]\nformat = \"json\"\n{pins}{tail}",
                self.name,
                admit.join(", "),
                self.broker_lines,
            ),
        )
        .unwrap();
        let mut command = Command::new(BIN);
        command
            .args(["--config", config.to_str().unwrap(), "run"])
            .env("CREDENTIALS_DIRECTORY", self.dir.join("credentials"))
            .env("HOME", &self.dir)
            .env("XDG_STATE_HOME", self.dir.join("state"))
            .env("XDG_RUNTIME_DIR", self.dir.join("run"))
            .env(
                "FLEETD_T_URI",
                format!(
                    "amqp://{}:{password}@{}/%2F{fleet}",
                    self.broker_user.as_deref().unwrap_or(fleet),
                    self.broker_nodes
                ),
            )
            .envs(env.iter().copied());
        command
    }

    /// Runs `fleetd ARGS` against this host's daemon; panics with stderr unless it succeeds.
    pub fn cli(&self, args: &[&str]) -> String {
        let (ok, stdout, stderr) = fleetd_at(&self.dir.join("fleetd.toml"), &self.dir, args);
        assert!(ok, "fleetd {args:?} on {}: {stdout}{stderr}", self.name);
        stdout
    }

    /// One request to this host's local API (written as JSON here, and checked to be one the
    /// API's request type takes).
    pub fn api(&self, request: &serde_json::Value) -> serde_json::Value {
        let request = fleetd::api::Request::parse(request.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("{request} is not an api request: {e}"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime
            .block_on(fleetd::api::request(&self.dir.join("run/fleetd"), &request))
            .unwrap_or_else(|e| panic!("local api of {}: {e}", self.name))
    }

    /// The state directory of its daemon.
    pub fn state_dir(&self) -> std::path::PathBuf {
        self.dir.join("state/fleetd")
    }

    /// The (id, status) of this host's agent named `name` in the roster, if it is there.
    pub fn agent_entry(&self, name: &str) -> Option<(String, String)> {
        let roster = self.api(&serde_json::json!({"op": "roster"}));
        roster["hosts"][0]["agents"]
            .as_array()?
            .iter()
            .find(|a| a["name"] == name)
            .map(|a| {
                (
                    a["id"].as_str().unwrap().to_owned(),
                    a["status"].as_str().unwrap().to_owned(),
                )
            })
    }
}

/// Polls `check` every 100 ms until it returns `Some`, or panics with `what` after `within`.
pub fn eventually<T>(what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Host {
    /// The delivery state of message `id` sent from this host.
    pub fn delivery(&self, id: &str) -> serde_json::Value {
        self.api(&serde_json::json!({"op": "delivery", "id": id}))
    }

    /// Waits (30 s) until message `id` sent from this host is in state `wanted`.
    pub fn wait_delivery(&self, id: &str, wanted: &str) -> serde_json::Value {
        eventually(
            &format!("message {id} {wanted} (last: {})", self.delivery(id)),
            Duration::from_secs(30),
            || {
                let s = self.delivery(id);
                (s["state"] == wanted).then_some(s)
            },
        )
    }

    /// The local agent `name` (registered if needed): its global id.
    pub fn open_agent(&self, name: &str) -> String {
        self.cli(&["agent", "open", name]).trim().to_owned()
    }

    /// Sends `text` to agent `to` from agent `from`; returns (message id, route).
    pub fn send(&self, to: &str, from: &str, text: &str) -> (String, String) {
        let reply =
            self.api(&serde_json::json!({"op": "send", "to": to, "from": from, "text": text}));
        assert!(reply["error"].is_null(), "send: {reply}");
        (
            reply["id"].as_str().unwrap().to_owned(),
            reply["route"].as_str().unwrap().to_owned(),
        )
    }

    /// Up to 100 messages held for local agent `agent`.
    pub fn held(&self, agent: &str) -> Vec<serde_json::Value> {
        let reply = self.api(&serde_json::json!({"op": "held.pull", "agent": agent, "limit": 100}));
        reply["messages"]
            .as_array()
            .unwrap_or_else(|| panic!("held.pull: {reply}"))
            .clone()
    }

    /// Drains `agent`'s held messages (pull, ack), returning their texts in order.
    pub fn drain(&self, agent: &str) -> Vec<String> {
        let mut texts = Vec::new();
        loop {
            let batch = self.held(agent);
            if batch.is_empty() {
                return texts;
            }
            for message in batch {
                texts.push(message["body"]["text"].as_str().unwrap().to_owned());
                let id = message["id"].as_str().unwrap();
                let ack = self.api(&serde_json::json!({"op": "held.ack", "id": id}));
                assert_eq!(ack["acknowledged"], true, "{ack}");
            }
        }
    }

    /// Waits until this host's roster lists agent `id`.
    pub fn wait_listed(&self, id: &str) {
        eventually(
            &format!("{id} in {}'s roster", self.name),
            Duration::from_secs(20),
            || {
                self.api(&serde_json::json!({"op": "roster"}))
                    .to_string()
                    .contains(id)
                    .then_some(())
            },
        );
    }
}

/// A private tmux server (`tmux -L NAME`) started here, as the operator's unit would start it,
/// and killed when dropped.
pub struct TmuxServer(pub String);

impl TmuxServer {
    /// Starts a server whose socket name is unique to `nonce`.
    pub fn start(nonce: u128) -> TmuxServer {
        TmuxServer::start_in(nonce, |command| command)
    }

    /// [`TmuxServer::start`], the server command passed through `wrap` (to start it inside a
    /// test host's namespaces).
    pub fn start_in(nonce: u128, wrap: impl FnOnce(Command) -> Command) -> TmuxServer {
        let server = TmuxServer(format!("fleetd-test-{nonce}-{}", std::process::id()));
        let mut command = Command::new("tmux");
        command.args([
            "-L",
            &server.0,
            "new-session",
            "-d",
            "-s",
            "keep",
            "sleep 600",
        ]);
        let started = wrap(command)
            .status()
            .expect("tmux is needed for the pane tests (package tmux; scripts/test installs it)");
        assert!(started.success(), "cannot start a tmux server");
        server
    }

    /// `tmux -L NAME ARGS`: its stdout.
    pub fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-L")
            .arg(&self.0)
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Every pane's id.
    pub fn panes(&self) -> Vec<String> {
        self.run(&["list-panes", "-a", "-F", "#{pane_id}"])
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// What every pane shows (wrapped lines joined).
    pub fn shown(&self) -> String {
        self.panes()
            .iter()
            .map(|p| self.run(&["capture-pane", "-p", "-J", "-t", p]))
            .collect()
    }

    /// The environment (NUL-separated) of the process in the pane that runs agent `agent`
    /// (its `FLEETD_AGENT_ID`).
    pub fn agent_environ(&self, agent: &str) -> String {
        self.panes()
            .iter()
            .map(|pane| {
                let pid = self.run(&["display-message", "-p", "-t", pane, "#{pane_pid}"]);
                std::fs::read(format!("/proc/{}/environ", pid.trim()))
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default()
            })
            .find(|env| env.contains(&format!("FLEETD_AGENT_ID={agent}")))
            .unwrap_or_else(|| panic!("no pane runs agent {agent}"))
    }

    /// Every environment tmux keeps: the global one and each session's.
    pub fn environments(&self) -> String {
        let mut all = self.run(&["show-environment", "-g"]);
        for session in self
            .run(&["list-sessions", "-F", "#{session_name}"])
            .lines()
        {
            all.push_str(&self.run(&["show-environment", "-t", session]));
        }
        all
    }

    /// The config line that points a daemon at this server.
    pub fn config_line(&self) -> String {
        format!("tmux_socket = \"{}\"\n", self.0)
    }
}

impl Drop for TmuxServer {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["-L", &self.0, "kill-server"])
            .status();
    }
}

/// Delegation across fleets through the real broker: fleet A's `laptop` asks fleet B's `w1`,
/// each fleet admitting the other (tests/spawn_remote.rs, benches/spawn_remote.rs).
pub struct Delegation {
    /// Fleet A (the laptop's) and fleet B (w1's): `PREFIXa` and `PREFIXb` with the nonce.
    pub a: String,
    pub b: String,
    pa: String,
    pb: String,
    pub laptop: Host,
    pub w1: Host,
    /// Kills the daemons and removes the fleets (before the hosts' directory goes).
    pub cleanup: Fleets,
    root: tempfile::TempDir,
}

impl Delegation {
    /// The two fleets with their grants, and the two hosts' directories; nothing runs yet.
    pub fn new(prefix: &str, nonce: u128) -> Delegation {
        let (a, b) = (format!("{prefix}a{nonce}"), format!("{prefix}b{nonce}"));
        let upper = prefix.to_uppercase();
        let (pa, pb) = (format!("Pw{upper}A{nonce}x"), format!("Pw{upper}B{nonce}x"));
        let cleanup = Fleets::new(&[&a, &b]);
        // A's grants again once B's vhost exists (each binds the other's ingress).
        grants(&a, &[&b], &pa);
        grants(&b, &[&a], &pb);
        grants(&a, &[&b], &pa);
        let root = tempfile::tempdir().unwrap();
        let (laptop, w1) = (
            Host::new(root.path(), "laptop"),
            Host::new(root.path(), "w1"),
        );
        Delegation {
            a,
            b,
            pa,
            pb,
            laptop,
            w1,
            cleanup,
            root,
        }
    }

    /// Starts both daemons (w1's agents on `tmux`) and waits until the laptop's roster holds w1
    /// and w1 is connected to the broker.
    pub fn start(&mut self, tmux: &TmuxServer) {
        let (a, b) = (&self.a, &self.b);
        let (child, laptop_log) = self.laptop.start(a, &self.pa, &[b], &[(&self.w1, b)]);
        self.cleanup.children.push(child);
        let (child, w1_log) = self.w1.start_with(
            b,
            &self.pb,
            &[a],
            &[(&self.laptop, a)],
            &tmux.config_line(),
            "",
        );
        self.cleanup.children.push(child);
        let mut seen = String::new();
        wait_for(
            &laptop_log,
            &mut seen,
            &["peer joined", "\"peer.host\":\"w1\""],
            Duration::from_secs(30),
        );
        wait_for(
            &w1_log,
            &mut seen,
            &["broker connected"],
            Duration::from_secs(20),
        );
    }
}

/// A test fleet named PREFIX + a nonce with its grants applied; returns (nonce, fleet, password,
/// clean-up guard).
pub fn one_fleet(prefix: &str) -> (u128, String, String, Fleets) {
    let nonce = nonce();
    let fleet = format!("{prefix}{nonce}");
    let password = format!("Pw{prefix}{nonce}x");
    let cleanup = Fleets::new(&[&fleet]);
    grants(&fleet, &[], &password);
    (nonce, fleet, password, cleanup)
}

impl Host {
    /// `fleetd spawn ARGS` on this host: (succeeded, stdout and stderr).
    pub fn spawn_cli(&self, args: &[&str]) -> (bool, String) {
        let mut full = vec!["spawn"];
        full.extend_from_slice(args);
        let (ok, stdout, stderr) = fleetd_at(&self.dir.join("fleetd.toml"), &self.dir, &full);
        (ok, format!("{stdout}{stderr}"))
    }

    /// Writes `files` (name, text) into this host's policy directory.
    pub fn policy(&self, files: &[(&str, String)]) {
        let dir = self.dir.join(".config/fleetd/policy");
        std::fs::create_dir_all(&dir).unwrap();
        for (name, text) in files {
            std::fs::write(dir.join(name), text).unwrap();
        }
    }

    /// Lets agents of `fleets` on other hosts message this host's mailboxes: a `[[message]]`
    /// rule in its policy (without one, a mailbox hears only from agents it spawned).
    pub fn accept_mail_from(&self, fleets: &[&str]) {
        let list: Vec<String> = fleets.iter().map(|f| format!("\"{f}\"")).collect();
        self.policy(&[(
            "50-mailboxes.toml",
            format!(
                "[[message]]\nid = \"test-mailboxes\"\nfleets = [{}]\nprofiles = [\"mailbox\"]\n",
                list.join(", ")
            ),
        )]);
    }

    /// A directory under this host for a profile's root.
    pub fn work_dir(&self) -> std::path::PathBuf {
        let work = self.dir.join("work");
        std::fs::create_dir_all(&work).unwrap();
        work
    }
}

/// `fleetd --config CONFIG ARGS` as a client of the daemon whose HOME is `home` (runtime dir
/// `home/run`): (succeeded, stdout, stderr).
pub fn fleetd_at(
    config: &std::path::Path,
    home: &std::path::Path,
    args: &[&str],
) -> (bool, String, String) {
    let mut full = vec!["--config", config.to_str().unwrap()];
    full.extend_from_slice(args);
    let out = Command::new(BIN)
        .args(&full)
        .env("HOME", home)
        .env("XDG_RUNTIME_DIR", home.join("run"))
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Writes a single-host config `dir/fleetd.toml` for host `host` (`top` prepended), with its
/// policy, state and runtime directories under `dir`; returns its path.
pub fn solo_config(dir: &std::path::Path, host: &str, top: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir.join("policy")).unwrap();
    let config = dir.join("fleetd.toml");
    std::fs::write(
        &config,
        format!(
            "{top}host = \"{host}\"\n[paths]\npolicy = \"{0}/policy\"\nstate = \"{0}/state\"\nruntime = \"{0}/run\"\n",
            dir.display()
        ),
    )
    .unwrap();
    config
}

/// Starts `fleetd run` on `config` (HOME `dir`) and waits until it is ready.
pub fn start_solo(
    config: &std::path::Path,
    dir: &std::path::Path,
) -> (Child, mpsc::Receiver<String>) {
    let mut command = Command::new(BIN);
    command
        .args(["--config", config.to_str().unwrap(), "run"])
        .env("HOME", dir);
    let (child, lines) = spawn_logged(command);
    let mut seen = String::new();
    wait_for(
        &lines,
        &mut seen,
        &["fleetd ready"],
        Duration::from_secs(20),
    );
    (child, lines)
}

/// After peer `host` was SIGKILLed at `killed` (no `leaving`): waits for `log` to show it
/// suspect, then reaped, and checks the timing of the test configuration (beats every second,
/// suspect after 3 s of silence, reaped after 6 s).
pub fn suspect_then_reaped(log: &mpsc::Receiver<String>, host: &str, killed: Instant) {
    let peer = format!("\"peer.host\":\"{host}\"");
    let mut seen = String::new();
    wait_for(
        log,
        &mut seen,
        &["peer suspect", &peer],
        Duration::from_secs(10),
    );
    let suspect_after = killed.elapsed();
    wait_for(
        log,
        &mut seen,
        &["peer reaped", &peer],
        Duration::from_secs(10),
    );
    let reaped_after = killed.elapsed();
    assert!(
        suspect_after >= Duration::from_secs(2) && suspect_after < reaped_after,
        "suspect at {suspect_after:?}, reaped at {reaped_after:?}"
    );
    assert!(
        reaped_after < Duration::from_secs(10),
        "reaped at {reaped_after:?} (reap after 6 s of silence)"
    );
}

/// `rabbitmqctl -q ACTION` (e.g. `stop_app`), quietly; panics with its stderr if it fails.
pub fn rabbitmqctl(action: &str) {
    if let Err(error) = quiet_ctl(&[action]) {
        panic!("rabbitmqctl {action}: {error}");
    }
}

/// `rabbitmqctl start_app`, then `await_startup`. `start_app` right after a `stop_app` has been
/// seen to fail once in a whole CI run with "Error: normal" while the node was fine a moment
/// later, so a failed attempt is retried (up to 5, 2 s apart) before the test is failed with the
/// last error.
pub fn start_broker() {
    if let Err(last) = try_start_broker() {
        panic!("rabbitmqctl start_app failed 5 times; the last: {last}");
    }
}

/// [`start_broker`] without the panic: the last error when every attempt failed.
fn try_start_broker() -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..5 {
        match quiet_ctl(&["start_app"]) {
            Ok(()) => return quiet_ctl(&["await_startup", "--timeout", "60"]),
            Err(error) => last = error,
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    Err(last)
}

/// `rabbitmqctl -q ARGS...`; its stderr when it fails.
fn quiet_ctl(args: &[&str]) -> Result<(), String> {
    let out = Command::new("rabbitmqctl")
        .arg("-q")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run rabbitmqctl (scripts/test installs it): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Starts RabbitMQ's application again (and waits for it) when dropped, so a test that stops
/// the broker never leaves it stopped for the tests after it, even when it fails half-way.
/// Declare it after `Fleets`, so it is dropped first and the clean-up finds the broker up.
pub struct BrokerUp;

impl Drop for BrokerUp {
    fn drop(&mut self) {
        // Never a panic in a drop (it may run while a failed test unwinds); a broker left down
        // fails the next test that needs it, with its own message.
        let _ = try_start_broker();
    }
}

/// `inner` run through the launcher `outer` (`ip netns exec …`, `sh -c …`, `unshare …`): its
/// program and arguments appended to `outer`'s, its environment changes and working directory
/// carried over.
pub fn run_through(mut outer: Command, inner: &Command) -> Command {
    outer.arg(inner.get_program()).args(inner.get_args());
    for (name, value) in inner.get_envs() {
        match value {
            Some(value) => outer.env(name, value),
            None => outer.env_remove(name),
        };
    }
    if let Some(dir) = inner.get_current_dir() {
        outer.current_dir(dir);
    }
    outer
}
