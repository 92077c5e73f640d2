//! fleetd and its agents under separate identities, with real users (created here): fleetd
//! runs as its own user, which alone owns its credentials, host key, state database, audit log
//! and runtime directory; agents run as the login user in that user's own tmux server, which
//! fleetd reaches through a `-S` socket and tmux's `server-access`. From inside a spawned pane
//! (as the login user) fleetd's files are out of reach (EACCES) and the local API gives only
//! what the agent's token allows; the agent still answers its primary with a bare `fleetd send`.
//! A third user can neither open windows on the login user's server nor use the API. `fleetd
//! mcp` with the pane's variables, as the login user, sends as the worker.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code fails loudly"
)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::mcp::Session;
use common::{BIN, eventually, held_with_text, raw_request, spawn_logged, terminate, wait_for};
use serde_json::{Value, json};

/// Two users, each with its own group, removed when dropped.
struct Users {
    names: Vec<String>,
}

impl Users {
    fn create(names: &[&str]) -> Users {
        let users = Users {
            names: names.iter().map(|n| (*n).to_owned()).collect(),
        };
        for name in names {
            let ok = Command::new("useradd")
                .args(["-M", "-U", "-s", "/usr/sbin/nologin", name])
                .status()
                .is_ok_and(|s| s.success());
            assert!(
                ok,
                "useradd {name} failed (needs root and the passwd package)"
            );
        }
        users
    }
}

impl Drop for Users {
    fn drop(&mut self) {
        for name in &self.names {
            let _ = Command::new("pkill").args(["-KILL", "-u", name]).status();
            let _ = Command::new("userdel").arg(name).status();
        }
    }
}

