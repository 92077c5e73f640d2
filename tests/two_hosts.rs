//! The two-host proof (docs/two-hosts.md): host `laptop` in fleet `mac` and host `fleet01` in
//! fleet `fleet01`, each in its own network and mount namespace, each with its own fleetd,
//! config, state, host key and credentials; the machine's RabbitMQ reachable from both; no
//! other path between them. Scenarios run one at a time (they share the vhosts `/mac` and
//! `/fleet01`) and remove every namespace, vhost, user and process they create.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code: a failed step is a failed test"
)]

mod common;

use std::process::{Child, Command};
use std::sync::Mutex;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::netns::NetHost;
use common::{BIN, Fleets, Host};

/// The third octet of the next scenario's links (10.231.S.0/30 and 10.232.S.0/30).
static NEXT_SUBNET: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(20);

/// The scenarios share the fleets' names: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const MAC: &str = "mac";
const FLEET01: &str = "fleet01";

/// Both hosts, their namespaces, fleets and passwords; dropping it removes everything.
struct Topology {
    laptop: Host,
    worker: Host,
    net_laptop: NetHost,
    net_worker: NetHost,
    mac_password: String,
    fleet01_password: String,
    fleets: Fleets,
    _root: tempfile::TempDir,
}

impl Topology {
    fn new() -> Topology {
        assert!(
            rustix::process::geteuid().is_root(),
            "the two-host proof needs root (network namespaces, mounts): run the suite as root"
        );
        let nonce = common::nonce();
        // A crashed earlier run may have left the fleets behind: start clean.
        drop(Fleets::new(&[MAC, FLEET01]));
        let fleets = Fleets::new(&[MAC, FLEET01]);
        // The fleets' grants (vhost, exchanges, admission; no shared user), then each host's
        // own user (`mac.laptop`, `fleet01.fleet01`), the only credential a host holds.
        common::fleet_grants(MAC, &[FLEET01]);
        common::fleet_grants(FLEET01, &[MAC]);
        let mac_password = format!("canary-mac-{nonce}-pw");
        let fleet01_password = format!("canary-f01-{nonce}-pw");
        common::host_grants(MAC, "laptop", &[FLEET01], &mac_password);
        common::host_grants(FLEET01, "fleet01", &[MAC], &fleet01_password);
        let root = tempfile::tempdir().unwrap();
        let laptop = Host::new(root.path(), "laptop");
        let worker = Host::new(root.path(), "fleet01");
        // A subnet of its own per scenario: an earlier scenario's broker forwarder keeps its
        // address bound until this process ends.
        let sub = NEXT_SUBNET.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = nonce % 1_000_000;
        let net_laptop = NetHost::create(&format!("fla{tag}"), 231, sub, &worker.dir);
        let net_worker = NetHost::create(&format!("flb{tag}"), 232, sub, &laptop.dir);
        Topology {
            laptop,
            worker,
            net_laptop,
            net_worker,
            mac_password,
            fleet01_password,
            fleets,
            _root: root,
        }
    }

    /// The broker URI a host's fleet uses, through its own link.
    fn uri(&self, laptop: bool) -> String {
        if laptop {
            format!(
                "amqp://{MAC}.laptop:{}@{}:5672/%2F{MAC}",
                self.mac_password, self.net_laptop.gateway
            )
        } else {
            format!(
                "amqp://{FLEET01}.fleet01:{}@{}:5672/%2F{FLEET01}",
                self.fleet01_password, self.net_worker.gateway
            )
        }
    }

    /// Starts a host's daemon inside its namespaces (beats every second, suspect after 3 s,
    /// reaped after 6 s); the other host's key is pinned.
    fn start(&mut self, laptop: bool, top: &str, tail: &str) -> (usize, Receiver<String>) {
        let uri = self.uri(laptop);
        let (host, peer, net, fleet, password, other) = if laptop {
            (
                &self.laptop,
                &self.worker,
                &self.net_laptop,
                MAC,
                &self.mac_password,
                FLEET01,
            )
        } else {
            (
                &self.worker,
                &self.laptop,
                &self.net_worker,
                FLEET01,
                &self.fleet01_password,
                MAC,
            )
        };
        let command = host.command(
            fleet,
            password,
            &[other],
            &[(peer, other)],
            (top, tail),
            &[("FLEETD_T_URI", &uri)],
        );
        let (child, lines) = common::spawn_logged(net.wrap(&command));
        self.fleets.children.push(child);
        (self.fleets.children.len() - 1, lines)
    }

    fn child(&mut self, index: usize) -> &mut Child {
        &mut self.fleets.children[index]
    }
}

fn contract(net: &NetHost, uri: &str, vhost: &str, expect: &str, password: &str) -> String {
    contract_with(net, uri, vhost, &["--expect", expect], password)
}

fn contract_with(net: &NetHost, uri: &str, vhost: &str, extra: &[&str], password: &str) -> String {
    let mut command = Command::new(BIN);
    command
        .args([
            "broker",
            "contract",
            "--uri-env",
            "FLEETD_T_URI",
            "--vhost",
            vhost,
        ])
        .args(extra)
        .env("FLEETD_T_URI", uri);
    let output = net.wrap(&command).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        !text.contains(password),
        "the broker password reached the output: {text}"
    );
    assert!(
        output.status.success(),
        "contract on {vhost} ({extra:?}):\n{text}"
    );
    text
}

