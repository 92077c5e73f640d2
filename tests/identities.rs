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

use std::time::Duration;

use common::identities::{Host, as_user};
use common::mcp::Session;
use common::{eventually, held_with_text};
use serde_json::json;

/// What the agent does when a message arrives: tries fleetd's files and the operator's API from
/// inside its pane, writes what happened to `probe.txt`, then answers the sender with a bare
/// `fleetd send`.
const PROBE: &str = r#"echo 'agent> ready'; while read -r line; do from=$(printf '%s\n' "$line" | sed -n 's/.* agent \([0-9a-f-]*\), msg .*/\1/p'); { for f in "$FLEETD_T_CRED/host-key" "$FLEETD_T_CRED/broker-uri" "$FLEETD_T_STATE/state.redb" "$FLEETD_T_STATE/audit.jsonl"; do echo "read $f: $(cat "$f" 2>&1 >/dev/null | head -c 200)"; done; echo "append: $( (echo x >> "$FLEETD_T_STATE/audit.jsonl") 2>&1 | head -c 200)"; echo "spawn: $(fleetd spawn --profile worker 2>&1 | head -c 300)"; echo "send-as: $(fleetd send "$from" forged --from "$from" 2>&1 | head -c 300)"; echo "pull-other: $(fleetd inbox pull --agent "$from" 2>&1 | head -c 300)"; echo "bare: $(env -u FLEETD_AGENT_TOKEN fleetd roster 2>&1 | head -c 300)"; } > "$FLEETD_T_OUT/probe.txt" 2>&1; fleetd send "$from" "probed" > "$FLEETD_T_OUT/reply.txt" 2>&1; done"#;

