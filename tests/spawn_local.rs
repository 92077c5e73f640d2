//! The spawn pipeline end to end on this host: a running daemon, a real private tmux server
//! (started here, as the operator's unit would), a policy directory and a canary secret in a
//! credential file. `fleetd spawn` launches the granted profile, the readiness gate waits for its
//! prompt, the agent is registered and in the roster, and the secret reaches the pane's
//! environment only; an ungranted profile, a variable the grant does not allow and a startup
//! dialog are each refused or failed with the reason, and audited. A message sent to the agent is
//! typed into its pane exactly once (escape sequences removed, a secret redacted), then reported
//! delivered.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    reason = "test code fails loudly"
)]

mod common;

use std::time::Duration;

use common::{Host, TmuxServer, one_fleet, wait_for};

fn policy(host: &Host, fleet: &str) {
    let work = host.work_dir();
    let agent = "echo token-length:${#TOKEN}; echo envtok-length:${#ENVTOK}; echo mode:$MODE; echo 'agent> ready'; \
                 while read -r line; do echo \"got:[$line]\"; \
                 case \"$line\" in *please-ask*) echo 'Allow this command? (y/n)';; esac; done";
    let dialog = "echo 'Do you trust the files in this folder? (y/n)'; sleep 30";
    host.policy(&[
        (
            "00-profiles.toml",
            format!(
                r#"[profile.worker]
description = "A scripted agent with a prompt."
argv = ["/bin/sh", "-c", '''{agent}''']
roots = ["{work}"]
secrets = {{ TOKEN = "credential:worker-token", ENVTOK = "env:FLEETD_ENV_TOKEN" }}
max_instances = 2

[profile.worker.ready]
pattern = "^agent> ready"
timeout_secs = 15

[profile.asks]
description = "An agent that stops at a startup dialog."
argv = ["/bin/sh", "-c", '''{dialog}''']
roots = ["{work}"]
max_instances = 1

[profile.asks.ready]
pattern = "^agent> ready"
timeout_secs = 15

[profile.plain]
description = "An agent with no secret."
argv = ["/bin/sh", "-c", "echo 'agent> ready'; exec sleep 600"]
roots = ["{work}"]
max_instances = 1

[profile.plain.ready]
pattern = "^agent> ready"
timeout_secs = 15

[profile.maintenance]
description = "Not granted to anyone."
argv = ["/bin/sh"]
roots = ["{work}"]
max_instances = 1
"#,
                work = work.display()
            ),
        ),
        (
            "10-grants.toml",
            format!(
                r#"[[grant]]
id = "local-workers"
description = "This host's own primary."
fleets = ["{fleet}"]
hosts = ["{host}"]
profiles = ["worker", "asks", "plain"]

[grant.env.MODE]
pattern = "fast|slow"
max_len = 4
"#,
                host = host.name
            ),
        ),
    ]);
}