#[test]
fn isolation_each_fleet_passes_its_own_contract_and_fails_the_other() {
    let _serial = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let topology = Topology::new();
    let (a, b) = (&topology.net_laptop, &topology.net_worker);

    // The reachability the operators measured: each reaches the broker, not the other host.
    assert!(
        a.sh(&format!("echo > /dev/tcp/{}/5672", a.gateway)),
        "laptop cannot reach the broker"
    );
    assert!(
        b.sh(&format!("echo > /dev/tcp/{}/5672", b.gateway)),
        "fleet01 cannot reach the broker"
    );
    for (from, to) in [(a, b), (b, a)] {
        assert!(
            !from.sh(&format!(
                "timeout 3 bash -c 'echo > /dev/tcp/{}/22'",
                to.address
            )),
            "{} reaches {} over the network",
            from.ns,
            to.ns
        );
    }
    let (laptop_key, worker_key) = (
        topology.laptop.dir.join("credentials/host-key"),
        topology.worker.dir.join("credentials/host-key"),
    );
    assert!(
        a.sh(&format!("test -e {}", laptop_key.display())),
        "laptop lost its own files"
    );
    assert!(
        !a.sh(&format!("test -e {}", worker_key.display())),
        "laptop sees fleet01's files"
    );
    assert!(
        !b.sh(&format!("test -e {}", laptop_key.display())),
        "fleet01 sees laptop's files"
    );

    let passes = |text: &str| text.matches("PASS").count();
    let fails = |text: &str| text.matches("FAIL").count();
    let mac = topology.uri(true);
    let f01 = topology.uri(false);
    let own = contract(a, &mac, "/mac", "capable", &topology.mac_password);
    assert_eq!((passes(&own), fails(&own)), (8, 0), "{own}");
    let other = contract(a, &mac, "/fleet01", "isolated", &topology.mac_password);
    assert_eq!((passes(&other), fails(&other)), (0, 8), "{other}");
    let own = contract(b, &f01, "/fleet01", "capable", &topology.fleet01_password);
    assert_eq!((passes(&own), fails(&own)), (8, 0), "{own}");
    let other = contract(b, &f01, "/mac", "isolated", &topology.fleet01_password);
    assert_eq!((passes(&other), fails(&other)), (0, 8), "{other}");
}

/// What the laptop logs when fleet01 joins, and fleet01 when the laptop does.
const JOINED_LAPTOP: [&str; 3] = [
    "peer joined",
    "\"peer.host\":\"fleet01\"",
    "\"peer.fleet\":\"fleet01\"",
];
const JOINED_WORKER: [&str; 3] = [
    "peer joined",
    "\"peer.host\":\"laptop\"",
    "\"peer.fleet\":\"mac\"",
];

/// Waits until each host's log shows the other joined (fleet and host both named).
fn wait_joined(laptop_log: &Receiver<String>, worker_log: &Receiver<String>, within: Duration) {
    wait(laptop_log, &JOINED_LAPTOP, within);
    wait(worker_log, &JOINED_WORKER, within);
}

fn wait(lines: &Receiver<String>, needles: &[&str], within: Duration) -> Duration {
    let mut seen = String::new();
    common::wait_for(lines, &mut seen, needles, within)
}

/// The `reviewer` lead fleet01 keeps, as the laptop's roster shows it: (id, status).
fn lead_seen_by_laptop(topology: &Topology) -> Option<(String, String)> {
    let roster = topology.laptop.api(&serde_json::json!({"op": "roster"}));
    roster["hosts"]
        .as_array()?
        .iter()
        .find(|h| h["host"] == "fleet01" && h["state"] == "alive")?["agents"]
        .as_array()?
        .iter()
        .find(|a| a["name"] == "reviewer")
        .map(|a| {
            (
                a["id"].as_str().unwrap_or_default().to_owned(),
                a["status"].as_str().unwrap_or_default().to_owned(),
            )
        })
}

#[test]
fn roster_each_host_sees_the_other_and_a_killed_host_is_suspect_then_reaped() {
    let _serial = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut topology = Topology::new();
    // fleet01 keeps a lead, launched through its own policy into its own tmux server.
    let work = topology.worker.work_dir();
    let lead_script = r#"echo 'lead> ready'; while read -r line; do echo "got:[$line]"; done"#;
    topology.worker.policy(&[
        (
            "00-profiles.toml",
            format!(
                "[profile.reviewer]\ndescription = \"A scripted lead.\"\n\
                 argv = [\"/bin/sh\", \"-c\", '''{lead_script}''']\nroots = [\"{}\"]\nmax_instances = 1\n\n\
                 [profile.reviewer.ready]\npattern = \"^lead> ready\"\ntimeout_secs = 15\n",
                work.display()
            ),
        ),
        (
            "10-grants.toml",
            "[[grant]]\nid = \"own-leads\"\ndescription = \"fleet01's leads.\"\nfleets = [\"fleet01\"]\n\
             hosts = [\"fleet01\"]\nprofiles = [\"reviewer\"]\n"
                .to_owned(),
        ),
    ]);
    let tmux = common::TmuxServer::start_in(common::nonce(), |c| topology.net_worker.wrap(&c));
    let lead = "[[lead]]\nname = \"reviewer\"\nprofile = \"reviewer\"\n";
    let (_, laptop_log) = topology.start(true, "", "");
    let (worker, worker_log) = topology.start(false, &tmux.config_line(), lead);
    wait_joined(&laptop_log, &worker_log, Duration::from_secs(30));
    let (lead_id, _) = common::eventually(
        "fleet01's lead ready in the laptop's roster",
        Duration::from_secs(30),
        || lead_seen_by_laptop(&topology).filter(|(_, s)| s == "ready"),
    );

    // Each host's local API is its own: the other's socket is not even visible.
    let socket = |host: &Host| host.dir.join("run/fleetd/fleetd.sock");
    let (a, b) = (&topology.net_laptop, &topology.net_worker);
    assert!(a.sh(&format!("test -S {}", socket(&topology.laptop).display())));
    assert!(!a.sh(&format!("test -e {}", socket(&topology.worker).display())));
    assert!(!b.sh(&format!("test -e {}", socket(&topology.laptop).display())));

    // SIGKILL on fleet01: no `leaving`; suspect after 3 s of silence, reaped after 6 s.
    let killed = Instant::now();
    topology.child(worker).kill().unwrap();
    topology.child(worker).wait().unwrap();
    common::suspect_then_reaped(&laptop_log, "fleet01", killed);
    assert!(
        lead_seen_by_laptop(&topology).is_none(),
        "a reaped host's lead is still listed"
    );

    // Restarted: back, with its lead restored under the same global id.
    let (_, _worker_log) = topology.start(false, &tmux.config_line(), lead);
    wait(&laptop_log, &JOINED_LAPTOP, Duration::from_secs(30));
    let (again, _) = common::eventually(
        "fleet01's lead back in the laptop's roster",
        Duration::from_secs(30),
        || lead_seen_by_laptop(&topology).filter(|(_, s)| s == "ready"),
    );
    assert_eq!(
        again, lead_id,
        "the lead keeps its global id across the restart"
    );
}