#[test]
fn agents_under_the_login_user_cannot_reach_fleetds_files_or_authority() {
    let mut host = Host::new(
        |paths| {
            format!(
                "[profile.worker]\ndescription = \"Probes what it can reach, then answers.\"\n\
                 argv = [\"/bin/sh\", \"-c\", '''{PROBE}''']\nroots = [\"{work}\"]\nmax_instances = 2\n\
                 env = {{ FLEETD_T_CRED = \"{cred}\", FLEETD_T_STATE = \"{state}\", FLEETD_T_OUT = \"{out}\" }}\n\
                 [profile.worker.ready]\npattern = \"^agent> ready\"\ntimeout_secs = 15\n\
                 [profile.worker.sandbox]\nmode = \"off\"\n\n\
                 [[grant]]\nid = \"local\"\ndescription = \"The operator runs workers.\"\n\
                 fleets = [\"local\"]\nprofiles = [\"worker\"]\n",
                work = paths.work.display(),
                cred = paths.cred.display(),
                state = paths.state.display(),
                out = paths.out.display(),
            )
        },
        "",
    );
    let (au, ag) = (host.au, host.ag);
    let (cred, state, out, socket) = (
        host.paths.cred.clone(),
        host.paths.state.clone(),
        host.paths.out.clone(),
        host.paths.socket.clone(),
    );
    let bin = host.paths.bin.clone();
    let tmux = |args: &[&str]| host.tmux(args);

    // The socket is connectable by anyone; tmux's own list admits only its owner and fleetd's.
    let mut stranger = as_user(65534, 65534, "tmux");
    stranger
        .arg("-S")
        .arg(&socket)
        .args(["new-window", "-d", "--", "sleep", "30"])
        .env_clear()
        .env("PATH", "/usr/bin:/bin");
    let windows = || {
        String::from_utf8_lossy(&tmux(&["list-windows", "-a"]).stdout)
            .lines()
            .count()
    };
    let before = windows();
    let refused = stranger.output().unwrap();
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("access not allowed"),
        "{refused:?}"
    );
    assert_eq!(windows(), before, "another user opened a window");

    // fleetd under its own user.
    host.start();
    let tmux = |args: &[&str]| host.tmux(args);

    // The operator (root here).
    let operator = |args: &[&str]| host.operator(args);
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

    // The agents own the server. A hook runs in the queue of the client whose command fired
    // it: hooks make that client read each of fleetd's files into a buffer (credentials, host
    // key, state, audit log, config), write a buffer into fleetd's state directory and over
    // its audit log. fleetd's token sweep lists panes every 2 s, and its client opens none of
    // those paths: each is refused, logged and audited; the failing hooks make the sweep's
    // call fail, which revokes nothing.
    let config = host.paths.config.clone();
    let targets = [
        ("host-key", cred.join("host-key")),
        ("broker-uri", cred.join("broker-uri")),
        ("state.redb", state.join("state.redb")),
        ("audit.jsonl", state.join("audit.jsonl")),
        ("fleetd.toml", config.clone()),
    ];
    let before: Vec<Vec<u8>> = targets
        .iter()
        .map(|(_, path)| std::fs::read(path).unwrap())
        .collect();
    let planted = state.join("planted");
    tmux(&["set-buffer", "-b", "bait", "written by a hook"]);
    let mut hooks: Vec<String> = targets
        .iter()
        .map(|(name, path)| format!("load-buffer -b stolen-{name} {}", path.display()))
        .collect();
    hooks.push(format!("save-buffer -b bait {}", planted.display()));
    hooks.push(format!(
        "save-buffer -b bait {}",
        state.join("audit.jsonl").display()
    ));
    for (n, hook) in hooks.iter().enumerate() {
        let set = tmux(&["set-hook", "-g", &format!("after-list-panes[{n}]"), hook]);
        assert!(set.status.success(), "set-hook: {set:?}");
    }
    let audited = eventually(
        "the refused opens in the audit log",
        Duration::from_secs(15),
        || {
            let audit = std::fs::read_to_string(state.join("audit.jsonl")).ok()?;
            let refused: Vec<&str> = audit
                .lines()
                .filter(|l| l.contains("\"multiplexer.refused\""))
                .collect();
            let read = |name: &str| {
                refused
                    .iter()
                    .any(|l| l.contains(name) && l.contains("for reading"))
            };
            let written = |name: &str| {
                refused
                    .iter()
                    .any(|l| l.contains(name) && l.contains("for writing"))
            };
            (targets.iter().all(|(name, _)| read(name))
                && written("planted")
                && written("audit.jsonl"))
            .then(|| refused.join("\n"))
        },
    );
    assert!(!audited.is_empty());
    for ((name, path), bytes) in targets.iter().zip(&before) {
        let stolen = tmux(&["show-buffer", "-b", &format!("stolen-{name}")]);
        assert!(
            stolen.stdout.is_empty(),
            "a buffer holds {name}: {stolen:?}"
        );
        let now = std::fs::read(path).unwrap();
        if *name == "audit.jsonl" {
            // Only appended to (by fleetd): never replaced.
            assert!(now.starts_with(bytes), "the audit log was rewritten");
        } else if *name != "state.redb" {
            assert_eq!(&now, bytes, "{name} changed");
        }
    }
    assert!(
        !planted.exists(),
        "a hook wrote into fleetd's state directory"
    );
    let verified = host.operator_raw(&[
        "audit",
        "verify",
        "--file",
        state.join("audit.jsonl").to_str().unwrap(),
    ]);
    assert!(verified.status.success(), "{verified:?}");
    host.wait_log(
        &["asked fleetd for something it never does"],
        Duration::from_secs(5),
    );
    // While the server fails fleetd's calls, the sweep says so (logged and audited once) and
    // goes on; a token is bound to its agent's process, which the kernel shows alive: it keeps
    // serving, nothing is revoked.
    host.wait_log(&["the multiplexer does not answer"], Duration::from_secs(5));
    let roster = || host.request(&json!({"op": "roster", "token": token}));
    let served = roster();
    assert!(served.get("error").is_none(), "{served}");
    tmux(&["set-hook", "-gu", "after-list-panes"]);
    host.wait_log(&["the multiplexer answers again"], Duration::from_secs(5));
    let audit = eventually(
        "failing, then recovered, audited",
        Duration::from_secs(5),
        || {
            let audit = host.audit();
            (audit.contains("\"multiplexer.failing\"")
                && audit.contains("\"multiplexer.recovered\""))
            .then_some(audit)
        },
    );
    assert!(!audit.contains("\"agent.revoked\""), "{audit}");

    // The agent exits; its token is refused from then on.
    tmux(&["send-keys", "-t", pane_id, "C-d"]);
    eventually("the agent's exit", Duration::from_secs(10), || {
        let dead = tmux(&["display-message", "-p", "-t", pane_id, "#{pane_dead}"]);
        (String::from_utf8_lossy(&dead.stdout).trim() == "1").then_some(())
    });
    host.assert_revoked(&token);

    // After every attack: the canary credential and the host key's seed are in no tmux buffer,
    // no pane, no line fleetd logged, and no file outside fleetd's own directories.
    let seed = String::from_utf8(before[0].clone()).unwrap();
    let seed = seed.trim().trim_start_matches("ed25519-seed:").to_owned();
    let canaries = ["canary-password", seed.as_str()];
    let mut exposed = host.tmux_text(&["list-buffers", "-F", "#{buffer_name}"]);
    for buffer in exposed.clone().lines() {
        exposed.push_str(&host.tmux_text(&["show-buffer", "-b", buffer]));
    }
    for pane in host
        .tmux_text(&["list-panes", "-a", "-F", "#{pane_id}"])
        .lines()
    {
        exposed.push_str(&host.tmux_text(&["capture-pane", "-p", "-t", pane, "-S", "-2000"]));
    }
    host.stop();
    exposed.push_str(&host.seen.borrow());
    if let Some(log) = &host.log {
        exposed.extend(log.try_iter());
    }
    for dir in [&host.paths.out, &host.paths.work, &host.paths.tmux_dir] {
        for file in common::identities::walk(dir)
            .into_iter()
            .filter(|p| p.is_file())
        {
            exposed.push_str(&String::from_utf8_lossy(
                &std::fs::read(&file).unwrap_or_default(),
            ));
        }
    }
    for canary in canaries {
        assert!(
            !exposed.contains(canary),
            "a canary left fleetd's directories"
        );
    }
    let audit = host.audit();
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
}