#[test]
fn a_granted_profile_starts_ready_with_its_secret_and_refusals_carry_reasons() {
    let (nonce, fleet, password, mut cleanup) = one_fleet("sp");
    let root = tempfile::tempdir().unwrap();
    let host = Host::new(root.path(), "h1");
    let canary = format!("canary-token-{nonce:x}-zq");
    std::fs::write(host.dir.join("credentials/worker-token"), &canary).unwrap();
    policy(&host, &fleet);
    let tmux = TmuxServer::start(nonce);
    let env_canary = format!("env-canary-{nonce:x}-qq");
    let start = || {
        host.start_with_env(
            &fleet,
            &password,
            &[],
            &[],
            (
                &tmux.config_line(),
                "[secrets.env-token]\nenv = \"FLEETD_ENV_TOKEN\"\n",
            ),
            &[("FLEETD_ENV_TOKEN", &env_canary)],
        )
    };
    let (child, log) = start();
    cleanup.children.push(child);
    let mut seen = String::new();
    wait_for(&log, &mut seen, &["fleetd ready"], Duration::from_secs(20));

    let (ok, reply) = host.spawn_cli(&[
        "--profile",
        "worker",
        "--label",
        "w1",
        "--env",
        "MODE=fast",
        "--json",
    ]);
    assert!(ok, "{reply}");
    let reply: serde_json::Value = serde_json::from_str(&reply).unwrap();
    assert_eq!(reply["outcome"], "started", "{reply}");
    let agent = reply["agent"].as_str().unwrap().to_owned();
    let shown = tmux.shown();
    assert!(
        shown.contains(&format!("token-length:{}", canary.len()))
            && shown.contains(&format!("envtok-length:{}", env_canary.len()))
            && shown.contains("mode:fast"),
        "the secret and the allowed variable reach the pane: {shown}"
    );
    let roster = host.api(&serde_json::json!({"op": "roster"})).to_string();
    assert!(roster.contains(&agent) && roster.contains("w1"), "{roster}");

    // A second profile, with no secret, spawned after the first: its pane has none of the
    // first one's variables, and no tmux environment (global or any session's) holds one.
    let (ok, plain) = host.spawn_cli(&["--profile", "plain", "--json"]);
    assert!(ok, "{plain}");
    let plain: serde_json::Value = serde_json::from_str(&plain).unwrap();
    let plain_id = plain["agent"].as_str().unwrap();
    let plain_env = tmux.agent_environ(plain_id);
    let names: Vec<&str> = plain_env
        .split('\0')
        .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
        .collect();
    for name in ["TOKEN", "ENVTOK", "MODE"] {
        assert!(!names.contains(&name), "the second pane got `{name}`");
    }
    assert!(
        !plain_env.contains(&canary) && !plain_env.contains(&env_canary),
        "the second pane holds the first one's secret"
    );
    let environments = tmux.environments();
    for leaked in [
        canary.as_str(),
        env_canary.as_str(),
        "TOKEN",
        "MODE=",
        "FLEETD_",
    ] {
        assert!(
            !environments.contains(leaked),
            "tmux's environment holds `{leaked}`: {environments}"
        );
    }

    // A message for the agent is typed into its pane once — escape sequences taken out, a
    // registered secret redacted — and only then reported delivered.
    let primary = host.open_agent("primary");
    let (id, route) = host.send(
        &agent,
        &primary,
        &format!("hello \u{1b}[31mthere\u{1b}[0m, the key is {canary}"),
    );
    assert_eq!(route, "local");
    host.wait_delivery(&id, "delivered");
    let shown = tmux.shown();
    let typed: Vec<&str> = shown.lines().filter(|l| l.contains("got:[")).collect();
    assert_eq!(typed.len(), 1, "typed exactly once: {shown}");
    assert!(
        typed[0].contains(&format!(
            "[fleetd: from {fleet}/h1 agent {primary}, msg {id}] hello there, the key is"
        )),
        "{shown}"
    );
    assert!(!shown.contains(&canary), "the secret was typed: {shown}");
    assert!(host.held(&agent).is_empty(), "nothing left held");

    // The broker password fleetd holds, typed in other encodings, is not typed either.
    let hex: String = password.bytes().map(|b| format!("{b:02x}")).collect();
    let upper = hex.to_uppercase();
    let (encoded, _) = host.send(&agent, &primary, &format!("as hex {hex} and {upper} ok"));
    host.wait_delivery(&encoded, "delivered");
    let shown = tmux.shown();
    assert!(
        shown.contains("as hex [redacted:held-secret] and [redacted:held-secret] ok"),
        "{shown}"
    );
    assert!(!shown.contains(&hex) && !shown.contains(&upper), "{shown}");

    // The agent stops at a permission prompt: the next message is not typed; it stays held.
    let (asking, _) = host.send(&agent, &primary, "please-ask");
    host.wait_delivery(&asking, "delivered");
    let (waiting, _) = host.send(&agent, &primary, "second task");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(host.delivery(&waiting)["state"], "queued");
    assert_eq!(host.held(&agent).len(), 1, "held while the prompt waits");
    assert!(!tmux.shown().contains("second task"));

    let (ok, refused) = host.spawn_cli(&["--profile", "maintenance"]);
    assert!(!ok, "{refused}");
    assert!(
        refused.contains("refused: no grant admits origin") && refused.contains("maintenance"),
        "{refused}"
    );
    let (ok, refused) = host.spawn_cli(&["--profile", "worker", "--env", "MODE=rm;x"]);
    assert!(
        !ok && refused.contains("refused") && refused.contains("MODE"),
        "{refused}"
    );
    let (ok, refused) = host.spawn_cli(&["--profile", "worker", "--env", "LD_PRELOAD=/tmp/x.so"]);
    assert!(!ok && refused.contains("refused"), "{refused}");
    let (ok, failed) = host.spawn_cli(&["--profile", "asks"]);
    assert!(
        !ok && failed.contains("failed") && failed.contains("startup dialog"),
        "{failed}"
    );

    // A request variable the grant does not allow never reaches a pane: nothing is launched.
    let panes = tmux.panes().len();
    let (ok, refused) = host.spawn_cli(&[
        "--profile",
        "worker",
        "--env",
        &format!("EXTRA={canary}-env"),
    ]);
    assert!(!ok && refused.contains("refused"), "{refused}");
    assert_eq!(tmux.panes().len(), panes);
    assert!(!tmux.shown().contains(&format!("{canary}-env")));

    // The granted secret reaches no MCP output: a message carrying it arrives redacted.
    let (_, _) = host.send(&primary, &agent, &format!("I saw {canary} in my env"));
    let mut mcp = common::mcp::Session::start(&host);
    mcp.initialize();
    let (pulled, _) = mcp.tool("inbox_pull", serde_json::json!({"wait_secs": 5}));
    assert!(pulled.to_string().contains("I saw [redacted"), "{pulled}");
    assert!(
        !mcp.transcript.contains(&canary),
        "the secret reached MCP output"
    );

    let audit = std::fs::read_to_string(host.state_dir().join("audit.jsonl")).unwrap();
    for event in [
        "spawn.started",
        "spawn.refused",
        "spawn.failed",
        "message.injected",
        "message.blocked",
    ] {
        assert!(audit.contains(event), "{event} on record: {audit}");
    }
    while let Ok(line) = log.try_recv() {
        seen.push_str(&line);
    }
    for (place, text) in [
        ("log", &seen),
        ("audit", &audit),
        ("reply", &reply.to_string()),
    ] {
        assert!(!text.contains(&canary), "the secret reached the {place}");
        assert!(
            !text.contains(&env_canary),
            "the env secret reached the {place}"
        );
    }
    host.cli(&[
        "audit",
        "verify",
        "--file",
        host.state_dir().join("audit.jsonl").to_str().unwrap(),
    ]);

    // A crash between typing and recording: the daemon stops while "second task" is held, the
    // pane shows it typed (as the crashed daemon would have left it), and the next start finds
    // the message's marker in the pane and records it delivered instead of typing it again.
    common::terminate(&cleanup.children[0]);
    let _ = cleanup.children[0].wait();
    let pane = tmux
        .panes()
        .into_iter()
        .find(|p| {
            tmux.run(&["capture-pane", "-p", "-t", p])
                .contains("please-ask")
        })
        .unwrap();
    // The answered prompt scrolls out of the lines checked for one (as a real agent moves on).
    for _ in 0..32 {
        tmux.run(&["send-keys", "-t", &pane, "Enter"]);
    }
    let line = format!("[fleetd: from {fleet}/h1 agent {primary}, msg {waiting}] second task");
    tmux.run(&["send-keys", "-t", &pane, "-l", &line]);
    tmux.run(&["send-keys", "-t", &pane, "Enter"]);
    let (child, log) = start();
    cleanup.children[0] = child;
    wait_for(
        &log,
        &mut seen,
        &["message found already typed"],
        Duration::from_secs(20),
    );
    host.wait_delivery(&waiting, "delivered");
    let typed = tmux
        .shown()
        .lines()
        .filter(|l| l.contains("got:[") && l.contains("second task"))
        .count();
    assert_eq!(typed, 1, "typed again after the restart: {}", tmux.shown());
}