/// fleet01's policy: a scripted `worker` that prints every line it is given and answers the
/// sender through its own host's fleetd; `maintenance` is never granted.
fn worker_policy(worker: &Host) {
    let work = worker.work_dir();
    let dir = work.display();
    // One line: fleetd refuses a command word holding a line break. It answers with a bare
    // `fleetd send` (its pane's socket and token) and logs into its root: in its sandbox the
    // rest of the host directory is hidden.
    let script = format!(
        "echo 'agent> ready'; while read -r line; do echo \"got:[$line]\"; \
         to=$(printf '%s\\n' \"$line\" | sed -n 's/^\\[fleetd: from [^ ]* agent \\([^],]*\\),.*/\\1/p'); \
         if [ -n \"$to\" ]; then {BIN} \
         send \"$to\" 'done: 12 lines' > {dir}/reply.log 2>&1 && echo \"replied:[$to]\" || echo \"reply-failed\"; fi; done"
    );
    worker.policy(&[
        (
            "00-profiles.toml",
            format!(
                "[profile.worker]\ndescription = \"A scripted agent.\"\nargv = [\"/bin/sh\", \"-c\", '''{script}''']\n\
                 roots = [\"{work}\"]\nmax_instances = 2\n\n[profile.worker.ready]\npattern = \"^agent> ready\"\ntimeout_secs = 15\n\n\
                 [profile.maintenance]\ndescription = \"Never granted.\"\nargv = [\"/bin/sh\"]\nroots = [\"{work}\"]\nmax_instances = 1\n",
                work = work.display()
            ),
        ),
        (
            "10-grants.toml",
            format!(
                "[[grant]]\nid = \"laptop-workers\"\ndescription = \"The primary delegates.\"\n\
                 fleets = [\"{MAC}\"]\nhosts = [\"laptop\"]\nprofiles = [\"worker\"]\ncwd = true\n\
                 [grant.env.TASK_ID]\npattern = \"[A-Z]{{2,5}}-[0-9]{{1,6}}\"\nmax_len = 16\n"
            ),
        ),
    ]);
}

/// fleet01's tmux server started inside fleet01 (outside its fleetd), then both daemons,
/// joined both ways. Returns the server, fleet01's child index and both logs.
fn start_pair(topology: &mut Topology) -> (common::TmuxServer, usize, [Receiver<String>; 2]) {
    let tmux = common::TmuxServer::start_in(common::nonce(), |c| topology.net_worker.wrap(&c));
    let (_, laptop_log) = topology.start(true, "", "");
    let (worker, worker_log) = topology.start(false, &tmux.config_line(), "");
    wait_joined(&laptop_log, &worker_log, Duration::from_secs(30));
    (tmux, worker, [laptop_log, worker_log])
}

/// The delegation set-up: [`start_pair`], then the primary connected through `fleetd mcp`
/// inside the laptop, and a `worker` spawned on fleet01 through it and listed in the laptop's
/// roster. Returns the tmux server, both logs, the MCP session, the spawn reply and the worker.
fn delegate(
    topology: &mut Topology,
) -> (
    common::TmuxServer,
    [Receiver<String>; 2],
    common::mcp::Session,
    serde_json::Value,
    String,
) {
    let (tmux, _, [laptop_log, worker_log]) = start_pair(topology);
    // The primary: Claude Code's side of `fleetd mcp`, inside the laptop.
    let mut mcp = common::mcp::Session::start_with(
        topology
            .net_laptop
            .wrap(&common::mcp::Session::command(&topology.laptop)),
    );
    mcp.initialize();
    let (spawned, error) = mcp.tool(
        "spawn",
        serde_json::json!({"profile": "worker", "host": "fleet01"}),
    );
    assert!(!error, "{spawned}");
    assert_eq!(spawned["outcome"], "started", "{spawned}");
    let worker = spawned["agent"].as_str().unwrap().to_owned();
    common::eventually(
        "the worker in the laptop's roster",
        Duration::from_secs(20),
        || {
            let (roster, _) = mcp.tool("roster", serde_json::json!({}));
            roster.to_string().contains(&worker).then_some(())
        },
    );
    (tmux, [laptop_log, worker_log], mcp, spawned, worker)
}

#[test]
fn delegation_a_primary_spawns_a_worker_on_fleet01_through_mcp_and_gets_its_reply() {
    let _serial = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut topology = Topology::new();
    worker_policy(&topology.worker);
    let (tmux, _logs, mut mcp, _, worker) = delegate(&mut topology);

    let task = "count the lines in README.md";
    let (sent, error) = mcp.tool("send", serde_json::json!({"to": worker, "text": task}));
    assert!(!error, "{sent}");
    let task_id = sent["id"].as_str().unwrap().to_owned();
    let primary = common::eventually(
        "the task typed into the worker's pane",
        Duration::from_secs(20),
        || {
            let shown = tmux.shown();
            let got = shown
                .lines()
                .find(|l| l.contains(task) && l.starts_with("got:"))?
                .to_owned();
            let (_, rest) = got.split_once("agent ")?;
            Some(rest.split(',').next()?.to_owned())
        },
    );
    let shown = tmux.shown();
    assert_eq!(
        shown.matches(&format!("{task}]")).count(),
        1,
        "typed exactly once: {shown}"
    );
    assert!(
        shown.contains(&format!(
            "got:[[fleetd: from {MAC}/laptop agent {primary}, msg {task_id}] {task}]"
        )),
        "{shown}"
    );

    // The reply is held on the laptop until the primary pulls and acknowledges it.
    let (pulled, _) = mcp.tool("inbox_pull", serde_json::json!({"wait_secs": 30}));
    let message = pulled["messages"][0].clone();
    assert!(
        message.is_object(),
        "no reply held for the primary: {pulled}\nworker pane:\n{}\nworker's send: {}\nfleet01's roster: {}",
        tmux.shown(),
        std::fs::read_to_string(topology.worker.work_dir().join("reply.log")).unwrap_or_default(),
        topology.worker.cli(&["roster", "--json"])
    );
    assert_eq!(message["body"]["text"], "done: 12 lines", "{pulled}");
    assert_eq!(message["origin"]["host"], "fleet01", "{pulled}");
    let (again, _) = mcp.tool("inbox_pull", serde_json::json!({}));
    assert_eq!(
        again["messages"][0]["id"], message["id"],
        "offered again until acknowledged"
    );
    let (acked, _) = mcp.tool("inbox_ack", serde_json::json!({"id": message["id"]}));
    assert_eq!(acked["acknowledged"], true, "{acked}");
    let (empty, _) = mcp.tool("inbox_pull", serde_json::json!({}));
    assert_eq!(empty["messages"], serde_json::json!([]), "{empty}");
    assert!(tmux.shown().contains("replied:["), "the worker answered");
}