fn id_of(user: &str, flag: &str) -> u32 {
    let out = Command::new("id").args([flag, user]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn own(path: &Path, uid: u32, gid: u32, mode: u32) {
    std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// What the agent does when a message arrives: tries fleetd's files and the operator's API from
/// inside its pane, writes what happened to `probe.txt`, then answers the sender with a bare
/// `fleetd send`.
const PROBE: &str = r#"echo 'agent> ready'; while read -r line; do from=$(printf '%s\n' "$line" | sed -n 's/.* agent \([0-9a-f-]*\), msg .*/\1/p'); { for f in "$FLEETD_T_CRED/host-key" "$FLEETD_T_CRED/broker-uri" "$FLEETD_T_STATE/state.redb" "$FLEETD_T_STATE/audit.jsonl"; do echo "read $f: $(cat "$f" 2>&1 >/dev/null | head -c 200)"; done; echo "append: $( (echo x >> "$FLEETD_T_STATE/audit.jsonl") 2>&1 | head -c 200)"; echo "spawn: $(fleetd spawn --profile worker 2>&1 | head -c 300)"; echo "send-as: $(fleetd send "$from" forged --from "$from" 2>&1 | head -c 300)"; echo "pull-other: $(fleetd inbox pull --agent "$from" 2>&1 | head -c 300)"; echo "bare: $(env -u FLEETD_AGENT_TOKEN fleetd roster 2>&1 | head -c 300)"; } > "$FLEETD_T_OUT/probe.txt" 2>&1; fleetd send "$from" "probed" > "$FLEETD_T_OUT/reply.txt" 2>&1; done"#;

#[test]
fn agents_under_the_login_user_cannot_reach_fleetds_files_or_authority() {
    assert!(
        rustix::process::geteuid().is_root(),
        "this test creates two users and acts as each: it needs root"
    );
    let nonce = common::nonce() % 1_000_000_000;
    let (fleetd_user, agent_user) = (format!("fd{nonce}"), format!("ag{nonce}"));
    let _users = Users::create(&[&fleetd_user, &agent_user]);
    let (fu, fg) = (id_of(&fleetd_user, "-u"), id_of(&fleetd_user, "-g"));
    let (au, ag) = (id_of(&agent_user, "-u"), id_of(&agent_user, "-g"));

    let root = tempfile::tempdir().unwrap();
    let top = root.path();
    std::fs::set_permissions(top, std::fs::Permissions::from_mode(0o755)).unwrap();
    // fleetd's own: config, policy, credentials, state, runtime — its user's, 0700.
    let home = top.join("fleetd");
    let (cred, state, policy) = (
        home.join("credentials"),
        home.join("state"),
        home.join("policy"),
    );
    for dir in [&home, &cred, &state, &policy] {
        std::fs::create_dir_all(dir).unwrap();
    }
    // The runtime directory is fleetd's too; with `socket_access = "all-users"` fleetd makes it
    // traversable (0711) and the socket connectable: the kernel names every peer after.
    let run = top.join("run");
    // The login user's: its tmux socket directory, its work tree, where the probe writes.
    let (tmux_dir, work, out) = (top.join("tmux"), top.join("work"), top.join("out"));
    for dir in [&tmux_dir, &work, &out] {
        std::fs::create_dir_all(dir).unwrap();
        own(dir, au, ag, 0o755);
    }
    let bin_dir = top.join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let bin = bin_dir.join("fleetd");
    std::fs::copy(BIN, &bin).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = tmux_dir.join("tmux");

    std::fs::write(
        policy.join("00-worker.toml"),
        format!(
            "[profile.worker]\ndescription = \"Probes what it can reach, then answers.\"\n\
             argv = [\"/bin/sh\", \"-c\", '''{PROBE}''']\nroots = [\"{work}\"]\nmax_instances = 2\n\
             env = {{ FLEETD_T_CRED = \"{cred}\", FLEETD_T_STATE = \"{state}\", FLEETD_T_OUT = \"{out}\" }}\n\
             [profile.worker.ready]\npattern = \"^agent> ready\"\ntimeout_secs = 15\n\n\
             [[grant]]\nid = \"local\"\ndescription = \"The operator runs workers.\"\n\
             fleets = [\"local\"]\nprofiles = [\"worker\"]\n",
            work = work.display(),
            cred = cred.display(),
            state = state.display(),
            out = out.display(),
        ),
    )
    .unwrap();
    let config = home.join("fleetd.toml");
    std::fs::write(
        &config,
        format!(
            "host = \"h1\"\ntmux_socket = \"{}\"\n[paths]\npolicy = \"{}\"\nstate = \"{}\"\nruntime = \"{}\"\n\
             [log]\nformat = \"json\"\n[api]\nsocket_access = \"all-users\"\n",
            socket.display(),
            policy.display(),
            state.display(),
            run.display()
        ),
    )
    .unwrap();
    std::fs::write(
        cred.join("broker-uri"),
        "amqp://f:canary-password@127.0.0.1/%2Ff",
    )
    .unwrap();
    let keyed = Command::new(&bin)
        .args(["key", "init", "--credential-file"])
        .arg(cred.join("host-key"))
        .env("HOME", &home)
        .output()
        .unwrap();
    assert!(keyed.status.success(), "{keyed:?}");
    for path in walk(&home) {
        let mode = if path.is_dir() { 0o700 } else { 0o600 };
        own(&path, fu, fg, mode);
    }
    std::fs::create_dir_all(&run).unwrap();
    own(&run, fu, fg, 0o700);

    // The login user's tmux server (its unit in production), opened to fleetd's user.
    let tmux = |args: &[&str]| {
        let mut command = as_user(au, ag, "tmux");
        command
            .arg("-S")
            .arg(&socket)
            .args(args)
            .env_clear()
            .env("HOME", &out)
            // The login user's shell (useradd gave it nologin here).
            .env("SHELL", "/bin/sh")
            .env("PATH", format!("{}:/usr/bin:/bin", bin_dir.display()));
        command.output().unwrap()
    };
    assert!(
        tmux(&["new-session", "-d", "-s", "keep", "sleep 600"])
            .status
            .success()
    );
    let access = tmux(&["server-access", "-a", &fleetd_user]);
    assert!(access.status.success(), "server-access: {access:?}");
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    // The socket is connectable by anyone; tmux's own list admits only its owner and fleetd's.
    let mut stranger = as_user(65534, 65534, "tmux");
    stranger
        .arg("-S")
        .arg(&socket)
        .args(["new-window", "-d", "--", "sleep", "30"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    let windows = |tmux: &dyn Fn(&[&str]) -> std::process::Output| {
        String::from_utf8_lossy(&tmux(&["list-windows", "-a"]).stdout)
            .lines()
            .count()
    };
    let before = windows(&tmux);
    let refused = stranger.output().unwrap();
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("access not allowed"),
        "{refused:?}"
    );
    assert_eq!(windows(&tmux), before, "another user opened a window");

    // fleetd under its own user.
    let mut run_cmd = as_user(fu, fg, bin.to_str().unwrap());
    run_cmd
        .arg("--config")
        .arg(&config)
        .arg("run")
        .env_clear()
        .env("HOME", &home)
        // tmux gives a window the PATH of the client that opened it: fleetd's.
        .env("PATH", format!("{}:/usr/bin:/bin", bin_dir.display()))
        .env("CREDENTIALS_DIRECTORY", &cred);
    let (daemon, log) = spawn_logged(run_cmd);
    let mut seen = String::new();
    wait_for(&log, &mut seen, &["fleetd ready"], Duration::from_secs(20));

    // The operator (root here).
    let operator = |args: &[&str]| {
        let out = Command::new(&bin)
            .arg("--config")
            .arg(&config)
            .args(args)
            .env_remove("FLEETD_AGENT_TOKEN")
            .env_remove("FLEETD_SOCKET")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "fleetd {args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text))
    };
    let primary = operator(&["agent", "open", "primary", "--json"])["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let started = operator(&["spawn", "--profile", "worker", "--label", "w1", "--json"]);
    assert_eq!(started["outcome"], "started", "{started}");
    let worker = started["agent"].as_str().unwrap().to_owned();
    // The pane's process is the login user's.
    let pane = String::from_utf8_lossy(
        &tmux(&[
            "list-panes",
            "-s",
            "-t",
            "fleetd",
            "-F",
            "#{pane_id} #{pane_pid}",
        ])
        .stdout,
    )
    .into_owned();
    let (pane_id, pane_pid) = pane.trim().split_once(' ').unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pane_pid}/status")).unwrap();
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(&au.to_string())),
        "the agent runs as the login user: {status}"
    );

    operator(&["send", &worker, "probe", "--from", &primary]);
    let probe = eventually("the probe's results", Duration::from_secs(20), || {
        std::fs::read_to_string(out.join("probe.txt"))
            .ok()
            .filter(|t| t.contains("bare:"))
    });
    for file in ["host-key", "broker-uri", "state.redb", "audit.jsonl"] {
        let line = probe
            .lines()
            .find(|l| l.contains(&format!("/{file}:")))
            .unwrap();
        assert!(
            line.contains("Permission denied"),
            "reading {file}: {probe}"
        );
    }
    let line = |key: &str| {
        probe
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(line("append:").contains("Permission denied"), "{probe}");
    assert!(line("spawn:").contains("refused"), "{probe}");
    assert!(
        line("send-as:").contains("an agent sends as itself"),
        "{probe}"
    );
    assert!(
        line("pull-other:").contains("only its own held messages"),
        "{probe}"
    );
    assert!(
        line("bare:").contains(&format!("uid {au} is not the operator")),
        "{probe}"
    );
    assert!(!probe.contains("canary-password"), "{probe}");

    // The worker's bare `fleetd send` reached the primary, sent as the worker.
    let reply = eventually("the worker's reply", Duration::from_secs(20), || {
        let held = operator(&["inbox", "pull", "--agent", &primary, "--json"]);
        held_with_text(&held, "probed")
    });
    assert_eq!(reply["body"]["from"], worker.as_str(), "{reply}");
    let forged = operator(&["inbox", "pull", "--agent", &primary, "--json"]).to_string();
    assert!(
        !forged.contains("\"forged\""),
        "nothing was sent as the primary: {forged}"
    );

    // `fleetd mcp` as the login user with the pane's three variables — what the agent starts
    // in its pane — is the worker's MCP server: its send arrives as the worker.
    let environ = std::fs::read(format!("/proc/{pane_pid}/environ")).unwrap();
    let pane_var = |name: &str| {
        String::from_utf8_lossy(&environ)
            .split('\0')
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")).map(str::to_owned))
            .unwrap()
    };
    let token = pane_var("FLEETD_AGENT_TOKEN");
    let mut mcp = as_user(au, ag, bin.to_str().unwrap());
    mcp.arg("mcp")
        .env_clear()
        .env("HOME", &out)
        .env("PATH", "/usr/bin:/bin");
    for name in ["FLEETD_AGENT_ID", "FLEETD_SOCKET", "FLEETD_AGENT_TOKEN"] {
        mcp.env(name, pane_var(name));
    }
    let mut session = Session::start_with(mcp);
    session.initialize();
    let (sent, failed) = session.tool("send", json!({"to": primary, "text": "via mcp"}));
    assert!(!failed, "{sent}");
    let via_mcp = eventually("the MCP reply", Duration::from_secs(20), || {
        let held = operator(&["inbox", "pull", "--agent", &primary, "--json"]);
        held_with_text(&held, "via mcp")
    });
    assert_eq!(via_mcp["body"]["from"], worker.as_str(), "{via_mcp}");
    drop(session);

    // The agent exits; its token is refused from then on.
    tmux(&["send-keys", "-t", pane_id, "C-d"]);
    eventually("the agent's exit", Duration::from_secs(10), || {
        let dead = tmux(&["display-message", "-p", "-t", pane_id, "#{pane_dead}"]);
        (String::from_utf8_lossy(&dead.stdout).trim() == "1").then_some(())
    });
    let refused = raw_request(
        &run.join("fleetd.sock"),
        &json!({"op": "roster", "token": token}),
    );
    assert!(
        refused["error"]
            .as_str()
            .unwrap_or_default()
            .contains("revoked"),
        "{refused}"
    );

    terminate(&daemon);
    let audit = std::fs::read_to_string(state.join("audit.jsonl")).unwrap();
    let refusals = audit
        .lines()
        .filter(|l| l.contains("\"api.refused\"") && l.contains(&format!("\"uid\":{au}")))
        .count();
    assert!(
        refusals >= 3,
        "each refusal from the pane is audited: {audit}"
    );
    assert!(
        audit.contains("may not spawn")
            && audit.contains(&format!("\"requested_by\":\"{worker}\"")),
        "the agent's spawn refused and audited: {audit}"
    );
    assert!(
        !audit.contains(&token[13..]),
        "the token is in no audit record"
    );
    drop(log);
}

/// `program` run as `uid`:`gid` with no supplementary groups (`setpriv`, util-linux).
fn as_user(uid: u32, gid: u32, program: &str) -> Command {
    let mut command = Command::new("setpriv");
    command
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups")
        .arg("--")
        .arg(program);
    command
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut all = vec![dir.to_path_buf()];
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            all.extend(walk(&path));
        } else {
            all.push(path);
        }
    }
    all
}