/// The attack of issue 19 and the defaults that replace it: fleet01's operator runs a shell
/// (`maintenance`) and a `helper` there; the laptop's primary asks for a `worker`. From the
/// laptop, a shell command for the shell is refused (`refused` at the laptop, nothing run); a
/// message for the worker from its spawner, and one for the helper that a `[[message]]` rule
/// admits, are typed once; the worker refuses a laptop agent that did not spawn it.
#[test]
fn messages_from_the_laptop_obey_fleet01s_message_policy() {
    let _serial = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut topology = Topology::new();
    worker_policy(&topology.worker);
    let work = topology.worker.work_dir();
    topology.worker.policy(&[(
        "20-local.toml",
        format!(
            "[profile.helper]\ndescription = \"A scripted helper.\"\n\
             argv = [\"/bin/sh\", \"-c\", \"echo 'helper> ready'; while read -r line; do echo \\\"helper:[$line]\\\"; done\"]\n\
             roots = [\"{work}\"]\n[profile.helper.ready]\npattern = \"^helper> ready\"\ntimeout_secs = 15\n\n\
             [[grant]]\nid = \"local-operator\"\nfleets = [\"{FLEET01}\"]\nhosts = [\"fleet01\"]\nprofiles = [\"helper\", \"maintenance\"]\n\n\
             [[message]]\nid = \"laptop-to-helpers\"\nfleets = [\"{MAC}\"]\nhosts = [\"laptop\"]\nprofiles = [\"helper\"]\n",
            work = work.display()
        ),
    )]);
    let (tmux, _, _logs) = start_pair(&mut topology);
    let local_spawn = |profile: &str| {
        let reply = topology
            .worker
            .cli(&["spawn", "--json", "--profile", profile]);
        let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
        assert_eq!(reply["outcome"], "started", "{profile}: {reply}");
        let id = reply["agent"].as_str().unwrap().to_owned();
        topology.laptop.wait_listed(&id);
        id
    };
    let shell = local_spawn("maintenance");
    let helper = local_spawn("helper");
    let primary = topology.laptop.open_agent("primary");
    let stranger = topology.laptop.open_agent("stranger");
    let (ok, spawned) = spawn_from_laptop(&topology, &["--profile", "worker", "--for", &primary]);
    assert!(ok, "{spawned}");
    let worker = spawned["agent"].as_str().unwrap().to_owned();
    topology.laptop.wait_listed(&worker);

    let pwned = topology.worker.dir.join("pwned");
    let injection = format!("; id > {}; #", pwned.display());
    let (to_shell, _) = topology.laptop.send(&shell, &primary, &injection);
    let (to_worker, _) = topology.laptop.send(&worker, &primary, "from the spawner");
    let (to_helper, _) = topology
        .laptop
        .send(&helper, &stranger, "granted by a rule");
    let (to_worker_stranger, _) = topology.laptop.send(&worker, &stranger, "not its spawner");

    let refused = topology.laptop.wait_delivery(&to_shell, "refused");
    let reason = refused["reason"].as_str().unwrap();
    assert!(
        reason.contains("refused by host fleet01") && reason.contains("interactive shell"),
        "{refused}"
    );
    let refused = topology
        .laptop
        .wait_delivery(&to_worker_stranger, "refused");
    assert!(
        refused["reason"]
            .as_str()
            .unwrap()
            .contains("no message rule admits"),
        "{refused}"
    );
    for typed in [&to_worker, &to_helper] {
        topology.laptop.wait_delivery(typed, "delivered");
    }
    let shown = tmux.shown();
    assert_eq!(
        shown.matches("from the spawner]").count(),
        1,
        "typed once: {shown}"
    );
    assert_eq!(
        shown.matches("granted by a rule]").count(),
        1,
        "typed once: {shown}"
    );
    assert!(!shown.contains("not its spawner"), "{shown}");
    assert!(
        !shown.contains("; id >"),
        "nothing reached the shell: {shown}"
    );
    assert!(!pwned.exists(), "the injected command never ran");
    // The worker answered its spawner: the laptop lets an agent the primary asked for reach it.
    common::eventually(
        "the worker's answer held for the primary",
        Duration::from_secs(20),
        || {
            let texts: Vec<String> = topology
                .laptop
                .held(&primary)
                .iter()
                .map(|m| m["body"]["text"].to_string())
                .collect();
            texts
                .iter()
                .any(|t| t.contains("done: 12 lines"))
                .then_some(())
        },
    );

    // fleet01 audited each decision by rule, never the text.
    let record = audit(&topology.worker);
    let decided = |id: &str| {
        record
            .lines()
            .find(|l| l.contains(&format!("\"msg_id\":\"{id}\"")))
            .unwrap_or_else(|| panic!("no record of {id}: {record}"))
            .to_owned()
    };
    for (id, event, rule) in [
        (&to_shell, "message.refused", "no-remote-text"),
        (&to_worker_stranger, "message.refused", "default-deny"),
        (&to_worker, "message.accepted", "spawner"),
        (&to_helper, "message.accepted", "laptop-to-helpers"),
    ] {
        let line = decided(id);
        assert!(line.contains(&format!("\"{event}\"")), "{line}");
        assert!(line.contains(&format!("\"rules\":[\"{rule}\"]")), "{line}");
    }
    assert!(!record.contains("id >"), "no message text in the audit log");
}

/// `fleetd --json spawn --host fleet01 ARGS`, run inside the laptop: (succeeded, reply).
fn spawn_from_laptop(topology: &Topology, args: &[&str]) -> (bool, serde_json::Value) {
    let laptop = &topology.laptop;
    let mut command = Command::new(BIN);
    command
        .args(["--config", laptop.dir.join("fleetd.toml").to_str().unwrap()])
        .args(["spawn", "--json", "--host", "fleet01"])
        .args(args)
        .env("HOME", &laptop.dir)
        .env("XDG_RUNTIME_DIR", laptop.dir.join("run"));
    let output = topology.net_laptop.wrap(&command).output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let json: String = text
        .lines()
        .take_while(|l| !l.starts_with("error"))
        .collect();
    let reply = serde_json::from_str(&json).unwrap_or_else(|_| {
        panic!(
            "spawn {args:?}: {text}{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.success(), reply)
}

/// fleet01's audit log so far.
fn audit(host: &Host) -> String {
    std::fs::read_to_string(host.state_dir().join("audit.jsonl")).unwrap_or_default()
}

fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// A spawn request for `worker` as `origin` claims to send it, to fleet01's gateway.
fn spawn_request(
    origin: (&str, &str),
    created_ms: i64,
) -> (fleetd::wire::Meta, fleetd::wire::Payload) {
    use fleetd::wire::{Kind, Meta, Party, Payload, SpawnRequest, VERSION};
    let meta = Meta {
        version: VERSION,
        id: uuid::Uuid::now_v7(),
        kind: Kind::SpawnRequest,
        origin: Party {
            fleet: origin.0.to_owned(),
            host: origin.1.to_owned(),
        },
        dest: Party {
            fleet: FLEET01.to_owned(),
            host: "fleet01".to_owned(),
        },
        key_id: String::new(),
        created_ms,
        expires_ms: created_ms + 60_000,
    };
    let payload = Payload::SpawnRequest(SpawnRequest {
        v: VERSION,
        profile: "worker".to_owned(),
        env: std::collections::BTreeMap::new(),
        cwd: None,
        label: Some("forged".to_owned()),
        by: None,
    });
    (meta, payload)
}

#[test]
fn refusals_reach_the_laptop_launch_nothing_and_are_audited_on_fleet01() {
    let _serial = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut topology = Topology::new();
    worker_policy(&topology.worker);
    let (tmux, _, _logs) = start_pair(&mut topology);
    let panes = tmux.panes().len();

    // Another host of fleet01, with its own credential, does a gateway's job but cannot take
    // fleet01's control queue (where the laptop's spawn requests wait): the broker refuses it.
    let intruder_password = format!("canary-intruder-{}-pw", common::nonce());
    common::host_grants(FLEET01, "intruder", &[], &intruder_password);
    let intruder = format!(
        "amqp://{FLEET01}.intruder:{intruder_password}@{}:5672/%2F{FLEET01}",
        topology.net_worker.gateway
    );
    let sibling = contract_with(
        &topology.net_worker,
        &intruder,
        "/fleet01",
        &["--sibling", "fleet01"],
        &intruder_password,
    );
    assert!(sibling.contains("9/9 checks passed"), "{sibling}");
    assert!(
        sibling.contains("PASS a sibling host's queue and traffic refused"),
        "{sibling}"
    );

    // Refused by fleet01's policy: the reason comes back to the laptop.
    let cases: [(&[&str], &str); 4] = [
        (&["--profile", "maintenance"], "no grant admits origin"),
        (
            &["--profile", "worker", "--env", "LD_PRELOAD=/tmp/evil.so"],
            "LD_PRELOAD",
        ),
        (
            &["--profile", "worker", "--env", "TASK_ID=rm -rf /"],
            "TASK_ID",
        ),
        (&["--profile", "worker", "--cwd", "../../etc"], "cwd"),
    ];
    for (args, reason) in cases {
        let (ok, reply) = spawn_from_laptop(&topology, args);
        assert!(!ok, "{args:?} succeeded: {reply}");
        assert_eq!(reply["outcome"], "refused", "{args:?}: {reply}");
        assert!(
            reply["reasons"].to_string().contains(reason),
            "{args:?}: {reply}"
        );
    }
    assert_eq!(
        audit(&topology.worker).matches("\"spawn.refused\"").count(),
        4
    );

    // Envelopes that fail the transport or signature checks: the test is the attacker, with
    // the laptop's real broker credential (its host user) and, where it matters, its real key.
    let key_text =
        std::fs::read_to_string(topology.laptop.dir.join("credentials/host-key")).unwrap();
    let laptop_key =
        fleetd::wire::HostKey::from_secret(&secrecy::SecretString::from(key_text)).unwrap();
    let stranger = fleetd::wire::HostKey::generate().unwrap().0;
    let mac_uri = fleetd::secret::BrokerUri::parse(&secrecy::SecretString::from(format!(
        "amqp://{MAC}.laptop:{}@127.0.0.1:5672/%2F{MAC}",
        topology.mac_password
    )))
    .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    runtime.block_on(async {
        use common::publish::Publisher;
        use fleetd::broker::{connect, envelope, topology as names};
        let state = std::sync::Arc::new(
            fleetd::state::StateStore::open(scratch.path(), fleetd::state::Limits::default())
                .unwrap(),
        );
        let conn = connect(&mac_uri, Some("/fleet01")).await.unwrap();
        let publisher = Publisher::open(&conn, "/fleet01", &format!("{MAC}.laptop"), state)
            .await
            .unwrap();
        let ingress = names::ingress_exchange(MAC);
        let send = |sealed: fleetd::wire::Sealed| {
            let publisher = &publisher;
            let ingress = ingress.clone();
            async move {
                publisher
                    .send(&ingress, "ctl.fleet01", &sealed)
                    .await
                    .unwrap()
            }
        };
        // Another host than the credential's (one fleet01 does not know, signed by a key it
        // has not pinned): refused on the host user's `user_id` before any key is looked at.
        let (meta, payload) = spawn_request((MAC, "intruder"), now_ms());
        send(fleetd::wire::seal(meta, &payload, &stranger)).await;
        // Claims to be the laptop but signed by another key.
        let (meta, payload) = spawn_request((MAC, "laptop"), now_ms());
        send(fleetd::wire::seal(meta, &payload, &stranger)).await;
        // Expired: the laptop's real signature, ten minutes old.
        let (meta, payload) = spawn_request((MAC, "laptop"), now_ms() - 600_000);
        send(fleetd::wire::seal(meta, &payload, &laptop_key)).await;
        // Claims fleet `fleet01` while the broker attests `mac`.
        let (meta, payload) = spawn_request((FLEET01, "laptop"), now_ms());
        send(fleetd::wire::seal(meta, &payload, &laptop_key)).await;
        // The laptop's genuine signature on a request addressed to another host (as a replay
        // carried from elsewhere would be): refused before anything acts on it.
        let (mut meta, payload) = spawn_request((MAC, "laptop"), now_ms());
        meta.dest.host = "somewhere-else".to_owned();
        send(fleetd::wire::seal(meta, &payload, &laptop_key)).await;
        // Replayed: a genuine request for a profile fleet01 refuses, then the same bytes again.
        let (meta, mut payload) = spawn_request((MAC, "laptop"), now_ms());
        if let fleetd::wire::Payload::SpawnRequest(request) = &mut payload {
            request.profile = "maintenance".to_owned();
        }
        let genuine = fleetd::wire::seal(meta, &payload, &laptop_key);
        send(genuine.clone()).await;
        send(genuine.clone()).await;
        // A forged user_id: the broker itself refuses the publish.
        let channel = conn.create_channel().await.unwrap();
        channel
            .confirm_select(lapin::options::ConfirmSelectOptions::default())
            .await
            .unwrap();
        let (meta, payload) = spawn_request((FLEET01, "fleet01"), now_ms());
        let forged = fleetd::wire::seal(meta, &payload, &laptop_key);
        let published = channel
            .basic_publish(
                ingress.as_str().into(),
                "ctl.fleet01".into(),
                lapin::options::BasicPublishOptions::default(),
                &forged.body,
                envelope::properties(&forged, FLEET01),
            )
            .await;
        let confirmed = match published {
            Ok(confirm) => confirm.await,
            Err(e) => Err(e),
        };
        assert!(
            !matches!(confirmed, Ok(lapin::Confirmation::Ack(_))),
            "the broker accepted a forged user_id"
        );
    });
    // A fleet fleet01 does not admit cannot even open its vhost.
    let evil = format!("evil{}", common::nonce());
    topology.fleets.names.push(evil.clone());
    common::grants(&evil, &[], "canary-evil-pw");
    let evil_uri = fleetd::secret::BrokerUri::parse(&secrecy::SecretString::from(format!(
        "amqp://{evil}:canary-evil-pw@127.0.0.1:5672/%2F{evil}"
    )))
    .unwrap();
    let refused = runtime.block_on(fleetd::broker::connect(&evil_uri, Some("/fleet01")));
    assert!(
        refused.is_err(),
        "a fleet fleet01 does not admit opened its vhost"
    );

    // fleet01 recorded each refusal with its reason, launched nothing, and its log verifies.
    let deadline = Instant::now() + Duration::from_secs(15);
    let record = loop {
        let text = audit(&topology.worker);
        if text.matches("\"message.refused\"").count() >= 6 || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for reason in [
        "user_id `mac.laptop` belongs to host `laptop`; the envelope claims host `intruder`",
        "is not the key pinned for the origin host",
        "the envelope has expired",
        "addressed to `fleet01/somewhere-else`, not to this host",
        "the envelope claims fleet `fleet01`, the broker attests `mac`",
        "seen before (redelivery, republish or replay)",
    ] {
        assert!(
            record.contains(reason),
            "no `{reason}` refusal on record: {record}"
        );
    }
    assert_eq!(record.matches("\"spawn.refused\"").count(), 5, "{record}");
    assert_eq!(
        tmux.panes().len(),
        panes,
        "something was launched on fleet01"
    );
    assert!(!record.contains("\"spawn.started\""), "{record}");
    let mut verify = Command::new(BIN);
    verify
        .args([
            "--config",
            topology.worker.dir.join("fleetd.toml").to_str().unwrap(),
        ])
        .args(["audit", "verify", "--file"])
        .arg(topology.worker.state_dir().join("audit.jsonl"))
        .env("HOME", &topology.worker.dir);
    let verified = topology.net_worker.wrap(&verify).output().unwrap();
    assert!(
        verified.status.success(),
        "audit verify on fleet01: {}{}",
        String::from_utf8_lossy(&verified.stdout),
        String::from_utf8_lossy(&verified.stderr)
    );
}

/// Stops the broker for `down`, in the background; join to have it back.
fn restart_broker(down: Duration) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        common::rabbitmqctl("stop_app");
        std::thread::sleep(down);
        common::start_broker();
    })
}

#[test]
fn faults_two_thousand_messages_survive_broker_restarts_and_a_killed_host_exactly_once_in_order() {
    let _serial = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let _broker_back = common::BrokerUp;
    let mut topology = Topology::new();
    let work = topology.worker.work_dir();
    let received = work.join("received.log");
    // The sink writes every line its pane receives to a file (the pane's scrollback is finite).
    let sink = format!(
        "echo 'agent> ready'; while read -r line; do printf '%s\\n' \"$line\" >> {}; done",
        received.display()
    );
    topology.worker.policy(&[
        (
            "00-profiles.toml",
            format!(
                "[profile.sink]\ndescription = \"Records what it is given.\"\nargv = [\"/bin/sh\", \"-c\", '''{sink}''']\n\
                 roots = [\"{}\"]\nmax_instances = 1\n\n[profile.sink.ready]\npattern = \"^agent> ready\"\ntimeout_secs = 15\n",
                work.display()
            ),
        ),
        (
            "10-grants.toml",
            format!(
                "[[grant]]\nid = \"sink\"\ndescription = \"The fault run.\"\nfleets = [\"{MAC}\"]\nhosts = [\"laptop\"]\nprofiles = [\"sink\"]\n"
            ),
        ),
    ]);
    let (tmux, worker_child, _logs) = start_pair(&mut topology);
    let primary = topology.laptop.open_agent("primary");
    // Spawned for the primary: its messages reach the sink with no `[[message]]` rule.
    let (ok, started) = spawn_from_laptop(&topology, &["--profile", "sink", "--for", &primary]);
    assert!(ok, "{started}");
    let sink_id = started["agent"].as_str().unwrap().to_owned();
    topology.laptop.wait_listed(&sink_id);

    const COUNT: usize = 2000;
    let mut outages = Vec::new();
    let mut ids = Vec::with_capacity(COUNT);
    for seq in 0..COUNT {
        match seq {
            500 | 1500 => outages.push(restart_broker(Duration::from_secs(3))),
            1000 => {
                topology.child(worker_child).kill().unwrap();
                topology.child(worker_child).wait().unwrap();
                let (_, _log) = topology.start(false, &tmux.config_line(), "");
            }
            _ => {}
        }
        let (id, route) = topology
            .laptop
            .send(&sink_id, &primary, &format!("m-{seq:04}"));
        assert_eq!(route, "foreign", "message {seq}");
        ids.push(id);
    }
    for outage in outages {
        outage.join().unwrap();
    }

    let deadline = Instant::now() + Duration::from_secs(240);
    let lines = loop {
        let text = std::fs::read_to_string(&received).unwrap_or_default();
        let count = text.lines().count();
        if count >= COUNT {
            break text;
        }
        if Instant::now() > deadline {
            let missing: String = ids
                .get(count)
                .map_or_else(String::new, |id: &String| id.clone());
            panic!(
                "{count} of {COUNT} messages reached the sink's pane within 240 s; the next one \
                 ({missing}) on the laptop: {}; held on fleet01: {}; last received: {:?}",
                topology.laptop.delivery(&missing),
                topology.worker.held(&sink_id).len(),
                text.lines().last()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    std::thread::sleep(Duration::from_secs(2)); // a duplicate would arrive now
    let text = std::fs::read_to_string(&received).unwrap();
    let seen: Vec<usize> = text
        .lines()
        .map(|l| {
            // One message a line: a pasted line left without its Enter would merge two.
            assert_eq!(
                l.matches("] m-").count(),
                1,
                "not one message on a line: {l:?}"
            );
            let (_, tail) = l
                .rsplit_once("] m-")
                .unwrap_or_else(|| panic!("unexpected line {l:?}"));
            tail.trim().parse().unwrap()
        })
        .collect();
    let expected: Vec<usize> = (0..COUNT).collect();
    assert_eq!(
        seen.len(),
        COUNT,
        "{} lines, first count {}",
        seen.len(),
        lines.lines().count()
    );
    assert!(
        seen == expected,
        "not exactly once in order: first difference at {:?}",
        seen.iter().zip(&expected).position(|(a, b)| a != b)
    );
}

#[test]
fn faults_both_hosts_start_while_the_broker_is_down_and_federate_when_it_is_back() {
    let _serial = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let broker_back = common::BrokerUp;
    let mut topology = Topology::new();
    common::rabbitmqctl("stop_app");
    let (_, laptop_log) = topology.start(true, "", "");
    let (_, worker_log) = topology.start(false, "", "");
    wait(&laptop_log, &["fleetd ready"], Duration::from_secs(20));
    wait(&worker_log, &["fleetd ready"], Duration::from_secs(20));
    for host in [&topology.laptop, &topology.worker] {
        let status = common::eventually(
            "status while the broker is down",
            Duration::from_secs(10),
            || {
                let text = host.cli(&["status"]);
                text.contains("unreachable").then_some(text)
            },
        );
        assert!(status.contains("broker: unreachable since"), "{status}");
        // Local routing works without the broker.
        let notes = host.open_agent("notes");
        let me = host.open_agent("primary");
        let (id, route) = host.send(&notes, &me, "local while the broker is down");
        assert_eq!(route, "local");
        host.wait_delivery(&id, "delivered");
    }
    drop(broker_back); // start_app, and wait for it
    wait_joined(&laptop_log, &worker_log, Duration::from_secs(60));
}

/// Copies of every message published in `vhosts` (RabbitMQ's firehose, `trace_on`), as the
/// broker's operator could read them; the guest administrator consumes them.
struct Firehose {
    bodies: std::sync::Arc<Mutex<Vec<Vec<u8>>>>,
    vhosts: Vec<String>,
    _runtime: tokio::runtime::Runtime,
}

impl Firehose {
    fn start(vhosts: &[&str]) -> Firehose {
        use futures_lite::StreamExt;
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let bodies = std::sync::Arc::new(Mutex::new(Vec::new()));
        for vhost in vhosts {
            for args in [
                vec![
                    "-q",
                    "set_permissions",
                    "-p",
                    vhost,
                    "guest",
                    ".*",
                    ".*",
                    ".*",
                ],
                vec!["-q", "trace_on", "-p", vhost],
            ] {
                let status = Command::new("rabbitmqctl")
                    .args(&args)
                    .output()
                    .unwrap()
                    .status;
                assert!(status.success(), "rabbitmqctl {args:?}");
            }
            let uri = fleetd::secret::BrokerUri::parse(&secrecy::SecretString::from(format!(
                "amqp://guest:guest@127.0.0.1:5672/{}",
                vhost.replace('/', "%2F")
            )))
            .unwrap();
            let sink = std::sync::Arc::clone(&bodies);
            runtime.block_on(async move {
                let conn = fleetd::broker::connect(&uri, None).await.unwrap();
                let channel = conn.create_channel().await.unwrap();
                let queue = channel
                    .queue_declare(
                        "".into(),
                        lapin::options::QueueDeclareOptions {
                            exclusive: true,
                            auto_delete: true,
                            ..Default::default()
                        },
                        lapin::types::FieldTable::default(),
                    )
                    .await
                    .unwrap();
                channel
                    .queue_bind(
                        queue.name().as_str().into(),
                        "amq.rabbitmq.trace".into(),
                        "publish.#".into(),
                        lapin::options::QueueBindOptions::default(),
                        lapin::types::FieldTable::default(),
                    )
                    .await
                    .unwrap();
                let mut consumer = channel
                    .basic_consume(
                        queue.name().as_str().into(),
                        "firehose".into(),
                        lapin::options::BasicConsumeOptions {
                            no_ack: true,
                            ..Default::default()
                        },
                        lapin::types::FieldTable::default(),
                    )
                    .await
                    .unwrap();
                tokio::spawn(async move {
                    let _keep = conn;
                    while let Some(Ok(delivery)) = consumer.next().await {
                        sink.lock().unwrap().push(delivery.data);
                    }
                });
            });
        }
        Firehose {
            bodies,
            vhosts: vhosts.iter().map(|v| (*v).to_owned()).collect(),
            _runtime: runtime,
        }
    }

    fn bodies(&self) -> Vec<Vec<u8>> {
        self.bodies.lock().unwrap().clone()
    }
}

impl Drop for Firehose {
    fn drop(&mut self) {
        for vhost in &self.vhosts {
            let _ = Command::new("rabbitmqctl")
                .args(["-q", "trace_off", "-p", vhost])
                .output();
        }
    }
}

/// Every file under `dir`, as bytes.
fn every_file(dir: &std::path::Path, out: &mut Vec<(std::path::PathBuf, Vec<u8>)>) {
    for entry in std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
    {
        let path = entry.path();
        if path.is_dir() {
            every_file(&path, out);
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.push((path, bytes));
        }
    }
}

#[test]
fn canaries_reach_the_worker_and_no_log_record_message_reply_or_state() {
    let _serial = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut topology = Topology::new();
    let nonce = common::nonce();
    let token = format!("fleetd-canary-token-{nonce:x}-kq");
    // A realistic token (the scrubber leaves low-entropy placeholders alone on purpose).
    let random = format!(
        "{}{}",
        uuid::Uuid::now_v7().simple(),
        uuid::Uuid::now_v7().simple()
    );
    let git_token: String = "ghp_"
        .chars()
        .chain(random.chars().rev().enumerate().map(|(i, c)| {
            if i % 3 == 0 {
                c.to_ascii_uppercase()
            } else {
                c
            }
        }))
        .take(40)
        .collect();
    std::fs::write(topology.worker.dir.join("credentials/worker-token"), &token).unwrap();
    let work = topology.worker.work_dir();
    std::fs::write(
        work.join("remote.txt"),
        format!("https://ci-bot:{git_token}@github.com/org/repo.git"),
    )
    .unwrap();
    // Shows `git remote -v` on every task and answers with it; the token is in its environment.
    let script = format!(
        "echo token-length:${{#TOKEN}}; echo 'agent> ready'; while read -r line; do \
         remote=\"origin $(cat {work}/remote.txt) (fetch)\"; echo \"$remote\"; \
         to=$(printf '%s\\n' \"$line\" | sed -n 's/^\\[fleetd: from [^ ]* agent \\([^],]*\\),.*/\\1/p'); \
         if [ -n \"$to\" ]; then {BIN} send \"$to\" \"$remote\" > /dev/null 2>&1 && echo replied; fi; done",
        work = work.display()
    );
    topology.worker.policy(&[
        (
            "00-profiles.toml",
            format!(
                "[profile.worker]\ndescription = \"Shows its git remote.\"\nargv = [\"/bin/sh\", \"-c\", '''{script}''']\n\
                 roots = [\"{}\"]\nsecrets = {{ TOKEN = \"credential:worker-token\" }}\nmax_instances = 1\n\n\
                 [profile.worker.ready]\npattern = \"^agent> ready\"\ntimeout_secs = 15\n",
                work.display()
            ),
        ),
        (
            "10-grants.toml",
            format!(
                "[[grant]]\nid = \"w\"\ndescription = \"The canary run.\"\nfleets = [\"{MAC}\"]\nhosts = [\"laptop\"]\nprofiles = [\"worker\"]\n"
            ),
        ),
    ]);
    let firehose = Firehose::start(&["/mac", "/fleet01"]);
    let (tmux, [laptop_log, worker_log], mut mcp, spawned, worker) = delegate(&mut topology);
    // The worker works: its environment holds the granted token.
    let shown = tmux.shown();
    assert!(
        shown.contains(&format!("token-length:{}", token.len())),
        "{shown}"
    );
    let pane = tmux
        .panes()
        .into_iter()
        .find(|p| {
            tmux.run(&["capture-pane", "-p", "-t", p])
                .contains("token-length")
        })
        .unwrap();
    let pid = tmux.run(&["display-message", "-p", "-t", &pane, "#{pane_pid}"]);
    let environ = std::fs::read(format!("/proc/{}/environ", pid.trim())).unwrap();
    assert!(
        String::from_utf8_lossy(&environ).contains(&format!("TOKEN={token}")),
        "the worker's environment lacks its token"
    );
    let (sent, _) = mcp.tool(
        "send",
        serde_json::json!({"to": worker, "text": "which remote?"}),
    );
    assert!(sent["id"].is_string(), "{sent}");
    let (pulled, _) = mcp.tool("inbox_pull", serde_json::json!({"wait_secs": 30}));
    let reply = pulled["messages"][0]["body"]["text"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        reply.starts_with("origin ") && reply.contains("[redacted"),
        "{pulled}"
    );
    assert!(
        tmux.shown().contains(&git_token),
        "the worker printed its remote: {}",
        tmux.shown()
    );

    // Everything that left the panes: logs of both daemons, both audit logs, every message body
    // on the broker, the spawn reply, the MCP transcript and every file of the laptop's state.
    std::thread::sleep(Duration::from_secs(2));
    let mut places: Vec<(String, Vec<u8>)> = Vec::new();
    let drain = |log: &Receiver<String>| -> Vec<u8> {
        let mut text = String::new();
        while let Ok(line) = log.try_recv() {
            text.push_str(&line);
            text.push('\n');
        }
        text.into_bytes()
    };
    places.push(("laptop's log".to_owned(), drain(&laptop_log)));
    places.push(("fleet01's log".to_owned(), drain(&worker_log)));
    for host in [&topology.laptop, &topology.worker] {
        places.push((format!("{}'s audit", host.name), audit(host).into_bytes()));
    }
    let bodies = firehose.bodies();
    assert!(
        bodies.len() >= 4,
        "the firehose saw {} messages",
        bodies.len()
    );
    for (i, body) in bodies.into_iter().enumerate() {
        places.push((format!("broker message {i}"), body));
    }
    places.push((
        "the spawn reply".to_owned(),
        spawned.to_string().into_bytes(),
    ));
    places.push(("MCP output".to_owned(), mcp.transcript.clone().into_bytes()));
    let mut files = Vec::new();
    every_file(&topology.laptop.state_dir(), &mut files);
    assert!(!files.is_empty(), "the laptop's state dir is empty");
    for (path, bytes) in files {
        places.push((path.display().to_string(), bytes));
    }
    for (place, bytes) in &places {
        let text = String::from_utf8_lossy(bytes);
        for (what, canary) in [
            ("the worker's token", token.as_str()),
            ("the git remote token", git_token.as_str()),
            ("mac's broker password", topology.mac_password.as_str()),
            (
                "fleet01's broker password",
                topology.fleet01_password.as_str(),
            ),
        ] {
            assert!(!text.contains(canary), "{what} reached {place}");
        }
    }
}
